// Switching between execution contexts on one OS thread, for the emulator's CUDA threads.
// On x86-64 a switch saves the callee-saved registers and the FP control words and swaps
// stack pointers (no system call: glibc's swapcontext makes two, which were 40% of an
// emulated model test); elsewhere it is ucontext. ASan and TSan are told about every switch
// (their fiber APIs), so sanitizer builds run the emulator too.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace geoloco::cuda::emu {

class FiberContext {
 public:
  // The calling thread's own context (the scheduler's); filled by the first switch away.
  FiberContext();
  ~FiberContext();
  FiberContext(const FiberContext&) = delete;
  FiberContext& operator=(const FiberContext&) = delete;

  // Prepares a context that runs entry() on the stack [bottom, bottom + size) when first
  // switched to. entry must call started(), and must end with exit_to(), never return.
  void init(void* bottom, size_t size, void (*entry)());

  // Suspends the caller into `from` and resumes `to`; returns when something switches back.
  static void switch_to(FiberContext& from, FiberContext& to);
  // The first thing a fiber's entry does: `from` is the context that switched to it.
  static void started(FiberContext& from);
  // The last thing a fiber does: leaves for `to`, never to be resumed.
  [[noreturn]] static void exit_to(FiberContext& self, FiberContext& to);

 private:
#if defined(__x86_64__)
  void* sp_ = nullptr;
#else
  ucontext_t uc_;
#endif
  const void* stack_bottom_ = nullptr;  // for ASan: the stack this context runs on
  size_t stack_size_ = 0;
  void* fake_stack_ = nullptr;  // ASan's per-context save slot
  void* tsan_fiber_ = nullptr;
  bool owns_tsan_fiber_ = false;
};

}  // namespace geoloco::cuda::emu
