/*
** Runtime primitives of generated kernels (see runtime.h). Compiled with
** the extension's -O2; the loops are simple enough to vectorise where the
** operation allows (math library calls stay scalar: correctness first).
*/
/* The loops here are the whole point of the runtime: vectorise them at
** -O3 whatever the extension's level, in one clone per ISA, chosen at load
** time by the dynamic linker (ifunc). */
#pragma GCC optimize("O3", "no-math-errno")

#include "runtime.h"

#include <math.h>

/* glibc's libmvec holds SIMD versions of these (the accuracy class of
** eager's Sleef, NaN and infinity handled): declaring them as OpenMP SIMD
** functions, as glibc's own headers do under -ffast-math, lets the
** vectoriser call them (-fopenmp-simd; linked with -lmvec). */
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float log1pf(float);
#pragma omp declare simd notinbranch
float expm1f(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
float powf(float, float);

#define RT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

RT_CLONES void tn_rt_load_f32(float *dst, const float *src, int64_t stride, int64_t n)
{
  if (stride == 1) {
    for (int64_t i = 0; i < n; i++)
      dst[i] = src[i];
  } else if (stride == 0) {
    float v = src[0];
    for (int64_t i = 0; i < n; i++)
      dst[i] = v;
  } else {
    for (int64_t i = 0; i < n; i++)
      dst[i] = src[i * stride];
  }
}

RT_CLONES void tn_rt_store_f32(float *dst, int64_t stride, const float *src, int64_t n)
{
  if (stride == 1) {
    for (int64_t i = 0; i < n; i++)
      dst[i] = src[i];
  } else {
    for (int64_t i = 0; i < n; i++)
      dst[i * stride] = src[i];
  }
}

RT_CLONES void tn_rt_fill_f32(float *dst, float v, int64_t n)
{
  for (int64_t i = 0; i < n; i++)
    dst[i] = v;
}

static inline float rt_sigmoid(float x)
{
  return 1.0f / (1.0f + expf(-x));
}

#define UNARY_LOOP(expr) \
  for (int64_t i = 0; i < n; i++) { \
    float x = a[i]; \
    dst[i] = (expr); \
  } \
  break

RT_CLONES void tn_rt_unary_f32(int op, float *dst, const float *a, int64_t n)
{
  switch (op) {
  case TN_RT_NEG: UNARY_LOOP(-x);
  case TN_RT_ABS: UNARY_LOOP(fabsf(x));
  case TN_RT_EXP: UNARY_LOOP(expf(x));
  case TN_RT_LOG: UNARY_LOOP(logf(x));
  case TN_RT_LOG1P: UNARY_LOOP(log1pf(x));
  case TN_RT_EXPM1: UNARY_LOOP(expm1f(x));
  case TN_RT_SQRT: UNARY_LOOP(sqrtf(x));
  case TN_RT_RSQRT: UNARY_LOOP(1.0f / sqrtf(x));
  /* relu propagates NaN, as eager's clamp_min(x, 0) does */
  case TN_RT_RELU: UNARY_LOOP(x != x ? x : (x > 0.0f ? x : 0.0f));
  case TN_RT_SIGMOID: UNARY_LOOP(rt_sigmoid(x));
  case TN_RT_TANH: UNARY_LOOP(tanhf(x));
  case TN_RT_SILU: UNARY_LOOP(x * rt_sigmoid(x));
  case TN_RT_ERF: UNARY_LOOP(erff(x));
  case TN_RT_SIN: UNARY_LOOP(sinf(x));
  case TN_RT_COS: UNARY_LOOP(cosf(x));
  /* eager's exact gelu gives NaN for both infinities (its vectorised erf
  ** does); the tanh form gives +inf for +inf, as the formula does */
  case TN_RT_GELU: UNARY_LOOP(isinf(x) ? NAN : 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)));
  case TN_RT_GELU_TANH:
    UNARY_LOOP(0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x))));
  default:
    break;
  }
}

/* maximum/minimum and clamp propagate NaN from either side, like eager. */
static inline float rt_max(float x, float y)
{
  return x != x ? x : (y != y ? y : (x > y ? x : y));
}

static inline float rt_min(float x, float y)
{
  return x != x ? x : (y != y ? y : (x < y ? x : y));
}

#define BINARY_LOOP(expr) \
  for (int64_t i = 0; i < n; i++) { \
    float x = a[i], y = b[i]; \
    dst[i] = (expr); \
  } \
  break

RT_CLONES void tn_rt_binary_f32(int op, float *dst, const float *a, const float *b, int64_t n)
{
  switch (op) {
  case TN_RT_B_ADD: BINARY_LOOP(x + y);
  case TN_RT_B_SUB: BINARY_LOOP(x - y);
  case TN_RT_B_MUL: BINARY_LOOP(x * y);
  case TN_RT_B_DIV: BINARY_LOOP(x / y);
  case TN_RT_B_MAXIMUM: BINARY_LOOP(rt_max(x, y));
  case TN_RT_B_MINIMUM: BINARY_LOOP(rt_min(x, y));
  case TN_RT_B_POW: BINARY_LOOP(powf(x, y));
  /* clamp_min(x, lo): NaN in x stays, a NaN bound gives NaN */
  case TN_RT_B_CLAMP_MIN: BINARY_LOOP(y != y ? y : (x != x ? x : (x < y ? y : x)));
  case TN_RT_B_CLAMP_MAX: BINARY_LOOP(y != y ? y : (x != x ? x : (x > y ? y : x)));
  default:
    break;
  }
}

static const tn_rt_symbol rt_symbols[] = {
  {"tn_rt_load_f32", (const void *)tn_rt_load_f32},
  {"tn_rt_store_f32", (const void *)tn_rt_store_f32},
  {"tn_rt_fill_f32", (const void *)tn_rt_fill_f32},
  {"tn_rt_unary_f32", (const void *)tn_rt_unary_f32},
  {"tn_rt_binary_f32", (const void *)tn_rt_binary_f32},
  {NULL, NULL},
};

const tn_rt_symbol *tn_rt_symbols(void)
{
  return rt_symbols;
}

const char *tn_rt_prototypes(void)
{
  return "typedef long long i64;\n"
         "void tn_rt_load_f32(float *dst, const float *src, i64 stride, i64 n);\n"
         "void tn_rt_store_f32(float *dst, i64 stride, const float *src, i64 n);\n"
         "void tn_rt_fill_f32(float *dst, float v, i64 n);\n"
         "void tn_rt_unary_f32(int op, float *dst, const float *a, i64 n);\n"
         "void tn_rt_binary_f32(int op, float *dst, const float *a, const float *b, i64 n);\n";
}
