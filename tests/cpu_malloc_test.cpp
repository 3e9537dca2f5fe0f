// reuse_freed_cpu_memory(): worker threads that come and go, as a pipeline's do every step, reuse
// the memory freed before them instead of faulting in fresh pages. Each case runs in a fresh
// process (this test binary again, in child mode), so that earlier tests' allocations and
// settings cannot decide the outcome.
#include "test_util.h"

#include "gpipe/cpu_malloc.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace gpipe {
namespace memory {
namespace cpu_malloc_test {
namespace {

constexpr const char* kChildMode = "GPIPE_CPU_MALLOC_CHILD";  // "tuned" or "default"

// The minor page faults of a new thread that allocates 24 MiB in activation-sized blocks,
// touches them and frees them: a pipeline worker's step in small.
long faults_of_one_worker_step() {
  long faults = -1;
  std::thread([&] {
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    constexpr size_t kBlock = 2 << 20;
    std::vector<void*> blocks;
    for (int k = 0; k < 12; ++k) {
      blocks.push_back(std::malloc(kBlock));
      std::memset(blocks.back(), 1, kBlock);
    }
    for (void* block : blocks) std::free(block);
    getrusage(RUSAGE_THREAD, &after);
    faults = after.ru_minflt - before.ru_minflt;
  }).join();
  return faults;
}

// Runs this binary's ChildProcess test with `mode`; returns the faults of its third worker step.
long faults_in_child(const std::string& mode) {
  char self[4096] = {};
  EXPECT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const std::string command = std::string(kChildMode) + "=" + mode + " '" + self +
                              "' --gtest_filter=CpuMallocTest.ChildProcess 2>/dev/null | grep "
                              "'^faults '";
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  long faults = -1;
  if (pipe == nullptr || std::fscanf(pipe, "faults %ld", &faults) != 1) faults = -1;
  if (pipe != nullptr) pclose(pipe);
  return faults;
}

TEST(CpuMallocTest, ChildProcess) {
  const char* mode = std::getenv(kChildMode);
  if (mode == nullptr) GTEST_SKIP() << "runs only as the child of the tests below";
  if (std::string(mode) == "tuned") ASSERT_TRUE(reuse_freed_cpu_memory());
  faults_of_one_worker_step();
  faults_of_one_worker_step();
  std::printf("faults %ld\n", faults_of_one_worker_step());
}

constexpr long kPagesTouched = (24 << 20) / 4096;

// These measure glibc's malloc, which AddressSanitizer replaces with its own on purpose
// (scripts/sanitize.sh).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kGlibcMalloc = false;
#else
constexpr bool kGlibcMalloc = true;
#endif

TEST(CpuMallocTest, LaterWorkersReuseFreedMemory) {
  if (!kGlibcMalloc) GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc";
  const long faults = faults_in_child("tuned");
  ASSERT_GE(faults, 0) << "the child process printed no fault count";
  EXPECT_LT(faults, kPagesTouched / 10);
}

// The premise: with glibc's defaults each new worker faults in most of its pages again.
TEST(CpuMallocTest, WithoutItLaterWorkersFaultTheirPagesIn) {
  if (!kGlibcMalloc) GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc";
  const long faults = faults_in_child("default");
  ASSERT_GE(faults, 0) << "the child process printed no fault count";
  EXPECT_GT(faults, kPagesTouched / 2);
}

}  // namespace
}  // namespace cpu_malloc_test
}  // namespace memory
}  // namespace gpipe
