/*
** What each runtime op computes on one float32 value, as C expressions: the
** one statement of the rule, which the runtime's block loops (runtime.c)
** are made of and which tier-2 kernels (codegen.c) are written with, taken
** as text through #. An expression reads x (and y), values of type float;
** it names math functions only through the prototypes that tier-2 code
** declares itself (tn_codegen_tier2_prelude) and runtime.c gets from
** <math.h>. NaN, infinity and signed zero follow eager PyTorch.
*/
#ifndef TN_RUNTIME_OPS_H
#define TN_RUNTIME_OPS_H

/* _(op, float32 expression of x) for TN_RT_<op> (runtime.h) */
#define TN_RT_F32_UNARY_EXPR(_) \
  _(NEG, -x) \
  _(ABS, fabsf(x)) \
  _(EXP, expf(x)) \
  _(LOG, logf(x)) \
  _(LOG1P, log1pf(x)) \
  _(EXPM1, expm1f(x)) \
  _(SQRT, sqrtf(x)) \
  _(RSQRT, 1.0f / sqrtf(x)) \
  _(RECIPROCAL, 1.0f / x) \
  _(FLOOR, floorf(x)) \
  _(CEIL, ceilf(x)) \
  _(TRUNC, truncf(x)) \
  /* half to even, as eager */ \
  _(ROUND, rintf(x)) \
  /* NaN and -0 give +0, as eager */ \
  _(SIGN, (float)((x > 0.0f) - (x < 0.0f))) \
  /* relu propagates NaN and keeps -0, as eager's clamp_min(x, 0) does */ \
  _(RELU, x < 0.0f ? 0.0f : x) \
  _(SIGMOID, 1.0f / (1.0f + expf(-x))) \
  _(TANH, tanhf(x)) \
  _(SILU, x * (1.0f / (1.0f + expf(-x)))) \
  _(ERF, erff(x)) \
  _(SIN, sinf(x)) \
  _(COS, cosf(x)) \
  /* gelu(+inf) = +inf and gelu(-inf) = NaN (0 * -inf), as the formula \
  ** gives. Eager's answer for +inf depends on its kernel: its own (ATen) \
  ** kernels and oneDNN's AVX2 one give +inf, oneDNN's AVX-512 one NaN. */ \
  _(GELU, 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f))) \
  _(GELU_TANH, 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)))) \
  _(ZERO_INF, __builtin_isinf(x) ? 0.0f : x)

/* _(op, expression of x and y, both of one floating type) for TN_RT_B_<op>
** on float32 and float64 values; TN_RT_POW(x, y) is the math library's pow
** of that type. maximum, minimum and clamp propagate NaN as eager does: a
** NaN in x stays, a NaN bound gives NaN. */
#define TN_RT_FLOAT_BINARY_EXPR(_) \
  _(ADD, x + y) \
  _(SUB, x - y) \
  _(MUL, x * y) \
  _(DIV, x / y) \
  _(MAXIMUM, x != x ? x : (y != y ? y : (x > y ? x : y))) \
  _(MINIMUM, x != x ? x : (y != y ? y : (x < y ? x : y))) \
  _(POW, TN_RT_POW(x, y)) \
  _(CLAMP_MIN, (x < y || y != y) ? y : x) \
  _(CLAMP_MAX, (x > y || y != y) ? y : x)

/* _(op, C operator) for TN_RT_C_<op>: 1 where x op y holds (NaN compares
** unequal). */
#define TN_RT_COMPARE_OPS(_) _(EQ, ==) _(NE, !=) _(LT, <) _(LE, <=) _(GT, >) _(GE, >=)

/* float16 and bfloat16 elements to and from float32 (rounded to nearest
** even; a NaN gives a quiet NaN of its sign), and a float32 value rounded
** to their precision: C definitions the runtime (runtime.c) expands and
** tier-2 code (codegen.c's prelude) takes as text through TN_RT_TEXT.
** Branch-free (masks, not conditional expressions: GCC left those as
** branches without AVX-512), so loops of them vectorise on any ISA; the
** runtime's float16 blocks take F16C where the CPU has it (6x as fast).
** float16 subnormals are exact in float32 (|h| * 2^-24); float32 values
** below float16's normal range are rounded to a multiple of 2^-24 by
** adding 2^23 to |f| * 2^24 (the float32 sum's ulp is 1). */
#define TN_RT_HALF_CONVERSIONS \
  static inline float tn_rt_f16_value(unsigned int h) \
  { \
    unsigned int em = h & 0x7fffu, su, r; \
    unsigned int normal = 0u - (em >= 0x0400u), special = 0u - (em >= 0x7c00u); /* masks, not branches */ \
    float sub = (float)(int)em * 0x1p-24f, f; \
    __builtin_memcpy(&su, &sub, 4); \
    r = (normal & ((em << 13) + 0x38000000u + (special & 0x38000000u))) | (~normal & su); \
    r |= (h & 0x8000u) << 16; \
    __builtin_memcpy(&f, &r, 4); \
    return f; \
  } \
  static inline unsigned int tn_rt_f16_bits(float f) \
  { \
    unsigned int u, a, su, h, normal, inf, nan; \
    float sub = __builtin_fabsf(f) * 0x1p24f + 0x1p23f; \
    __builtin_memcpy(&u, &f, 4); \
    __builtin_memcpy(&su, &sub, 4); \
    a = u & 0x7fffffffu; \
    normal = 0u - (a >= 0x38800000u), inf = 0u - (a >= 0x477ff000u), nan = 0u - (a > 0x7f800000u); \
    h = (normal & ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13)) | (~normal & (su - 0x4b000000u)); \
    h = (inf & 0x7c00u) | (~inf & h); \
    h = (nan & 0x7e00u) | (~nan & h); \
    return h | ((u >> 16) & 0x8000u); \
  } \
  static inline float tn_rt_bf16_value(unsigned int h) \
  { \
    unsigned int u = h << 16; \
    float f; \
    __builtin_memcpy(&f, &u, 4); \
    return f; \
  } \
  static inline unsigned int tn_rt_bf16_bits(float f) \
  { \
    unsigned int u, nan; \
    __builtin_memcpy(&u, &f, 4); \
    nan = 0u - ((u & 0x7fffffffu) > 0x7f800000u); \
    return (nan & ((u >> 16) | 0x40u)) | (~nan & ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)); \
  } \
  static inline float tn_rt_from_f16(unsigned short h) { return tn_rt_f16_value(h); } \
  static inline unsigned short tn_rt_to_f16(float f) { return (unsigned short)tn_rt_f16_bits(f); } \
  static inline float tn_rt_from_bf16(unsigned short h) { return tn_rt_bf16_value(h); } \
  static inline unsigned short tn_rt_to_bf16(float f) { return (unsigned short)tn_rt_bf16_bits(f); } \
  /* rounded in 32-bit lanes (no narrowing to 16 bits between: 7x the work vectorised) */ \
  static inline float tn_rt_round_f16(float f) { return tn_rt_f16_value(tn_rt_f16_bits(f)); } \
  static inline float tn_rt_round_bf16(float f) { return tn_rt_bf16_value(tn_rt_bf16_bits(f)); }

/* Text of the definitions in macro m (its expansion, as a string). */
#define TN_RT_TEXT_(...) #__VA_ARGS__
#define TN_RT_TEXT(m) TN_RT_TEXT_(m)

#endif /* TN_RUNTIME_OPS_H */
