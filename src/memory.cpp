#include "gpipe/memory.h"

#include "detail/compat.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#if GPIPE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <atomic>
#include <cstring>
#include <mutex>

namespace gpipe {
namespace memory {
namespace {

// Each allocation carries its requested size and its tags in a header in front of the data, so
// that the deleter needs only the data pointer (and raw_allocate/raw_deallocate keep working).
// The header is as large as c10's strictest CPU alignment, so the data stays as aligned as the
// base.
constexpr size_t kHeader = 64;
struct Header {
  int64_t bytes;
  int64_t tag;     // -1: none
  int64_t worker;  // -1: none
};
static_assert(sizeof(Header) <= kHeader, "the header must fit in front of the data");

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};
c10::Allocator* g_inner = nullptr;            // set once, before the wrapper is installed
c10::DeleterFnPtr g_inner_deleter = nullptr;  // g_inner->raw_deleter()

// Per tag and per worker tag, like the totals.
struct Counters {
  std::atomic<int64_t> current[kMaxTags];
  std::atomic<int64_t> peak[kMaxTags];
};
Counters g_tags, g_workers;
thread_local int64_t t_tag = -1;
thread_local int64_t t_worker = -1;

void add(std::atomic<int64_t>& current, std::atomic<int64_t>& peak_of, int64_t bytes) {
  const int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_of.load(std::memory_order_relaxed);
  while (now > peak && !peak_of.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void add(int64_t bytes, int64_t tag, int64_t worker) {
  add(g_current, g_peak, bytes);
  if (tag >= 0) add(g_tags.current[tag], g_tags.peak[tag], bytes);
  if (worker >= 0) add(g_workers.current[worker], g_workers.peak[worker], bytes);
}

// Freed: no peak to raise.
void release(const Header& header) {
  g_current.fetch_sub(header.bytes, std::memory_order_relaxed);
  if (header.tag >= 0)
    g_tags.current[header.tag].fetch_sub(header.bytes, std::memory_order_relaxed);
  if (header.worker >= 0) {
    g_workers.current[header.worker].fetch_sub(header.bytes, std::memory_order_relaxed);
  }
}

void reset_peaks(Counters& counters) {
  for (int64_t tag = 0; tag < kMaxTags; ++tag) {
    counters.peak[tag].store(counters.current[tag].load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
    add(counters.current[tag], counters.peak[tag], 0);
  }
}

void check_tag(int64_t tag) {
  TORCH_CHECK_INDEX(tag >= 0 && tag < kMaxTags, "memory tag ", tag, " is out of range [0, ",
                    kMaxTags, ")");
}

void tracked_delete(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  Header header{};
  std::memcpy(&header, base, sizeof(header));
  release(header);
  g_inner_deleter(base);
}

class TrackingCPUAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) GPIPE_ALLOCATE_CONST override {
    const c10::Device cpu(c10::kCPU);
    if (nbytes == 0) return {nullptr, nullptr, &tracked_delete, cpu};
    c10::DataPtr inner = g_inner->allocate(nbytes + kHeader);
    TORCH_INTERNAL_ASSERT(inner.get() == inner.get_context(),
                          "the wrapped CPU allocator returned a context that is not its data");
    char* base = static_cast<char*>(inner.release_context());
    const Header header{static_cast<int64_t>(nbytes), t_tag, t_worker};
    std::memcpy(base, &header, sizeof(header));
    add(header.bytes, header.tag, header.worker);
    return {base + kHeader, base + kHeader, &tracked_delete, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &tracked_delete; }

  // Pure virtual in LibTorch 2.x (no `override`: LibTorch 1.13 does not declare it).
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
};

TrackingCPUAllocator g_tracking;
std::mutex g_install_mutex;

}  // namespace

void install_tracking_cpu_allocator() {
  if (g_installed.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_installed.load(std::memory_order_relaxed)) return;

  c10::Allocator* inner = c10::GetCPUAllocator();
  TORCH_CHECK(inner->raw_deleter() != nullptr,
              "cannot track the CPU allocator in use: it has no raw_deleter()");
  g_inner = inner;
  g_inner_deleter = inner->raw_deleter();
  // Priority: above the default allocator's, so that ours wins over it.
  c10::SetCPUAllocator(&g_tracking, /*priority=*/1);
  TORCH_CHECK(c10::GetCPUAllocator() == &g_tracking,
              "c10 kept another CPU allocator registered with a higher priority; memory cannot "
              "be tracked");
  g_installed.store(true, std::memory_order_release);
}

bool tracking_cpu_allocator_installed() { return g_installed.load(std::memory_order_acquire); }

int64_t cpu_current_bytes() { return g_current.load(std::memory_order_relaxed); }

int64_t cpu_peak_bytes() { return g_peak.load(std::memory_order_relaxed); }

void reset_cpu_peak() {
  // add(0) after each store: an allocation that raced with the store raises the peak again.
  g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed);
  add(g_current, g_peak, 0);
  reset_peaks(g_tags);
  reset_peaks(g_workers);
}

ScopedTag::ScopedTag(int64_t tag) : previous_(t_tag) {
  check_tag(tag);
  t_tag = tag;
}

ScopedTag::~ScopedTag() { t_tag = previous_; }

int64_t cpu_current_bytes(int64_t tag) {
  check_tag(tag);
  return g_tags.current[tag].load(std::memory_order_relaxed);
}

int64_t cpu_peak_bytes(int64_t tag) {
  check_tag(tag);
  return g_tags.peak[tag].load(std::memory_order_relaxed);
}

ScopedWorkerTag::ScopedWorkerTag(int64_t worker) : previous_(t_worker) {
  check_tag(worker);
  t_worker = worker;
}

ScopedWorkerTag::~ScopedWorkerTag() { t_worker = previous_; }

int64_t cpu_worker_current_bytes(int64_t worker) {
  check_tag(worker);
  return g_workers.current[worker].load(std::memory_order_relaxed);
}

int64_t cpu_worker_peak_bytes(int64_t worker) {
  check_tag(worker);
  return g_workers.peak[worker].load(std::memory_order_relaxed);
}

namespace {

void check_device_type(c10::Device device) {
  TORCH_CHECK_VALUE(device.is_cpu() || device.is_cuda(),
                    "memory statistics exist for CPU and CUDA devices, not for ", device);
  TORCH_CHECK(device.is_cpu() || GPIPE_WITH_CUDA, "no memory statistics for ", device,
              ": this gpipe was built with a LibTorch without CUDA");
}

#if GPIPE_WITH_CUDA
c10::DeviceIndex cuda_index(c10::Device device) {
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  const c10::DeviceIndex count = c10::cuda::device_count();
  TORCH_CHECK(index >= 0 && index < count, "no memory statistics for ", device, ": ",
              static_cast<int>(count), " CUDA device(s) present");
  return index;
}

#endif

struct Reading {
  int64_t current;
  int64_t peak;
};

// The bytes of `device` now and at their peak: for CUDA, the caching allocator's bytes in
// tensors, summed over its pools.
Reading read(c10::Device device) {
  check_device_type(device);
  if (device.is_cpu()) return {cpu_current_bytes(), cpu_peak_bytes()};
#if GPIPE_WITH_CUDA
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(device));
  const auto& allocated =
      stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return {allocated.current, allocated.peak};
#else
  TORCH_INTERNAL_ASSERT(false, "check_device_type let ", device, " through without CUDA");
#endif
}

}  // namespace

int64_t current_bytes(c10::Device device) { return read(device).current; }

int64_t peak_bytes(c10::Device device) { return read(device).peak; }

void reset_peak(c10::Device device) {
  check_device_type(device);
  if (device.is_cpu()) {
    reset_cpu_peak();
    return;
  }
#if GPIPE_WITH_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device));
#endif
}

}  // namespace memory
}  // namespace gpipe
