// gpipe: GPipe pipeline parallelism for LibTorch. Include this for the whole public API.
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/microbatch.h"
#include "gpipe/pipe.h"
#include "gpipe/pipeline.h"
