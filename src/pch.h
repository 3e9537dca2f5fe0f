// Precompiled for every target: LibTorch's headers dominate build time. Sources still include
// what they use, so that they build without it.
#pragma once

#include <torch/torch.h>
