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
#include "runtime_ops.h"

#include <math.h>
#include <stdint.h>
#include <strings.h>

#include "../graph/graph.h"
#include "../tn_config.h"

/* glibc's libmvec holds SIMD versions of these (the accuracy class of
** eager's Sleef, NaN and infinity handled): declaring them as OpenMP SIMD
** functions, as glibc's own headers do under -ffast-math, lets the
** vectoriser call them (-fopenmp-simd; linked with -lmvec). */
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
double tanh(double);
#pragma omp declare simd notinbranch
double erf(double);
#pragma omp declare simd notinbranch
double sin(double);
#pragma omp declare simd notinbranch
double cos(double);

/* x86-64-v4: AVX-512 F, BW, DQ, VL (DQ converts int64 <-> float in vectors). */
#define RT_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))

/* Strided block loads, stores and fills of type T (suffix SUF). */
#define RT_LOAD_STORE_FNS(SUF, T) \
  RT_CLONES void tn_rt_fill_##SUF(T *dst, T v, int64_t n) \
  { \
    for (int64_t i = 0; i < n; i++) \
      dst[i] = v; \
  } \
  \
  RT_CLONES void tn_rt_load_##SUF(T *dst, const T *src, int64_t stride, int64_t n) \
  { \
    if (stride == 1) { \
      for (int64_t i = 0; i < n; i++) \
        dst[i] = src[i]; \
    } else if (stride == 0) { \
      T v = src[0]; \
      for (int64_t i = 0; i < n; i++) \
        dst[i] = v; \
    } else { \
      for (int64_t i = 0; i < n; i++) \
        dst[i] = src[i * stride]; \
    } \
  } \
  \
  RT_CLONES void tn_rt_store_##SUF(T *dst, int64_t stride, const T *src, int64_t n) \
  { \
    if (stride == 1) { \
      for (int64_t i = 0; i < n; i++) \
        dst[i] = src[i]; \
    } else { \
      for (int64_t i = 0; i < n; i++) \
        dst[i * stride] = src[i]; \
    } \
  }

RT_LOAD_STORE_FNS(f32, float)
RT_LOAD_STORE_FNS(f64, double)

/* float16 and bfloat16 are computed in float32 and rounded to their dtype
** (runtime_ops.h) */
TN_RT_HALF_CONVERSIONS

/* float16 through F16C where the CPU has it: 8 elements an instruction,
** ~6x the portable conversions' speed vectorised (and GCC 12 vectorises
** no _Float16 cast). rt_f16c converts the first multiple of 8 of n unit-
** stride elements and returns how many it did; only where rt_has_f16c. */
typedef float rt_v8sf __attribute__((vector_size(32)));
typedef short rt_v8hi __attribute__((vector_size(16)));

static inline int rt_has_f16c(void)
{
  return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}

#define RT_F16C_LOAD 0  /* float16 elements to float32 */
#define RT_F16C_STORE 1 /* float32 to float16 elements */
#define RT_F16C_ROUND 2 /* float32 rounded to float16's precision */

/* (imm 0 of vcvtps2ph: round to nearest even) */
__attribute__((target("avx,f16c"))) static int64_t rt_f16c(int op, void *dst, const void *src, int64_t n)
{
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    rt_v8sf f;
    rt_v8hi h;
    if (op == RT_F16C_LOAD)
      __builtin_memcpy(&h, (const uint16_t *)src + i, sizeof h);
    else
      __builtin_memcpy(&f, (const float *)src + i, sizeof f);
    if (op != RT_F16C_LOAD)
      h = __builtin_ia32_vcvtps2ph256(f, 0);
    if (op == RT_F16C_STORE) {
      __builtin_memcpy((uint16_t *)dst + i, &h, sizeof h);
    } else {
      f = __builtin_ia32_vcvtph2ps256(h);
      __builtin_memcpy((float *)dst + i, &f, sizeof f);
    }
  }
  return i;
}

/* (omp simd: -O2's cost model left the float16 conversions scalar) */
#define RT_CONVERT_PAIR(name, from, to, fast_load, fast_store) \
  RT_CLONES void tn_rt_load_##name(float *dst, const uint16_t *src, int64_t stride, int64_t n) \
  { \
    int64_t i = stride == 1 ? fast_load : 0; \
    _Pragma("omp simd") for (int64_t k = i; k < n; k++) \
      dst[k] = from(src[k * stride]); \
  } \
  RT_CLONES void tn_rt_store_##name(uint16_t *dst, int64_t stride, const float *src, int64_t n) \
  { \
    int64_t i = stride == 1 ? fast_store : 0; \
    _Pragma("omp simd") for (int64_t k = i; k < n; k++) \
      dst[k * stride] = to(src[k]); \
  }

RT_CONVERT_PAIR(f16, tn_rt_from_f16, tn_rt_to_f16, (rt_has_f16c() ? rt_f16c(RT_F16C_LOAD, dst, src, n) : 0),
                (rt_has_f16c() ? rt_f16c(RT_F16C_STORE, dst, src, n) : 0))
RT_CONVERT_PAIR(bf16, tn_rt_from_bf16, tn_rt_to_bf16, 0, 0)

/* -- exp, log, log1p, expm1, pow: explicit libmvec calls --------------------
** GCC vectorises calls through their OpenMP SIMD declarations only for some
** functions (tanhf, erff, sinf, cosf above) unless -ffast-math; these it
** keeps scalar. So they call libmvec's 16-lane AVX-512 or 8-lane AVX2
** versions directly, chosen once by a CPU check, with a scalar tail. */

typedef float rt_v8 __attribute__((vector_size(32)));

rt_v8 _ZGVdN8v_expf(rt_v8);
rt_v8 _ZGVdN8v_logf(rt_v8);
rt_v8 _ZGVdN8v_log1pf(rt_v8);
rt_v8 _ZGVdN8v_expm1f(rt_v8);
rt_v8 _ZGVdN8vv_powf(rt_v8, rt_v8);

#define RT_VMATH_EXP 1
#define RT_VMATH_LOG 2
#define RT_VMATH_LOG1P 3
#define RT_VMATH_EXPM1 4
#define RT_VMATH_SIGMOID 5
#define RT_VMATH_SILU 6
#define RT_VMATH_POW 7

__attribute__((target("avx2,fma"))) static rt_v8 rt_v8_apply(int f, rt_v8 x, rt_v8 y)
{
  const rt_v8 one = {1, 1, 1, 1, 1, 1, 1, 1};
  switch (f) {
  case RT_VMATH_EXP: return _ZGVdN8v_expf(x);
  case RT_VMATH_LOG: return _ZGVdN8v_logf(x);
  case RT_VMATH_LOG1P: return _ZGVdN8v_log1pf(x);
  case RT_VMATH_EXPM1: return _ZGVdN8v_expm1f(x);
  case RT_VMATH_SIGMOID: return one / (one + _ZGVdN8v_expf(-x));
  case RT_VMATH_SILU: return x / (one + _ZGVdN8v_expf(-x));
  default: return _ZGVdN8vv_powf(x, y);
  }
}

