// One step under LibTorch's profiler (Kineto), written as a Chrome trace: every thread's
// operators and gpipe's task spans ("gpipe::forward(stage=S, microbatch=I)"), and on CUDA the
// kernels, copies, runtime calls and synchronizations. trace_summary.py reads it;
// torchgpipe_side.py writes the same for torchgpipe with torch.profiler.
#pragma once

#include "common/bench_util.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <functional>
#include <set>
#include <string>

namespace gpipe {
namespace bench {

inline void profile_step(const std::function<void()>& step, const c10::Device& device,
                         const std::string& path) {
  namespace profiler = torch::profiler::impl;
  profiler::ExperimentalConfig experimental(
      /*profiler_metrics=*/{}, /*profiler_measure_per_kernel=*/false, /*verbose=*/false,
      /*performance_events=*/{}, /*enable_cuda_sync_events=*/true,
      /*adjust_profiler_step=*/false, /*disable_external_correlation=*/false,
      /*profile_all_threads=*/true);  // gpipe's workers run the tasks on threads of their own
  const profiler::ProfilerConfig config(profiler::ProfilerState::KINETO, false, false, false,
                                        false, false, experimental);
  std::set<profiler::ActivityType> activities{profiler::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(profiler::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  {
    RECORD_USER_SCOPE("gpu_pipeline::step");
    step();
    synchronize(device);
  }
  torch::autograd::profiler::disableProfiler()->save(path);
}

}  // namespace bench
}  // namespace gpipe
