// What differs between the LibTorch versions gpipe builds with: 2.x (the `torch` wheel's, the main
// build) and Debian's 1.13. Every version test of gpipe is here or uses GPIPE_LIBTORCH_2, but
// for the public gpipe/distributed/rendezvous.h (its Backend), which defines no macro.
//
// The differences gpipe meets:
// - c10::Allocator::allocate is const in 1.13, not in 2.x (and 2.x adds copy_data);
// - c10d process groups are split into a front and per-device backends in 2.x (rendezvous.h).
#pragma once

#include <torch/version.h>

/// 1 with LibTorch 2.x, 0 with 1.13.
#if TORCH_VERSION_MAJOR >= 2
#define GPIPE_LIBTORCH_2 1
#else
#define GPIPE_LIBTORCH_2 0
#endif

/// Qualifies an override of c10::Allocator::allocate.
#if GPIPE_LIBTORCH_2
#define GPIPE_ALLOCATE_CONST
#else
#define GPIPE_ALLOCATE_CONST const
#endif