/* dst[i] = f(a[i](, b[i])) for the 8-lane body; returns how many were done. */
__attribute__((target("avx2,fma"))) static int64_t rt_vmath_avx2(int f, float *dst, const float *a,
                                                               const float *b, int64_t n)
{
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    rt_v8 x, y = {0};
    __builtin_memcpy(&x, a + i, sizeof x);
    if (b)
      __builtin_memcpy(&y, b + i, sizeof y);
    rt_v8 r = rt_v8_apply(f, x, y);
    __builtin_memcpy(dst + i, &r, sizeof r);
  }
  return i;
}

/* The same with libmvec's 16-lane AVX-512 versions. */
typedef float rt_v16 __attribute__((vector_size(64)));

rt_v16 _ZGVeN16v_expf(rt_v16);
rt_v16 _ZGVeN16v_logf(rt_v16);
rt_v16 _ZGVeN16v_log1pf(rt_v16);
rt_v16 _ZGVeN16v_expm1f(rt_v16);
rt_v16 _ZGVeN16vv_powf(rt_v16, rt_v16);

__attribute__((target("avx512f"))) static int64_t rt_vmath_avx512(int f, float *dst, const float *a,
                                                                const float *b, int64_t n)
{
  const rt_v16 one = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    rt_v16 x, y = {0}, r;
    __builtin_memcpy(&x, a + i, sizeof x);
    if (b)
      __builtin_memcpy(&y, b + i, sizeof y);
    switch (f) {
    case RT_VMATH_EXP: r = _ZGVeN16v_expf(x); break;
    case RT_VMATH_LOG: r = _ZGVeN16v_logf(x); break;
    case RT_VMATH_LOG1P: r = _ZGVeN16v_log1pf(x); break;
    case RT_VMATH_EXPM1: r = _ZGVeN16v_expm1f(x); break;
    case RT_VMATH_SIGMOID: r = one / (one + _ZGVeN16v_expf(-x)); break;
    case RT_VMATH_SILU: r = x / (one + _ZGVeN16v_expf(-x)); break;
    default: r = _ZGVeN16vv_powf(x, y); break;
    }
    __builtin_memcpy(dst + i, &r, sizeof r);
  }
  return i;
}

#define RT_ISA_DEFAULT TN_RT_ISA_DEFAULT
#define RT_ISA_AVX2 TN_RT_ISA_AVX2
#define RT_ISA_AVX512 TN_RT_ISA_AVX512
int tn_rt_isa(void)
{
  static int cpu = -1;
  if (cpu < 0)
    cpu = __builtin_cpu_supports("avx512f") ? RT_ISA_AVX512
          : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? RT_ISA_AVX2 : RT_ISA_DEFAULT;
  /* cpu_isa's choices: auto, avx512, avx2, default */
  static const int cap[] = {RT_ISA_AVX512, RT_ISA_AVX512, RT_ISA_AVX2, RT_ISA_DEFAULT};
  int64_t c = tn_config_int(TN_CFG_cpu_isa);
  int want = c >= 0 && c < (int64_t)(sizeof cap / sizeof cap[0]) ? cap[c] : RT_ISA_DEFAULT;
  return want < cpu ? want : cpu;
}

/* f over a[0..n) (and b): the widest vectors tn_rt_isa() allows (AVX-512,
** else AVX2), the last elements too, padded to a vector, so that a value gives
** the same result wherever it lies (libm's scalar functions differ from
** libmvec's in the last bit). Returns how many were done: n, or 0 without
** AVX2. T the element type, PAD a multiple of every width. */
#define RT_VMATH_ALL(name, T, PAD, wide_fn, narrow_fn) \
  static int64_t name(int f, T *dst, const T *a, const T *b, int64_t n) \
  { \
    int isa = tn_rt_isa(), wide = isa == RT_ISA_AVX512; \
    if (isa == RT_ISA_DEFAULT) \
      return 0; \
    int64_t done = wide ? wide_fn(f, dst, a, b, n) : narrow_fn(f, dst, a, b, n); \
    if (done < n) { \
      T ta[PAD] = {0}, tb[PAD] = {0}, td[PAD]; \
      __builtin_memcpy(ta, a + done, sizeof(T) * (size_t)(n - done)); \
      if (b) \
        __builtin_memcpy(tb, b + done, sizeof(T) * (size_t)(n - done)); \
      if (wide) \
        wide_fn(f, td, ta, b ? tb : NULL, PAD); \
      else \
        narrow_fn(f, td, ta, b ? tb : NULL, PAD); \
      __builtin_memcpy(dst + done, td, sizeof(T) * (size_t)(n - done)); \
    } \
    return n; \
  }

RT_VMATH_ALL(rt_vmath, float, 16, rt_vmath_avx512, rt_vmath_avx2)

/* float64: libmvec's 8-lane AVX-512 or 4-lane AVX2 versions. */
typedef double rt_v4d __attribute__((vector_size(32)));
typedef double rt_v8d __attribute__((vector_size(64)));

rt_v4d _ZGVdN4v_exp(rt_v4d);
rt_v4d _ZGVdN4v_log(rt_v4d);
rt_v4d _ZGVdN4v_log1p(rt_v4d);
rt_v4d _ZGVdN4v_expm1(rt_v4d);
rt_v4d _ZGVdN4vv_pow(rt_v4d, rt_v4d);
rt_v8d _ZGVeN8v_exp(rt_v8d);
rt_v8d _ZGVeN8v_log(rt_v8d);
rt_v8d _ZGVeN8v_log1p(rt_v8d);
rt_v8d _ZGVeN8v_expm1(rt_v8d);
rt_v8d _ZGVeN8vv_pow(rt_v8d, rt_v8d);

