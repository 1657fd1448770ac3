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

// The quad's elements as floats, to_float of each (bf16: by 32-bit word, the low element shifted
// up and the high one masked, one instruction per element).
template <typename T> XJ_DEVICE void unpack_quad(const Quad<T>& q, float f[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) f[e] = to_float(q.v[e]);
}
XJ_DEVICE void unpack_quad(const Quad<bf16>& q, float f[4]) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    f[2 * k] = bits_to_float(q.w[k] << 16);
    f[2 * k + 1] = bits_to_float(q.w[k] & 0xFFFF0000u);
  }
}

// q = rT of four floats, round_to<T> of each (bf16: two at a time, round_pair_to_bf16).
template <typename T> XJ_DEVICE void round_quad(const float f[4], Quad<T>& q) {
#pragma unroll
  for (int e = 0; e < 4; ++e) q.v[e] = round_to<T>(f[e]);
}
XJ_DEVICE void round_quad(const float f[4], Quad<bf16>& q) {
  q.w[0] = round_pair_to_bf16(f[0], f[1]);
  q.w[1] = round_pair_to_bf16(f[2], f[3]);
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
