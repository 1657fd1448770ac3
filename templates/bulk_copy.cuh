// exactjit bulk copies into shared memory (cp.async.bulk, the Tensor Memory Accelerator; sm_90
// and sm_100) and the mbarriers that announce their arrival. A stage's barrier is armed by one
// arrival that states the bytes its copies will deliver; waiters spin on the barrier's phase
// parity (use number & 1).
#ifndef EXACTJIT_BULK_COPY_CUH
#define EXACTJIT_BULK_COPY_CUH

namespace xj {

#if defined(__CUDA_ARCH__)
XJ_DEVICE u32 shared_address(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// `arrivals` arrivals complete a phase (plus the announced bytes, where armed with expect_bytes).
XJ_DEVICE void init_barrier(u32 barrier, u32 arrivals = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(barrier), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the bulk-copy unit (once, after the inits).
XJ_DEVICE void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival that also announces the bytes the stage's copies will deliver.
XJ_DEVICE void expect_bytes(u32 barrier, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes) : "memory");
}

// One plain arrival (release: what this thread wrote before is seen by the phase's waiters).
XJ_DEVICE void arrive(u32 barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(barrier) : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory.
XJ_DEVICE void bulk_copy(u32 destination, const void* source, u32 bytes, u32 barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(destination), "l"(source), "r"(bytes), "r"(barrier) : "memory");
}

XJ_DEVICE void wait_barrier(u32 barrier, u32 parity) {
  u32 done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
}
#endif

}  // namespace xj

#endif  // EXACTJIT_BULK_COPY_CUH