/* One width's loop: dst[i] = f(a[i](, b[i])); T the vector type, V the
** libmvec name's ISA and lane part (e.g. eN8). */
#define RT_VMATH_F64_BODY(T, LANES, V) \
  int64_t i = 0; \
  T one; \
  for (int l = 0; l < LANES; l++) \
    one[l] = 1.0; \
  for (; i + LANES <= n; i += LANES) { \
    T x, y = {0}, r; \
    __builtin_memcpy(&x, a + i, sizeof x); \
    if (b) \
      __builtin_memcpy(&y, b + i, sizeof y); \
    switch (f) { \
    case RT_VMATH_EXP: r = _ZGV##V##v_exp(x); break; \
    case RT_VMATH_LOG: r = _ZGV##V##v_log(x); break; \
    case RT_VMATH_LOG1P: r = _ZGV##V##v_log1p(x); break; \
    case RT_VMATH_EXPM1: r = _ZGV##V##v_expm1(x); break; \
    case RT_VMATH_SIGMOID: r = one / (one + _ZGV##V##v_exp(-x)); break; \
    case RT_VMATH_SILU: r = x / (one + _ZGV##V##v_exp(-x)); break; \
    default: r = _ZGV##V##vv_pow(x, y); break; \
    } \
    __builtin_memcpy(dst + i, &r, sizeof r); \
  } \
  return i

__attribute__((target("avx2,fma"))) static int64_t rt_vmath_f64_avx2(int f, double *dst, const double *a,
                                                                   const double *b, int64_t n)
{
  RT_VMATH_F64_BODY(rt_v4d, 4, dN4);
}

__attribute__((target("avx512f"))) static int64_t rt_vmath_f64_avx512(int f, double *dst, const double *a,
                                                                    const double *b, int64_t n)
{
  RT_VMATH_F64_BODY(rt_v8d, 8, eN8);
}

RT_VMATH_ALL(rt_vmath_f64, double, 8, rt_vmath_f64_avx512, rt_vmath_f64_avx2)

/* The libmvec body of unary op, or 0 when it has none (its scalar loop
** does all). */
static int rt_vmath_unary(int op)
{
  switch (op) {
  case TN_RT_EXP: return RT_VMATH_EXP;
  case TN_RT_LOG: return RT_VMATH_LOG;
  case TN_RT_LOG1P: return RT_VMATH_LOG1P;
  case TN_RT_EXPM1: return RT_VMATH_EXPM1;
  case TN_RT_SIGMOID: return RT_VMATH_SIGMOID;
  case TN_RT_SILU: return RT_VMATH_SILU;
  default: return 0;
  }
}

/* -- Eager's math functions (tn_rt_set_eager_math) -------------------------- */

typedef void (*rt_eager_fn)(int n, const void *a, void *r, long long mode);

static void *rt_eager[2][TN_RT_EAGER_OPS]; /* [f64][op] */

static int rt_eager_op(int op)
{
  switch (op) {
  case TN_RT_EXP: case TN_RT_LOG: case TN_RT_SIN: case TN_RT_COS: case TN_RT_TANH: case TN_RT_ERF:
    return 1;
  default:
    return 0;
  }
}

int tn_rt_set_eager_math(int op, int f64, void *fn)
{
  if (!rt_eager_op(op) || (f64 != 0 && f64 != 1))
    return TN_EINVAL;
  __atomic_store_n(&rt_eager[f64][op], fn, __ATOMIC_RELEASE);
  return TN_OK;
}

void *tn_rt_eager_fn(int op)
{
  return op >= 0 && op < TN_RT_EAGER_OPS ? __atomic_load_n(&rt_eager[0][op], __ATOMIC_ACQUIRE) : NULL;
}

int tn_rt_unary_named(const char *name)
{
#define RT_NAMED(op, num) \
  if (strcasecmp(name, #op) == 0) \
    return num;
  TN_RT_UNARY_DEF(RT_NAMED)
#undef RT_NAMED
  return 0;
}

/* Whether eager's function of op did the whole block (n elements). */
static inline int rt_eager_block(int f64, int op, void *dst, const void *a, int64_t n)
{
  if (op < 0 || op >= TN_RT_EAGER_OPS || n <= 0 || n > INT32_MAX)
    return 0;
  rt_eager_fn fn = (rt_eager_fn)__atomic_load_n(&rt_eager[f64][op], __ATOMIC_ACQUIRE);
  if (!fn)
    return 0;
  fn((int)n, a, dst, TN_RT_VM_MODE);
  return 1;
}

#define UNARY_LOOP(expr) \
  for (int64_t i = 0; i < n; i++) { \
    __typeof__(*a) x = a[i]; \
    dst[i] = (expr); \
  } \
  break

#define RT_UNARY_CASE(name, expr) case TN_RT_##name: UNARY_LOOP(expr);

static inline __attribute__((always_inline)) void rt_unary_f32_loop(int op, float *dst, const float *a, int64_t n)
{
  switch (op) {
  TN_RT_F32_UNARY_EXPR(RT_UNARY_CASE)
  default:
    break;
  }
}

/* Whole vectors of 16 through the loop, then the rest padded to 16: the
** compiler's vector loop (libmvec's functions) takes every element, never
** its scalar remainder loop (libm's, which differ in the last bit), so a
** value gives the same result wherever it lies. */
RT_CLONES void tn_rt_unary_f32(int op, float *dst, const float *a, int64_t n)
{
  if (rt_eager_block(0, op, dst, a, n))
    return;
  int f = rt_vmath_unary(op);
  if (f && rt_vmath(f, dst, a, NULL, n) == n)
    return;
  int64_t body = n & ~(int64_t)15;
  rt_unary_f32_loop(op, dst, a, body);
  if (body < n) {
    float ta[16] = {0}, td[16];
    __builtin_memcpy(ta, a + body, sizeof(float) * (size_t)(n - body));
    rt_unary_f32_loop(op, td, ta, 16);
    __builtin_memcpy(dst + body, td, sizeof(float) * (size_t)(n - body));
  }
}

/* maximum/minimum and clamp propagate NaN from either side, like eager
** (x and y are variables of the loop below). */
#define RT_MAX(x, y) ((x) != (x) ? (x) : ((y) != (y) ? (y) : ((x) > (y) ? (x) : (y))))
#define RT_MIN(x, y) ((x) != (x) ? (x) : ((y) != (y) ? (y) : ((x) < (y) ? (x) : (y))))

#define BINARY_LOOP(yexpr, expr) \
  for (int64_t i = 0; i < n; i++) { \
    __typeof__(*a) x = a[i], y = (yexpr); \
    dst[i] = (expr); \
  } \
  break

/* The math library's pow of x's type, for TN_RT_FLOAT_BINARY_EXPR; the
** cases of every binary op but pow's vector body, y read as b[i] (V) or s
** (S). */
#define TN_RT_POW(x, y) _Generic((x), float: powf, default: pow)(x, y)
#define RT_BINARY_CASE_V(name, expr) case TN_RT_B_##name: BINARY_LOOP(b[i], expr);
#define RT_BINARY_CASE_S(name, expr) case TN_RT_B_##name: BINARY_LOOP(s, expr);

/* The binary primitives of one type T (suffix SUF): pow's vector body
** through VMATH, its scalar tail and every other op through TN_RT_FLOAT_BINARY_EXPR. */
#define RT_BINARY_FNS(SUF, T, VMATH) \
  RT_CLONES void tn_rt_binary_##SUF(int op, T *dst, const T *a, const T *b, int64_t n) \
  { \
    if (op == TN_RT_B_POW) { \
      int64_t done = VMATH(RT_VMATH_POW, dst, a, b, n); \
      dst += done; \
      a += done; \
      b += done; \
      n -= done; \
    } \
    switch (op) { \
    TN_RT_FLOAT_BINARY_EXPR(RT_BINARY_CASE_V) \
    default: \
      break; \
    } \
  } \
  \
  RT_CLONES void tn_rt_binary_s_##SUF(int op, T *dst, const T *a, T s, int64_t n) \
  { \
    if ((op == TN_RT_B_CLAMP_MIN || op == TN_RT_B_CLAMP_MAX) && s == s) { /* a number bound: one compare */ \
      for (int64_t i = 0; i < n; i++) \
        dst[i] = (op == TN_RT_B_CLAMP_MIN ? a[i] < s : a[i] > s) ? s : a[i]; \
      return; \
    } \
    if (op == TN_RT_B_POW) { /* through the vector pow, a block at a time */ \
      T b[256]; \
      for (int i = 0; i < 256; i++) \
        b[i] = s; \
      for (int64_t i = 0; i < n; i += 256) \
        tn_rt_binary_##SUF(op, dst + i, a + i, b, n - i < 256 ? n - i : 256); \
      return; \
    } \
    switch (op) { \
    TN_RT_FLOAT_BINARY_EXPR(RT_BINARY_CASE_S) \
    default: \
      break; \
    } \
  }

RT_BINARY_FNS(f32, float, rt_vmath)

/* float64: computed in double throughout, with the math library's double
** functions (libmvec's where the CPU has AVX2 or AVX-512); special values
** follow eager's float64 kernels (gelu(+inf) = +inf and gelu(-inf) = NaN,
** as the formula gives, and as the float32 kernel above). */
static inline __attribute__((always_inline)) void rt_unary_f64_loop(int op, double *dst, const double *a, int64_t n)
{
  switch (op) {
  case TN_RT_NEG: UNARY_LOOP(-x);
  case TN_RT_ABS: UNARY_LOOP(fabs(x));
  case TN_RT_EXP: UNARY_LOOP(exp(x));
  case TN_RT_LOG: UNARY_LOOP(log(x));
  case TN_RT_LOG1P: UNARY_LOOP(log1p(x));
  case TN_RT_EXPM1: UNARY_LOOP(expm1(x));
  case TN_RT_SQRT: UNARY_LOOP(sqrt(x));
  case TN_RT_RSQRT: UNARY_LOOP(1.0 / sqrt(x));
  case TN_RT_RECIPROCAL: UNARY_LOOP(1.0 / x);
  case TN_RT_FLOOR: UNARY_LOOP(floor(x));
  case TN_RT_CEIL: UNARY_LOOP(ceil(x));
  case TN_RT_TRUNC: UNARY_LOOP(trunc(x));
  case TN_RT_ROUND: UNARY_LOOP(rint(x));
  case TN_RT_SIGN: UNARY_LOOP((double)((x > 0.0) - (x < 0.0)));
  case TN_RT_RELU: UNARY_LOOP(x < 0.0 ? 0.0 : x);
  case TN_RT_SIGMOID: UNARY_LOOP(1.0 / (1.0 + exp(-x)));
  case TN_RT_TANH: UNARY_LOOP(tanh(x));
  case TN_RT_SILU: UNARY_LOOP(x / (1.0 + exp(-x)));
  case TN_RT_ERF: UNARY_LOOP(erf(x));
  case TN_RT_SIN: UNARY_LOOP(sin(x));
  case TN_RT_COS: UNARY_LOOP(cos(x));
  case TN_RT_GELU: UNARY_LOOP(0.5 * x * (1.0 + erf(x * 0.70710678118654752440)));
  case TN_RT_GELU_TANH: UNARY_LOOP(0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x))));
  case TN_RT_ZERO_INF: UNARY_LOOP(isinf(x) ? 0.0 : x);
  default:
    break;
  }
}

/* Whole vectors of 16 through the loop, then the rest padded to 16: the
** compiler's vector loop (libmvec's functions) takes every element, never
** its scalar remainder loop (libm's, which differ in the last bit), so a
** value gives the same result wherever it lies. */
RT_CLONES void tn_rt_unary_f64(int op, double *dst, const double *a, int64_t n)
{
  if (rt_eager_block(1, op, dst, a, n))
    return;
  int f = rt_vmath_unary(op);
  if (f && rt_vmath_f64(f, dst, a, NULL, n) == n)
    return;
  int64_t body = n & ~(int64_t)15;
  rt_unary_f64_loop(op, dst, a, body);
  if (body < n) {
    double ta[16] = {0}, td[16];
    __builtin_memcpy(ta, a + body, sizeof(double) * (size_t)(n - body));
    rt_unary_f64_loop(op, td, ta, 16);
    __builtin_memcpy(dst + body, td, sizeof(double) * (size_t)(n - body));
  }
}

RT_BINARY_FNS(f64, double, rt_vmath_f64)

/* -- Integers: int64 blocks -------------------------------------------------
** Arithmetic goes through uint64_t, so it wraps (as eager's integer
** kernels do) instead of overflowing. */

RT_LOAD_STORE_FNS(i64, int64_t)

/* Loads widen to int64; stores wrap to the width. */
#define RT_INT_IO(SUF, T) \
  RT_CLONES void tn_rt_load_##SUF(int64_t *dst, const T *src, int64_t stride, int64_t n) \
  { \
    for (int64_t i = 0; i < n; i++) \
      dst[i] = (int64_t)src[i * stride]; \
  } \
  RT_CLONES void tn_rt_store_##SUF(T *dst, int64_t stride, const int64_t *src, int64_t n) \
  { \
    for (int64_t i = 0; i < n; i++) \
      dst[i * stride] = (T)(uint64_t)src[i]; \
  }

RT_INT_IO(i32, int32_t)
RT_INT_IO(i16, int16_t)
RT_INT_IO(i8, int8_t)
RT_INT_IO(u8, uint8_t)

#define RT_WRAP(expr) ((int64_t)(expr))

RT_CLONES void tn_rt_unary_i64(int op, int64_t *dst, const int64_t *a, int64_t n)
{
  switch (op) {
  case TN_RT_NEG: UNARY_LOOP(RT_WRAP(0 - (uint64_t)x));
  case TN_RT_ABS: UNARY_LOOP(x < 0 ? RT_WRAP(0 - (uint64_t)x) : x);
  case TN_RT_RELU: UNARY_LOOP(x < 0 ? 0 : x);
  case TN_RT_BNOT: UNARY_LOOP(~x);
  case TN_RT_SIGN: UNARY_LOOP((int64_t)(x > 0) - (x < 0));
  case TN_RT_FLOOR: case TN_RT_CEIL: case TN_RT_TRUNC: case TN_RT_ROUND: UNARY_LOOP(x);
  default:
    break;
  }
}

/* The integer binary ops, y read as Y. */
#define INT_BINARY_CASES(Y) \
  case TN_RT_B_ADD: BINARY_LOOP(Y, RT_WRAP((uint64_t)x + (uint64_t)y)); \
  case TN_RT_B_SUB: BINARY_LOOP(Y, RT_WRAP((uint64_t)x - (uint64_t)y)); \
  case TN_RT_B_MUL: BINARY_LOOP(Y, RT_WRAP((uint64_t)x * (uint64_t)y)); \
  case TN_RT_B_MAXIMUM: case TN_RT_B_CLAMP_MIN: BINARY_LOOP(Y, x > y ? x : y); \
  case TN_RT_B_MINIMUM: case TN_RT_B_CLAMP_MAX: BINARY_LOOP(Y, x < y ? x : y); \
  case TN_RT_B_BAND: BINARY_LOOP(Y, x & y); \
  case TN_RT_B_BOR: BINARY_LOOP(Y, x | y); \
  case TN_RT_B_BXOR: BINARY_LOOP(Y, x ^ y);

/* A pair of primitives over blocks of T whose ops are all CASES (a macro
** of the second operand): NAME elementwise (b[i]) and NAME_S with a scalar
** (s), writing DST_T (T, or bytes for comparisons). Unknown op: dst is
** left as is. */
#define RT_OP_PAIR(NAME, NAME_S, DST_T, T, CASES) \
  RT_CLONES void NAME(int op, DST_T *dst, const T *a, const T *b, int64_t n) \
  { \
    switch (op) { \
    CASES(b[i]) \
    default: \
      break; \
    } \
  } \
  RT_CLONES void NAME_S(int op, DST_T *dst, const T *a, T s, int64_t n) \
  { \
    switch (op) { \
    CASES(s) \
    default: \
      break; \
    } \
  }

/* The binary primitives of type T (suffix SUF). */
#define RT_CASE_BINARY_FNS(SUF, T, CASES) RT_OP_PAIR(tn_rt_binary_##SUF, tn_rt_binary_s_##SUF, T, T, CASES)

RT_CASE_BINARY_FNS(i64, int64_t, INT_BINARY_CASES)

/* -- Bool: blocks of bytes, 0 or 1, as bool tensors hold them ---------------- */

RT_LOAD_STORE_FNS(b8, uint8_t)

RT_CLONES void tn_rt_unary_b8(int op, uint8_t *dst, const uint8_t *a, int64_t n)
{
  if (op == TN_RT_LNOT)
    for (int64_t i = 0; i < n; i++)
      dst[i] = a[i] ^ 1;
}

/* The bool binary ops: on 0 and 1, and / or / xor are the logical ones and
** max / min are or / and. */
#define BOOL_BINARY_CASES(Y) \
  case TN_RT_B_LAND: case TN_RT_B_BAND: case TN_RT_B_MINIMUM: BINARY_LOOP(Y, x & y); \
  case TN_RT_B_LOR: case TN_RT_B_BOR: case TN_RT_B_MAXIMUM: BINARY_LOOP(Y, x | y); \
  case TN_RT_B_BXOR: BINARY_LOOP(Y, x ^ y);

RT_CASE_BINARY_FNS(b8, uint8_t, BOOL_BINARY_CASES)

/* -- Comparisons and selection --------------------------------------------- */

#define RT_COMPARE_LOOP(Y, cmp) \
  for (int64_t i = 0; i < n; i++) \
    dst[i] = a[i] cmp (Y); \
  break

#define RT_COMPARE_CASES(Y) \
  case TN_RT_C_EQ: RT_COMPARE_LOOP(Y, ==); \
  case TN_RT_C_NE: RT_COMPARE_LOOP(Y, !=); \
  case TN_RT_C_LT: RT_COMPARE_LOOP(Y, <); \
  case TN_RT_C_LE: RT_COMPARE_LOOP(Y, <=); \
  case TN_RT_C_GT: RT_COMPARE_LOOP(Y, >); \
  case TN_RT_C_GE: RT_COMPARE_LOOP(Y, >=);

#define RT_SELECT_FNS(SUF, T) \
  RT_OP_PAIR(tn_rt_compare_##SUF, tn_rt_compare_s_##SUF, uint8_t, T, RT_COMPARE_CASES) \
  RT_CLONES void tn_rt_where_##SUF(T *dst, const uint8_t *c, const T *a, const T *b, int64_t n) \
  { \
    for (int64_t i = 0; i < n; i++) \
      dst[i] = c[i] ? a[i] : b[i]; \
  }

RT_SELECT_FNS(f32, float)
RT_SELECT_FNS(f64, double)
RT_SELECT_FNS(i64, int64_t)
RT_SELECT_FNS(b8, uint8_t)

/* -- Casts ------------------------------------------------------------------ */

/* Integer dtypes (held in int64 blocks; bool is not one of them). */
static int rt_is_int(int dt)
{
  return dt == TN_DTYPE_UINT8 || dt == TN_DTYPE_INT8 || dt == TN_DTYPE_INT16 || dt == TN_DTYPE_INT32 ||
         dt == TN_DTYPE_INT64;
}

/* An int64 wrapped to integer dtype `to`'s width. */
static inline int64_t rt_wrap_int(int to, int64_t x)
{
  switch (to) {
  case TN_DTYPE_UINT8: return (uint8_t)(uint64_t)x;
  case TN_DTYPE_INT8: return (int8_t)(uint8_t)(uint64_t)x;
  case TN_DTYPE_INT16: return (int16_t)(uint16_t)(uint64_t)x;
  case TN_DTYPE_INT32: return (int32_t)(uint32_t)(uint64_t)x;
  default: return x;
  }
}

/* x (a float) to integer dtype `to`, as x86's truncating conversions give
** it (cvttsd2si: the "integer indefinite" for NaN and out of range; below
** 64 bits eager converts through int32, then wraps to the width). */
static inline int64_t rt_float_to_int(int to, double x)
{
  if (to == TN_DTYPE_INT64)
    return x == x && x > -0x1p63 - 1 && x < 0x1p63 ? (int64_t)x : INT64_MIN;
  return rt_wrap_int(to, x == x && x > -0x1p31 - 1 && x < 0x1p31 ? (int64_t)(int32_t)x : INT32_MIN);
}

/* A float32 value rounded to dtype dt's precision (float16, bfloat16). */
static inline float rt_round_f32(int dt, float x)
{
  if (dt == TN_DTYPE_FLOAT16)
    return tn_rt_round_f16(x);
  if (dt == TN_DTYPE_BFLOAT16)
    return tn_rt_round_bf16(x);
  return x;
}

#define RT_CAST_LOOP(TD, TS, expr) \
  do { \
    TD *d = dst; \
    const TS *s = src; \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { \
      TS x = s[i]; \
      d[i] = (expr); \
    } \
  } while (0)

/* The loops of a cast; inlined where to (and maybe from) are constants, so
** that each copy is straight-line code the vectoriser takes. */
static inline __attribute__((always_inline)) void rt_cast(int to, int from, void *dst, const void *src, int64_t n)
{
  int fi = rt_is_int(from), ti = rt_is_int(to);
  int tf64 = to == TN_DTYPE_FLOAT64;
  if (from == TN_DTYPE_BOOL && to == TN_DTYPE_BOOL)
    RT_CAST_LOOP(uint8_t, uint8_t, x);
  else if (from == TN_DTYPE_BOOL && ti)
    RT_CAST_LOOP(int64_t, uint8_t, (int64_t)x);
  else if (from == TN_DTYPE_BOOL && tf64)
    RT_CAST_LOOP(double, uint8_t, (double)x);
  else if (from == TN_DTYPE_BOOL) /* 0 and 1 are exact in every float type */
    RT_CAST_LOOP(float, uint8_t, (float)x);
  else if (to == TN_DTYPE_BOOL && fi)
    RT_CAST_LOOP(uint8_t, int64_t, rt_wrap_int(from, x) != 0);
  else if (to == TN_DTYPE_BOOL && from == TN_DTYPE_FLOAT64)
    RT_CAST_LOOP(uint8_t, double, x != 0);
  else if (to == TN_DTYPE_BOOL) /* NaN is true; a float16 value rounds first */
    RT_CAST_LOOP(uint8_t, float, rt_round_f32(from, x) != 0);
  else if (fi && ti)
    RT_CAST_LOOP(int64_t, int64_t, rt_wrap_int(to, rt_wrap_int(from, x)));
  else if (fi && tf64)
    RT_CAST_LOOP(double, int64_t, (double)rt_wrap_int(from, x));
  else if (fi) /* through float32, as eager (int64 -> float -> half) */
    RT_CAST_LOOP(float, int64_t, rt_round_f32(to, (float)rt_wrap_int(from, x)));
  else if (from == TN_DTYPE_FLOAT64 && ti)
    RT_CAST_LOOP(int64_t, double, rt_float_to_int(to, x));
  else if (from == TN_DTYPE_FLOAT64 && tf64)
    RT_CAST_LOOP(double, double, x);
  else if (from == TN_DTYPE_FLOAT64)
    RT_CAST_LOOP(float, double, rt_round_f32(to, (float)x));
  else if (ti)
    RT_CAST_LOOP(int64_t, float, rt_float_to_int(to, rt_round_f32(from, x)));
  else if (tf64)
    RT_CAST_LOOP(double, float, (double)rt_round_f32(from, x));
  else if (from == to) /* a float16/bfloat16 value rounded (fuse.c emit_exact): once is enough */
    RT_CAST_LOOP(float, float, rt_round_f32(to, x));
  else
    RT_CAST_LOOP(float, float, rt_round_f32(to, rt_round_f32(from, x)));
}

/* One copy per target dtype T and per source whose values are rounded or
** wrapped first (the rest differ outside the loop only). */
#define RT_CAST_FROM(T, F) \
  case F: \
    rt_cast(T, F, dst, src, n); \
    break;
#define RT_CAST_TO(T) \
  case T: \
    switch (from) { \
    RT_CAST_FROM(T, TN_DTYPE_FLOAT16) \
    RT_CAST_FROM(T, TN_DTYPE_BFLOAT16) \
    RT_CAST_FROM(T, TN_DTYPE_INT32) \
    RT_CAST_FROM(T, TN_DTYPE_INT16) \
    RT_CAST_FROM(T, TN_DTYPE_INT8) \
    RT_CAST_FROM(T, TN_DTYPE_UINT8) \
    default: \
      rt_cast(T, from, dst, src, n); \
      break; \
    } \
    break;

RT_CLONES void tn_rt_cast(int to, int from, void *dst, const void *src, int64_t n)
{
  if (to == TN_DTYPE_FLOAT16 && (from == TN_DTYPE_FLOAT16 || from == TN_DTYPE_FLOAT32) && rt_has_f16c()) {
    int64_t done = rt_f16c(RT_F16C_ROUND, dst, src, n); /* float16 values rounded (fuse.c emit_exact) */
    dst = (float *)dst + done;
    src = (const float *)src + done;
    n -= done;
  }
  switch (to) {
  RT_CAST_TO(TN_DTYPE_BOOL)
  RT_CAST_TO(TN_DTYPE_UINT8)
  RT_CAST_TO(TN_DTYPE_INT8)
  RT_CAST_TO(TN_DTYPE_INT16)
  RT_CAST_TO(TN_DTYPE_INT32)
  RT_CAST_TO(TN_DTYPE_INT64)
  RT_CAST_TO(TN_DTYPE_FLOAT16)
  RT_CAST_TO(TN_DTYPE_BFLOAT16)
  RT_CAST_TO(TN_DTYPE_FLOAT32)
  RT_CAST_TO(TN_DTYPE_FLOAT64)
  default:
    break;
  }
}

/* One element gather loop, for element type T and index type I; the
** innermost-dim case (st == 0, a contiguous index) separate, so that the
** compiler can use vector gathers. */
#define RT_GATHER(T, I)                                                                        \
  do {                                                                                         \
    if (st == 0 && ist == (int64_t)sizeof(I)) {                                                \
      const I *ix = (const I *)idx;                                                            \
      for (int64_t e = 0; e < n; e++)                                                          \
        ((T *)dst)[e] = *(const T *)(base + ix[e] * dimst);                                    \
    } else {                                                                                   \
      for (int64_t e = 0; e < n; e++)                                                          \
        ((T *)dst)[e] = *(const T *)(base + e * st + *(const I *)(idx + e * ist) * dimst);     \
    }                                                                                          \
  } while (0)
#define RT_GATHER_T(T) \
  do {                 \
    if (isz == 8)      \
      RT_GATHER(T, int64_t); \
    else               \
      RT_GATHER(T, int32_t); \
  } while (0)

RT_CLONES void tn_rt_gather(void *dst, const char *base, int64_t st, const char *idx, int64_t ist, int64_t isz,
                            int64_t dimst, int64_t esz, int64_t n)
{
  switch (esz) {
  case 8: RT_GATHER_T(uint64_t); break;
  case 4: RT_GATHER_T(uint32_t); break;
  case 2: RT_GATHER_T(uint16_t); break;
  default: RT_GATHER_T(uint8_t); break;
  }
}
#undef RT_GATHER_T
#undef RT_GATHER

#define RT_INDEX_SCAN(I)                                                 \
  do {                                                                   \
    const I *p = (const I *)idx;                                         \
    uint64_t out = 0;                                                    \
    if (stride == 1)                                                     \
      for (int64_t e = 0; e < n; e++)                                    \
        out |= (uint64_t)(int64_t)p[e] >= (uint64_t)lim;                 \
    else                                                                 \
      for (int64_t e = 0; e < n; e++)                                    \
        out |= (uint64_t)(int64_t)p[e * stride] >= (uint64_t)lim;        \
    if (!out)                                                            \
      return -1;                                                         \
    for (int64_t e = 0; e < n; e++)                                      \
      if ((uint64_t)(int64_t)p[e * stride] >= (uint64_t)lim)             \
        return e;                                                        \
  } while (0)

RT_CLONES int64_t tn_rt_index_scan(const void *idx, int64_t stride, int64_t isz, int64_t lim, int64_t n)
{
  if (isz == 8)
    RT_INDEX_SCAN(int64_t);
  else
    RT_INDEX_SCAN(int32_t);
  return -1;
}
#undef RT_INDEX_SCAN

double tn_rt_round(int dtype, double v)
{
  if (dtype == TN_DTYPE_FLOAT32 || dtype == TN_DTYPE_FLOAT16 || dtype == TN_DTYPE_BFLOAT16)
    return (double)rt_round_f32(dtype, (float)v);
  if (dtype == TN_DTYPE_BOOL)
    return v != 0;
  if (rt_is_int(dtype) && v == v && v >= -0x1p63 && v < 0x1p63)
    return (double)rt_wrap_int(dtype, (int64_t)v);
  return v;
}

static inline double rt_combine(int op, double acc, double part)
{
  if (op == TN_RT_R_SUM || op == TN_RT_R_MEAN)
    return acc + part;
  if (acc != acc || part != part)
    return acc != acc ? acc : part;
  return op == TN_RT_R_MAX ? (part > acc ? part : acc) : (part < acc ? part : acc);
}

/* Sixteen lanes each (vector types, so the compiler need not reassociate
** anything): a lane takes x when x is larger (smaller) or NaN, so a NaN lane
** stays NaN, as in eager's amax/amin. */
typedef int32_t rt_m16 __attribute__((vector_size(64)));
#define RT_LANES 16

/* Lane-wise max (min) of acc and x that keeps NaN from either side. */
#define RT_TAKE(op, acc, x) \
  ((rt_v16)(((rt_m16)(x) & (((op) == TN_RT_R_MAX ? (x) > (acc) : (x) < (acc)) | ((x) != (x)))) | \
            ((rt_m16)(acc) & ~(((op) == TN_RT_R_MAX ? (x) > (acc) : (x) < (acc)) | ((x) != (x))))))

/* Sums accumulate in double lanes (rt_v8d): the mean of a row of equal
** values is then that value exactly (layer norm of such a row gives 0, as
** eager). */
RT_CLONES double tn_rt_reduce_f32(int op, const float *a, int64_t n)
{
  int64_t i = 0;
  if (op == TN_RT_R_SUM || op == TN_RT_R_MEAN) {
    rt_v8d acc = {0}, acc1 = {0}; /* two chains: the adds' latency overlaps */
    double r = 0;
    for (; i + 16 <= n; i += 16) {
      rt_v8 x, y;
      __builtin_memcpy(&x, a + i, sizeof x);
      __builtin_memcpy(&y, a + i + 8, sizeof y);
      acc += __builtin_convertvector(x, rt_v8d);
      acc1 += __builtin_convertvector(y, rt_v8d);
    }
    acc += acc1;
    for (; i + 8 <= n; i += 8) {
      rt_v8 x;
      __builtin_memcpy(&x, a + i, sizeof x);
      acc += __builtin_convertvector(x, rt_v8d);
    }
    for (; i < n; i++)
      r += a[i];
    for (int l = 0; l < 8; l++)
      r += acc[l];
    return r;
  }
  float init = op == TN_RT_R_MAX ? -INFINITY : INFINITY;
  rt_v16 acc = init - (rt_v16){0};
  float tail = init;
  for (; i + RT_LANES <= n; i += RT_LANES) {
    rt_v16 x;
    __builtin_memcpy(&x, a + i, sizeof x);
    acc = RT_TAKE(op, acc, x);
  }
  for (; i < n; i++) {
    float x = a[i];
    if ((op == TN_RT_R_MAX ? x > tail : x < tail) || x != x)
      tail = x;
  }
  /* fold the lanes: halves, quarters, ... (the same take rule) */
  rt_v16 hi = __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
  acc = RT_TAKE(op, acc, hi);
  hi = __builtin_shufflevector(acc, acc, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
  acc = RT_TAKE(op, acc, hi);
  hi = __builtin_shufflevector(acc, acc, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  acc = RT_TAKE(op, acc, hi);
  hi = __builtin_shufflevector(acc, acc, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  acc = RT_TAKE(op, acc, hi);
  return rt_combine(op, tail, acc[0]);
}

/* Folds a block's first extreme (v at column j) into the running one. */
#define RT_ARG_TAKE(op, v, j, best, at, isnan_)                                                     \
  do {                                                                                          \
    if (*(at) < 0 || isnan_(v) || ((op) == TN_RT_R_ARGMAX ? (v) > *(best) : (v) < *(best))) {   \
      *(best) = (v);                                                                            \
      *(at) = (j);                                                                              \
    }                                                                                           \
  } while (0)
#define RT_ISNAN(x) ((x) != (x))
#define RT_NEVER_NAN(x) 0

/* The first e in [0, n) where a[e] is m, or a NaN when m is one (a
** vector compare per 16 elements, then the lanes one by one). */
RT_CLONES static int64_t rt_find_f32(const float *a, int64_t n, float m)
{
  int64_t e = 0;
  int nan = m != m;
  for (; e + 16 <= n; e += 16) {
    rt_v16 x;
    __builtin_memcpy(&x, a + e, sizeof x);
    rt_m16 hit = nan ? (x != x) : (x == m);
    int any = 0;
    for (int l = 0; l < 16; l++)
      any |= hit[l];
    if (any)
      break;
  }
  while (e < n && !(nan ? a[e] != a[e] : a[e] == m))
    e++;
  return e;
}

void tn_rt_argreduce_f32(int op, const float *a, int64_t n, int64_t j0, float *best, int64_t *at)
{
  if (n <= 0 || (*at >= 0 && RT_ISNAN(*best)))
    return;
  /* the block's extreme, vectorised (a NaN propagates), then its first place */
  float m = (float)tn_rt_reduce_f32(op == TN_RT_R_ARGMAX ? TN_RT_R_MAX : TN_RT_R_MIN, a, n);
  if (*at >= 0 && !RT_ISNAN(m) && !(op == TN_RT_R_ARGMAX ? m > *best : m < *best))
    return; /* no better than the blocks before: no need to find it */
  RT_ARG_TAKE(op, m, j0 + rt_find_f32(a, n, m), best, at, RT_ISNAN);
}

#define RT_ARGREDUCE(T, isnan_)                                          \
  do {                                                                   \
    if (n <= 0 || (*at >= 0 && isnan_(*best)))                           \
      return;                                                            \
    T v = a[0];                                                          \
    int64_t bi = 0;                                                      \
    for (int64_t e = 1; e < n && !isnan_(v); e++)                        \
      if (isnan_(a[e]) || (op == TN_RT_R_ARGMAX ? a[e] > v : a[e] < v)) { \
        v = a[e];                                                        \
        bi = e;                                                          \
      }                                                                  \
    RT_ARG_TAKE(op, v, j0 + bi, best, at, isnan_);                       \
  } while (0)

void tn_rt_argreduce_f64(int op, const double *a, int64_t n, int64_t j0, double *best, int64_t *at)
{
  RT_ARGREDUCE(double, RT_ISNAN);
}

RT_CLONES void tn_rt_argreduce_i64(int op, const int64_t *a, int64_t n, int64_t j0, int64_t *best, int64_t *at)
{
  RT_ARGREDUCE(int64_t, RT_NEVER_NAN);
}
#undef RT_ARGREDUCE
#undef RT_ARG_TAKE
#undef RT_ISNAN
#undef RT_NEVER_NAN

double tn_rt_combine(int op, double acc, double part)
{
  return rt_combine(op, acc, part);
}

/* -- Tiles of short rows: rows x cols elements, rows packed in the buffer -- */

#define RT_TILE_IO(name, btype, type) \
  void tn_rt_load2d_##name(btype *dst, const type *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols) \
  { \
    for (int64_t r = 0; r < rows; r++) \
      tn_rt_load_##name(dst + r * cols, src + r * rs, cs, cols); \
  } \
  void tn_rt_store2d_##name(type *dst, int64_t rs, int64_t cs, const btype *src, int64_t rows, int64_t cols) \
  { \
    for (int64_t r = 0; r < rows; r++) \
      tn_rt_store_##name(dst + r * rs, cs, src + r * cols, cols); \
  }

/* Those of native elements: one loop nest, no call per row (tiles of rows
** of a few dozen elements are where the calls would cost the most). */
#define RT_TILE_NATIVE(name, type) \
  RT_CLONES void tn_rt_load2d_##name(type *dst, const type *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols) \
  { \
    for (int64_t r = 0; r < rows; r++, dst += cols, src += rs) \
      if (cs == 1) { \
        for (int64_t i = 0; i < cols; i++) \
          dst[i] = src[i]; \
      } else { \
        for (int64_t i = 0; i < cols; i++) \
          dst[i] = src[i * cs]; \
      } \
  } \
  RT_CLONES void tn_rt_store2d_##name(type *dst, int64_t rs, int64_t cs, const type *src, int64_t rows, int64_t cols) \
  { \
    for (int64_t r = 0; r < rows; r++, dst += rs, src += cols) \
      if (cs == 1) { \
        for (int64_t i = 0; i < cols; i++) \
          dst[i] = src[i]; \
      } else { \
        for (int64_t i = 0; i < cols; i++) \
          dst[i * cs] = src[i]; \
      } \
  }

RT_TILE_NATIVE(f32, float)
RT_TILE_NATIVE(f64, double)
RT_TILE_NATIVE(i64, int64_t)
RT_TILE_NATIVE(b8, uint8_t)
RT_TILE_IO(f16, float, uint16_t)
RT_TILE_IO(bf16, float, uint16_t)
RT_TILE_IO(i32, int64_t, int32_t)
RT_TILE_IO(i16, int64_t, int16_t)
RT_TILE_IO(i8, int64_t, int8_t)
RT_TILE_IO(u8, int64_t, uint8_t)

void tn_rt_reduce_rows_f32(int op, float *dst, const float *a, int64_t rows, int64_t cols)
{
  for (int64_t r = 0; r < rows; r++) {
    double v = tn_rt_reduce_f32(op, a + r * cols, cols);
    dst[r] = (float)(op == TN_RT_R_MEAN ? v / (double)cols : v);
  }
}

void tn_rt_binary_rs_f32(int op, float *dst, const float *a, const float *s, int64_t rows, int64_t cols)
{
  for (int64_t r = 0; r < rows; r++)
    tn_rt_binary_s_f32(op, dst + r * cols, a + r * cols, s[r], cols);
}

void tn_rt_binary_rb_f32(int op, float *dst, const float *a, const float *row, int64_t rows, int64_t cols)
{
  for (int64_t r = 0; r < rows; r++)
    tn_rt_binary_f32(op, dst + r * cols, a + r * cols, row, cols);
}

void tn_rt_splat_rows_f32(float *dst, const float *s, int64_t rows, int64_t cols)
{
  for (int64_t r = 0; r < rows; r++)
    tn_rt_fill_f32(dst + r * cols, s[r], cols);
}

#define TN_RT_SYMBOL(ret, name, params) {#name, (const void *)name},
static const tn_rt_symbol rt_symbols[] = {
  TN_RT_ABI(TN_RT_SYMBOL, int64_t)
  {NULL, NULL},
};
#undef TN_RT_SYMBOL

_Static_assert(sizeof rt_symbols / sizeof rt_symbols[0] - 1 <= TN_RT_MAX_SYMBOLS, "TN_RT_MAX_SYMBOLS is too small");

const tn_rt_symbol *tn_rt_symbols(void)
{
  return rt_symbols;
}

/* An entry's prototype as generated code declares it. */
#define TN_RT_PROTOTYPE(ret, name, params) #ret " " #name #params ";\n"

const char *tn_rt_prototypes(void)
{
  return "typedef long long i64;\n"
         "static double tn_bits(unsigned long long u) { return *(double *)&u; }\n"
         TN_RT_ABI(TN_RT_PROTOTYPE, i64);
}
