#include "trainer/cuda/emulator/fiber_context.hpp"

#include <cstdint>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define GEOLOCO_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define GEOLOCO_EMU_TSAN 1
#endif

#if defined(__x86_64__)
// geoloco_emu_switch(void** save_sp, void* load_sp): pushes rbp, rbx, r12-r15 and the SSE/x87
// control words on the current stack, stores rsp into *save_sp, loads load_sp and pops the
// same from there. A fresh stack is laid out by FiberContext::init to "return" into entry.
extern "C" void geoloco_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl geoloco_emu_switch
  .type geoloco_emu_switch, @function
geoloco_emu_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size geoloco_emu_switch, .-geoloco_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace geoloco::cuda::emu {

FiberContext::FiberContext() {
#if defined(GEOLOCO_EMU_TSAN)
  tsan_fiber_ = __tsan_get_current_fiber();
#endif
}

FiberContext::~FiberContext() {
#if defined(GEOLOCO_EMU_TSAN)
  if (owns_tsan_fiber_) __tsan_destroy_fiber(tsan_fiber_);
#endif
}

void FiberContext::init(void* bottom, size_t size, void (*entry)()) {
  stack_bottom_ = bottom;
  stack_size_ = size;
  fake_stack_ = nullptr;
#if defined(GEOLOCO_EMU_ASAN)
  // A fiber abandoned by a failed launch never returned from its frames: their redzones are
  // still poisoned in the reused stack.
  ASAN_UNPOISON_MEMORY_REGION(bottom, size);
#endif
#if defined(GEOLOCO_EMU_TSAN)
  if (owns_tsan_fiber_) __tsan_destroy_fiber(tsan_fiber_);
  tsan_fiber_ = __tsan_create_fiber(0);
  owns_tsan_fiber_ = true;
#endif
#if defined(__x86_64__)
  // From the (16-byte aligned) top down: a null return address for entry (so entry starts
  // with rsp = 8 mod 16, as after a call), entry as the switch's return address, six zeroed
  // callee-saved registers, and the current control words.
  auto top = (reinterpret_cast<uintptr_t>(bottom) + size) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  *--slot = 0;
  *--slot = reinterpret_cast<uint64_t>(entry);
  for (int i = 0; i < 6; ++i) *--slot = 0;
  uint32_t mxcsr = 0;
  uint16_t fpcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  *--slot = uint64_t(mxcsr) | (uint64_t(fpcw) << 32);
  sp_ = slot;
#else
  getcontext(&uc_);
  uc_.uc_stack.ss_sp = bottom;
  uc_.uc_stack.ss_size = size;
  uc_.uc_link = nullptr;
  makecontext(&uc_, entry, 0);
#endif
}

void FiberContext::switch_to(FiberContext& from, FiberContext& to) {
#if defined(GEOLOCO_EMU_ASAN)
  __sanitizer_start_switch_fiber(&from.fake_stack_, to.stack_bottom_, to.stack_size_);
#endif
#if defined(GEOLOCO_EMU_TSAN)
  __tsan_switch_to_fiber(to.tsan_fiber_, 0);
#endif
#if defined(__x86_64__)
  geoloco_emu_switch(&from.sp_, to.sp_);
#else
  swapcontext(&from.uc_, &to.uc_);
#endif
#if defined(GEOLOCO_EMU_ASAN)
  const void* prev_bottom = nullptr;
  size_t prev_size = 0;
  __sanitizer_finish_switch_fiber(from.fake_stack_, &prev_bottom, &prev_size);
#endif
}

void FiberContext::started(FiberContext& from) {
#if defined(GEOLOCO_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &from.stack_bottom_, &from.stack_size_);
#else
  (void)from;
#endif
}

void FiberContext::exit_to(FiberContext& self, FiberContext& to) {
#if defined(GEOLOCO_EMU_ASAN)
  __sanitizer_start_switch_fiber(nullptr, to.stack_bottom_, to.stack_size_);
#endif
#if defined(GEOLOCO_EMU_TSAN)
  __tsan_switch_to_fiber(to.tsan_fiber_, 0);
#endif
#if defined(__x86_64__)
  geoloco_emu_switch(&self.sp_, to.sp_);
#else
  swapcontext(&self.uc_, &to.uc_);
#endif
  std::abort();  // a finished fiber is never resumed
}

}  // namespace geoloco::cuda::emu
