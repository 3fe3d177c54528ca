// The quantization kernels of quantize_kernel.cu compiled by the host compiler for the emulator.
#include "trainer/cuda/quantize_kernel.cu"
