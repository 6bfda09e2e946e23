#include "dlprobe/core/status.h"
#include "dlprobe/engine/tensor.h"
