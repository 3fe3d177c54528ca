// The AdamW kernel of adamw_kernel.cu compiled by the host compiler for the emulator.
#include "trainer/cuda/adamw_kernel.cu"
