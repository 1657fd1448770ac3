// exactjit shared numerics: storage types, round-to-nearest-even conversions and IEEE arithmetic
// with every rounding written out.
//
// This file is compiled twice: by NVRTC into every kernel (device) and by the host compiler into
// the library and the tests (host), where it is the reference model that golden vectors recorded
// from PyTorch pin down. It includes no header. The device conversions use the same PTX `cvt`
// instructions PyTorch's c10::BFloat16 / c10::Half use on sm_80+; the host versions are bit
// manipulations that the golden tests prove equal to them, NaN, Inf, denormals and ties included.
#ifndef EXACTJIT_NUMERICS_CUH
#define EXACTJIT_NUMERICS_CUH

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define XJ_HD __host__ __device__ __forceinline__
#define XJ_DEVICE __device__ __forceinline__
#else
#define XJ_HD inline
#endif

namespace xj {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Storage types: bit containers, so arithmetic can only happen after an explicit conversion.
struct bf16 { u16 bits; };
struct fp16 { u16 bits; };

XJ_HD u32 float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  u32 u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}

XJ_HD float bits_to_float(u32 u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// ---- float -> bf16, round to nearest even; NaN becomes the canonical 0x7FFF ------------------
XJ_HD u16 bf16_bits_from_float_model(float f) {
  u32 u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  u += 0x7FFFu + ((u >> 16) & 1u);  // ties go to the even mantissa
  return (u16)(u >> 16);
}

// ---- float -> fp16, round to nearest even, overflow to Inf, gradual underflow ----------------
XJ_HD u16 fp16_bits_from_float_model(float f) {
  u32 u = float_to_bits(f);
  u32 sign = (u >> 16) & 0x8000u;
  u32 a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7FFF;
  if (a >= 0x477FF000u) return (u16)(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (a >= 0x38800000u) {                               // normal half: >= 2^-14
    u32 rounded = a + 0xFFFu + ((a >> 13) & 1u);
    return (u16)(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (a <= 0x33000000u) return (u16)sign;  // <= 2^-25 (a tie at 2^-25 goes to even zero)
  u32 shift = 126u - (a >> 23);            // 14..24: units of 2^-24
  u32 mant = (a & 0x7FFFFFu) | 0x800000u;
  u32 q = mant >> shift;
  u32 rem = mant & ((1u << shift) - 1u);
  u32 half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q += 1u;
  return (u16)(sign | q);
}

// ---- fp16 -> float, exact; NaN becomes the canonical 0x7FFFFFFF (as cvt.f32.f16 does) --------
XJ_HD float float_from_fp16_bits_model(u16 h) {
  u32 sign = (u32)(h & 0x8000u) << 16;
  u32 e = (h >> 10) & 0x1Fu;
  u32 m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_to_float(m ? 0x7FFFFFFFu : (sign | 0x7F800000u));  // NaN: canonical
  if (e == 0) {
    if (m == 0) return bits_to_float(sign);
    u32 exp = 113u;  // normalise the subnormal: value = m * 2^-24
    while ((m & 0x400u) == 0) { m <<= 1; exp -= 1u; }
    return bits_to_float(sign | (exp << 23) | ((m & 0x3FFu) << 13));
  }
  return bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
}

// ---- conversions used by kernels: the hardware instruction on the device, the model on the host
XJ_HD float to_float(float v) { return v; }
XJ_HD float to_float(bf16 v) { return bits_to_float((u32)v.bits << 16); }
XJ_HD float to_float(fp16 v) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
#else
  return float_from_fp16_bits_model(v.bits);
#endif
}

template <typename T> struct Round;
template <> struct Round<float> {
  static XJ_HD float from(float v) { return v; }
};
template <> struct Round<bf16> {
  static XJ_HD bf16 from(float v) {
    bf16 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
#else
    r.bits = bf16_bits_from_float_model(v);
#endif
    return r;
  }
};
template <> struct Round<fp16> {
  static XJ_HD fp16 from(float v) {
    fp16 r;
#if defined(__CUDA_ARCH__)
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
#else
    r.bits = fp16_bits_from_float_model(v);
#endif
    return r;
  }
};

// rT(v): round an fp32 value to the storage type T (identity for float).
template <typename T> XJ_HD T round_to(float v) { return Round<T>::from(v); }

// rT of two values as one word of two bf16, lo in the low half: round_to<bf16> of each, in one
// cvt.rn.bf16x2 on sm_80 and newer.
XJ_HD u32 round_pair_to_bf16(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<u32>(Round<bf16>::from(lo).bits) | static_cast<u32>(Round<bf16>::from(hi).bits) << 16;
#endif
}

// The GPU returns the canonical NaN 0x7FFFFFFF from every arithmetic instruction; x86 keeps an
// input's payload (or makes 0xFFC00000). The host model follows the GPU.
XJ_HD float canonical_nan_model(float v) { return v != v ? bits_to_float(0x7FFFFFFFu) : v; }

// Single IEEE operations, round to nearest even, never contracted into an FMA.
XJ_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return canonical_nan_model(a * b);  // host builds use -ffp-contract=off
#endif
}

XJ_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return canonical_nan_model(a + b);
#endif
}

XJ_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return canonical_nan_model(a - b);
#endif
}

XJ_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return canonical_nan_model(a / b);
#endif
}

// fma(a, b, c) with one rounding; written out where a kernel asks for it, never inferred.
XJ_HD float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return canonical_nan_model(__builtin_fmaf(a, b, c));
#endif
}

// fp64 operations (rms_norm's backward recomputes rstd in fp64), one rounding each; to_float
// rounds to nearest even. The host's double arithmetic is IEEE binary64 with the same roundings.
XJ_HD double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

XJ_HD double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

XJ_HD double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

XJ_HD double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}

XJ_HD float to_float(double v) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(v);
#else
  return canonical_nan_model(static_cast<float>(v));
#endif
}

XJ_HD bool is_finite(float v) { return (float_to_bits(v) & 0x7F800000u) != 0x7F800000u; }

// The rounding error of p = mul(a, b), exactly: a * b = p + product_error(a, b, p) (barring
// underflow); 0 when p is inf or NaN, so a non-finite product propagates as itself.
XJ_HD float product_error(float a, float b, float p) { return is_finite(p) ? fma(a, b, -p) : 0.0f; }

}  // namespace xj

#endif  // EXACTJIT_NUMERICS_CUH
