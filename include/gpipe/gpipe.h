// gpipe: GPipe pipeline parallelism for LibTorch. Include this for the whole public API.
#pragma once

#include "gpipe/balance/balance.h"
#include "gpipe/batchnorm.h"
#include "gpipe/checkpoint.h"
#include "gpipe/cpu_malloc.h"
#include "gpipe/memory.h"
#include "gpipe/microbatch.h"
#include "gpipe/pipe.h"
#include "gpipe/pipeline.h"
#include "gpipe/skip/skippable.h"
