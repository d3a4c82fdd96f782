// How a replica names itself to its clients (`specula serve --replica-id`): the HTTP response header
// and the gRPC initial metadata key that carry its id, which the load generator reads back; the same
// pair for the served model's version (--model-version) and for the path that answered a generation
// (model, or faq under --degrade faq).
#pragma once

namespace specula {

inline constexpr char kReplicaHeader[] = "X-Specula-Replica";
inline constexpr char kReplicaMetadata[] = "x-specula-replica";  // gRPC's keys are lower case
inline constexpr char kModelVersionHeader[] = "X-Specula-Model-Version";
inline constexpr char kModelVersionMetadata[] = "x-specula-model-version";
inline constexpr char kAnsweredByHeader[] = "X-Specula-Answered-By";
inline constexpr char kAnsweredByMetadata[] = "x-specula-answered-by";

}  // namespace specula
