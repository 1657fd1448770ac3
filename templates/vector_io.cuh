// exactjit vector I/O: a Pack of N storage elements moved with one 16-byte access where the
// specialisation allows it (wide path), or element by element (scalar path).
//
// Loads are ld.global.nc (inputs are read-only for the kernel's lifetime), stores plain: the
// streaming hints (L1::no_allocate, .cs) measured 1.1% slower on gate_residual (tune_gate_residual).
// Device-only: the host model never moves packs.
#ifndef EXACTJIT_VECTOR_IO_CUH
#define EXACTJIT_VECTOR_IO_CUH

namespace xj {

template <int kDType> struct StorageOf;
template <> struct StorageOf<0> { typedef float type; };
template <> struct StorageOf<1> { typedef bf16 type; };
template <> struct StorageOf<2> { typedef fp16 type; };

template <int kBytes> struct IndexOf;
template <> struct IndexOf<4> { typedef int type; };
template <> struct IndexOf<8> { typedef long long type; };

template <typename T, int N, bool kWide = (N * sizeof(T) == 16)> union Pack;

template <typename T, int N> union Pack<T, N, true> {
  T v[N];
  u32 w[4];
};

template <typename T, int N> union Pack<T, N, false> {
  T v[N];
};

#if defined(__CUDA_ARCH__)
template <typename T, int N> XJ_DEVICE void load_pack(Pack<T, N, true>& p, const T* src) {
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(p.w[0]), "=r"(p.w[1]), "=r"(p.w[2]), "=r"(p.w[3]) : "l"(src));
}

// 16 bytes read once (the det_linear weights): no L1 allocation, issued where written.
XJ_DEVICE uint4 load_streamed(const void* src) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src));
  return v;
}

#if __CUDA_ARCH__ >= 800
// 8 bytes copied to shared memory asynchronously (cp.async, sm_80+), completed by the thread's
// own async_wait; streamed data, so L1 is bypassed where the size allows (.cg is 16 bytes only).
XJ_DEVICE void async_copy_8(void* shared_dst, const void* src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
XJ_DEVICE void async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending> XJ_DEVICE void async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
#endif

template <typename T, int N> XJ_DEVICE void store_pack(T* dst, const Pack<T, N, true>& p) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
               :: "l"(dst), "r"(p.w[0]), "r"(p.w[1]), "r"(p.w[2]), "r"(p.w[3]) : "memory");
}

template <typename T, int N> XJ_DEVICE void load_pack(Pack<T, N, false>& p, const T* src) {
#pragma unroll
  for (int k = 0; k < N; ++k) p.v[k] = src[k];
}

template <typename T, int N> XJ_DEVICE void store_pack(T* dst, const Pack<T, N, false>& p) {
#pragma unroll
  for (int k = 0; k < N; ++k) dst[k] = p.v[k];
}
#endif

}  // namespace xj

#endif  // EXACTJIT_VECTOR_IO_CUH
