// How a replica names itself to its clients (`specula serve --replica-id`): the HTTP response header
// and the gRPC initial metadata key that carry its id, which the load generator reads back.
#pragma once

namespace specula {

inline constexpr char kReplicaHeader[] = "X-Specula-Replica";
inline constexpr char kReplicaMetadata[] = "x-specula-replica";  // gRPC's keys are lower case

}  // namespace specula
