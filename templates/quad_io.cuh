// exactjit quad I/O for the rms_norm kernels: four elements (8 bytes in bf16/fp16, 16 in fp32,
// always aligned because H % 4 == 0 and rows are 4-element aligned) moved as one vector access.
// Plain ld.global.nc / st.global: cache hints and L1 prefetches measured slower
// (bench/tune_rms_norm, docs/perf-notes.md).
#ifndef EXACTJIT_QUAD_IO_CUH
#define EXACTJIT_QUAD_IO_CUH

namespace xj {

template <typename T> union Quad {
  T v[4];
  u32 w[sizeof(T)];
};

#if defined(__CUDA_ARCH__)
template <typename T> XJ_DEVICE void load_quad(Quad<T>& q, const T* src) {
  if constexpr (sizeof(T) == 4) {
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(q.w[0]), "=r"(q.w[1]), "=r"(q.w[2]), "=r"(q.w[3]) : "l"(src));
  } else {
    asm("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(q.w[0]), "=r"(q.w[1]) : "l"(src));
  }
}

template <typename T> XJ_DEVICE void store_quad(T* dst, const Quad<T>& q) {
  if constexpr (sizeof(T) == 4) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(dst), "r"(q.w[0]), "r"(q.w[1]), "r"(q.w[2]),
                 "r"(q.w[3]) : "memory");
  } else {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(dst), "r"(q.w[0]), "r"(q.w[1]) : "memory");
  }
}
#endif

}  // namespace xj

#endif  // EXACTJIT_QUAD_IO_CUH
