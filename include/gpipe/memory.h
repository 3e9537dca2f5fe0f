// Memory accounting: exact current and peak bytes of CPU tensor memory, through a tracking
// allocator installed in front of c10's CPU allocator; for CUDA devices, the statistics of
// c10's CUDA caching allocator behind the same device-generic calls.
//
// install_tracking_cpu_allocator() wraps the CPU allocator that c10 uses at that moment
// (c10::GetCPUAllocator()) and installs the wrapper with c10::SetCPUAllocator. From then on every
// CPU tensor allocation is counted by its requested size in bytes until it is freed; memory that
// was allocated before the installation is never counted, not even when it is freed. Memory that
// libraries allocate on their own (BLAS or oneDNN scratch space, the C++ heap) is not counted.
//
// CUDA: current_bytes(device) and peak_bytes(device) read the caching allocator's allocated
// bytes of that device (torch.cuda.memory_allocated / max_memory_allocated): every tensor on the
// device, from any thread. They count whole device-wide; tags are CPU-only.
//
// Thread safety: every function may be called from any thread. The counters are atomics, so
// allocations on many threads at once are counted exactly; a reading taken while other threads
// allocate is a consistent value at some instant.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace gpipe {
namespace memory {

/// Installs the tracking CPU allocator. Idempotent: later calls do nothing.
/// Throws c10::Error if c10 keeps another CPU allocator in its place (one registered with a
/// higher priority) or if the current one cannot free a raw pointer (no raw_deleter()).
void install_tracking_cpu_allocator();

/// True once install_tracking_cpu_allocator() has succeeded.
bool tracking_cpu_allocator_installed();

/// Bytes of CPU tensor memory allocated through the tracking allocator and not yet freed.
/// 0 before installation.
int64_t cpu_current_bytes();

/// The highest cpu_current_bytes() since installation or the last reset_cpu_peak().
int64_t cpu_peak_bytes();

/// Sets the peak to the current bytes, to measure the peak of what follows; also every tag's and
/// every worker tag's.
void reset_cpu_peak();

/// Tags attribute memory to a part of a program, e.g. a pipeline stage: a CPU allocation made
/// on a thread inside a ScopedTag(t) counts toward tag t until it is freed, on whichever thread.
/// Tags are 0 <= t < kMaxTags; untagged allocations count only toward the totals above.
constexpr int64_t kMaxTags = 64;

/// Tags this thread's allocations with `tag` until destroyed, then restores the previous tag.
/// Throws c10::IndexError unless 0 <= tag < kMaxTags.
class ScopedTag {
 public:
  explicit ScopedTag(int64_t tag);
  ~ScopedTag();
  ScopedTag(const ScopedTag&) = delete;
  ScopedTag& operator=(const ScopedTag&) = delete;

 private:
  int64_t previous_;
};

/// Bytes allocated under `tag` and not yet freed; the highest of that since installation or the
/// last reset_cpu_peak(). Throw c10::IndexError unless 0 <= tag < kMaxTags.
int64_t cpu_current_bytes(int64_t tag);
int64_t cpu_peak_bytes(int64_t tag);

/// Worker tags, beside the tags above: a CPU allocation made on a thread inside a
/// ScopedWorkerTag(w) counts toward worker tag w too, whatever tag is in force, until it is
/// freed. PipelineSchedule gives each worker thread its worker's (and each action its stage's
/// tag): where one worker runs several stages, their peaks come at different moments, and the
/// worker's is measured whole. Worker tags are 0 <= w < kMaxTags.
class ScopedWorkerTag {
 public:
  explicit ScopedWorkerTag(int64_t worker);
  ~ScopedWorkerTag();
  ScopedWorkerTag(const ScopedWorkerTag&) = delete;
  ScopedWorkerTag& operator=(const ScopedWorkerTag&) = delete;

 private:
  int64_t previous_;
};

/// As cpu_current_bytes(tag) and cpu_peak_bytes(tag), for worker tag `worker`.
int64_t cpu_worker_current_bytes(int64_t worker);
int64_t cpu_worker_peak_bytes(int64_t worker);

/// Bytes of tensor memory allocated on `device` and not yet freed: cpu_current_bytes() for the
/// CPU, the caching allocator's allocated bytes for a CUDA device ("cuda" is the current one).
/// Throws c10::ValueError for another device type, c10::Error for CUDA in a build without CUDA
/// or where the device does not exist.
int64_t current_bytes(c10::Device device);

/// The highest current_bytes(device) since the last reset_peak(device) (for CPU: since
/// installation or reset_cpu_peak()). Throws as current_bytes() does.
int64_t peak_bytes(c10::Device device);

/// Sets the peak of `device` to its current bytes (for CPU: reset_cpu_peak()).
void reset_peak(c10::Device device);

}  // namespace memory
}  // namespace gpipe
