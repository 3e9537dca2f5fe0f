// Keeping freed CPU memory for reuse: glibc malloc's defaults make a pipeline fault its
// activations' pages in again on every step.
//
// Three defaults cost a training loop: tensors above the mmap threshold (128 KiB at first) are
// mapped and unmapped on each allocation; the top of the heap is returned to the OS once 128 KiB
// of it are free; and each thread gets its own arena, whose heaps are unmapped as soon as they
// empty, whatever the trim threshold. Pipeline workers free on one step what they allocate on
// the next, so each step touches fresh pages: 40k minor page faults per 1F1B step of
// benchmarks/schedule-throughput (about 6% of it), 10k per step of `gpipe train` (13%).
//
// reuse_freed_cpu_memory() sets the mmap threshold to its maximum (32 MiB), stops trimming and
// gives all threads one arena (mallopt), the same as running the program with
//   GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295:glibc.malloc.arena_max=1
// The process then keeps its peak heap until it ends. Call it at the start of main, before
// other threads allocate (a thread that already has an arena keeps it). gpipe changes no malloc
// setting by itself; the gpipe command and the benchmarks call this.
#pragma once

namespace gpipe {
namespace memory {

/// Makes glibc malloc keep freed memory for later allocations (see above). Returns false where
/// malloc is not glibc's or refused a setting.
bool reuse_freed_cpu_memory();

}  // namespace memory
}  // namespace gpipe
