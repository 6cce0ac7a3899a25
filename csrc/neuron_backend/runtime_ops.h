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

#endif /* TN_RUNTIME_OPS_H */
