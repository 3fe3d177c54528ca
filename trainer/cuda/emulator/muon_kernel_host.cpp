// Muon's kernels of muon_kernel.cu compiled by the host compiler for the emulator.
#include "trainer/cuda/muon_kernel.cu"
