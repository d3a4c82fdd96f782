// Step-cost files for the simulator, in the step-cost cache's format ("specula.step_cost.v1",
// docs/architecture.md "The step-cost cache"):
//
//   {"format": "specula.step_cost.v1", "identity": {...}, "tables": {...},      the cache's part
//    "shape": {"dim": ..., ...},                                                 the model's shape
//    "steps": [{"seqs", "tokens", "rows", "positions", "seconds", "kind"[, "phase"]}], whole engine steps
//    "scheduler": {"max_num_seqs", "max_num_batched_tokens", "block_size", "num_blocks", "max_model_len"},
//    "request_overhead_s": ...,                                                  outside the steps
//    "arrival_s": ..., "arrival_token_ids_s": ...,                               an arrival's, in a step
//    "draft": {"identity", "shape", "steps"}}                                    a draft model's, if any
//
// `specula experiment calibrate` writes "steps" (measured whole steps, host work included); a
// cache file has only "tables" (forwards of 1, 2, 4, ... tokens over up to `batch` sequences at a
// short context), which are read as steps of that shape. Either fits a StepTimeModel: steps by the
// medians of each shape, with every step's time over the fit as the model's jitter.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/forward_work.h"
#include "scheduler/scheduler.h"
#include "sim/step_time.h"

namespace specula {

struct ModelCost {
  ForwardShape shape;
  StepTimeModel model;
  int32_t num_samples = 0;
  // The cache's forward table (the largest batch's), when the file has one beside its steps: the
  // adaptive controller's startup table, as the engine reads it from its cost cache.
  std::optional<std::vector<CostPoint>> forwards;
};

struct StepCostFile {
  ModelCost target;
  std::optional<ModelCost> draft;
  std::optional<SchedulerConfig> scheduler;  // the calibration engine's (num_blocks sized for its machine)
  double request_overhead_s = 0;              // a request's time outside the steps (ReplicaConfig's)
  // What an arrival adds to the step it lands in, with a text prompt and with token ids (ReplicaConfig's).
  double arrival_s = 0, arrival_token_ids_s = 0;
  std::string description;                   // path, identity's model and cpu
};

// Errors name the file and the field: unreadable, not JSON, another format, no steps or tables, no
// shape (a cache file: pass `shape_if_missing`).
absl::StatusOr<StepCostFile> LoadStepCostFile(const std::string& path,
                                              std::optional<ForwardShape> shape_if_missing = std::nullopt);

// A ForwardShape as JSON fields and back (the file's "shape").
std::string ShapeJson(const ForwardShape& s);

// Measured GPU steps of the llama-3.2-1b shape in bf16 (docs/gpu.md). H200: whole served engine
// steps (decodes, verifications, a prompt's prefill) from calibrations on the device, with prefills
// past 1,024 tokens from its roofline scaled to the measured one. H100: decode steps of the GPU
// benchmark (kernels alone, context 512), with longer steps from its roofline scaled to them.
// Errors: no measured table for that device and shape.
absl::StatusOr<StepTimeModel> MeasuredDeviceModel(const std::string& device, const std::string& shape);

}  // namespace specula
