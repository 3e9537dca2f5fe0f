#include "gpipe/cpu_malloc.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <climits>

namespace gpipe {
namespace memory {

bool reuse_freed_cpu_memory() {
#if defined(__GLIBC__)
  bool ok = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;  // glibc's largest on 64 bits
  ok = mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1 && ok;
  ok = mallopt(M_ARENA_MAX, 1) == 1 && ok;
  return ok;
#else
  return false;
#endif
}

}  // namespace memory
}  // namespace gpipe
