// gpipe train --simulate: which schedule would train this model fastest, within a memory budget?
//
// Profiles the model on worker threads - a few steps of ZB1P over --stages stages and, where the
// model has the layers, of ZBV over twice as many on as many workers - for each stage's costs
// (predict.h's costs_from_trace) and activation bytes per micro-batch it holds, then predicts a
// step of every schedule the model allows: its time, its bubble, and the activations each worker
// holds at most (each stage's most live micro-batches times its bytes per micro-batch). Prints a
// table and the fastest schedule whose activations fit --memory-budget. Checkpointing is left
// out: every schedule is predicted without it.
#pragma once

#include "train.h"

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace gpipe {
namespace cli {

/// One schedule's predicted step.
struct ScheduleForecast {
  std::string schedule;  // its --schedule name
  int64_t stages = 0;
  double step_seconds = 0;
  double bubble_fraction = 0;
  int64_t peak_worker_bytes = 0;  // the activations of the worker that holds most
  bool fits = false;              // within the memory budget
};

struct SimulateReport {
  std::vector<ScheduleForecast> forecasts;
  std::string fastest;                // the fastest that fits; empty if none does
  std::vector<std::string> left_out;  // schedules the sizes do not allow, and why
};

/// Profiles and predicts as the top of this file says, printing to `out`. Throws UsageError
/// on ranks (the prediction is of threads of one process).
SimulateReport simulate_schedules(const TrainConfig& c, std::ostream& out);

}  // namespace cli
}  // namespace gpipe
