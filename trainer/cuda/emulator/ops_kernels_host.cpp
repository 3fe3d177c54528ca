// The kernels of ops_kernels.cu compiled by the host compiler for the emulator.
#include "trainer/cuda/ops_kernels.cu"
