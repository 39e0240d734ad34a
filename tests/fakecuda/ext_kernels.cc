// The extension layer's kernels (collectives/ext/device/kernels.cu) compiled
// as host code for the double: every kernel runs on the stream's own thread
// and reaches device memory only through the double's aliases.
#include "tests/fakecuda/fakecuda.h"
#define ZPX_HOST_KERNELS 1
#include "collectives/ext/device/kernels.cu"
