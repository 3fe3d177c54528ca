// The fused attention kernels of attention_kernels.cu compiled by the host compiler for the emulator.
#include "trainer/cuda/attention_kernels.cu"
