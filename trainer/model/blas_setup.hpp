// OpenBLAS kernel selection. Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its AVX2
// "Haswell" kernels on AMD Zen 4 although the CPU has AVX-512; its "SkylakeX" kernels run
// the model's GEMMs 1.3-1.5x faster there (measured: 512x384x128 sgemm 40 -> 67 GFLOPS on
// one thread). The choice is made once, when the library loads, from OPENBLAS_CORETYPE,
// so a process can only switch by re-executing itself with that variable set.
#pragma once

#include <string>

namespace geoloco::trainer {

// If OPENBLAS_CORETYPE is unset, the CPU has AVX-512 (F, BW, DQ, VL) and OpenBLAS chose an
// AVX2 core, re-executes the current program (/proc/self/exe, same argv) with
// OPENBLAS_CORETYPE=SkylakeX. Returns normally when nothing is to be done or exec fails
// (then the program simply runs with the AVX2 kernels). Call it first thing in main(),
// before any thread is started. GEOLOCO_BLAS_REEXEC=0 disables it.
void prefer_avx512_blas(char** argv);

// "OpenBLAS <version and build options>, core <kernels in use>" for logs and benchmark JSON.
std::string blas_description();

}  // namespace geoloco::trainer
