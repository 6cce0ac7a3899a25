/*
** The runtime that generated kernels call: block primitives over float32
** (float16 and bfloat16 tensors are converted on load and store) and
** float64, compiled by the extension's build with optimisation (libtcc,
** which does not optimise, only emits the loops that call them). NaN, infinity and
** signed zero follow eager PyTorch.
**
** Generated code sees these through prototypes it declares itself (no
** system headers) and addresses registered with tcc_add_symbol, both made
** from one table (runtime_abi.h); the op numbers below are part of the
** generated source, hence of cache keys.
*/
#ifndef TN_RUNTIME_H
#define TN_RUNTIME_H

#include <stdint.h>

#include "../tn_common.h"
#include "runtime_abi.h"

/* Elements per block: 4 KiB of float32, so a kernel's blocks stay in L1. */
#define TN_RT_BLOCK 1024

/* Most short rows a row kernel packs into one block. */
#define TN_RT_TILE_ROWS 256

/* _(name, number, aten op it implements) */
#define TN_RT_UNARY_DEF(_) \
  _(NEG, 1) _(ABS, 2) _(EXP, 3) _(LOG, 4) _(LOG1P, 5) _(EXPM1, 6) _(SQRT, 7) _(RSQRT, 8) \
  _(RELU, 9) _(SIGMOID, 10) _(TANH, 11) _(SILU, 12) _(ERF, 13) _(SIN, 14) _(COS, 15) \
  _(GELU, 16) _(GELU_TANH, 17) _(ZERO_INF, 18) _(LNOT, 19) _(BNOT, 20) _(RECIPROCAL, 21) \
  _(FLOOR, 22) _(CEIL, 23) _(TRUNC, 24) _(ROUND, 25) _(SIGN, 26)

#define TN_RT_BINARY_DEF(_) \
  _(ADD, 1) _(SUB, 2) _(MUL, 3) _(DIV, 4) _(MAXIMUM, 5) _(MINIMUM, 6) _(POW, 7) \
  _(CLAMP_MIN, 8) _(CLAMP_MAX, 9) _(LAND, 10) _(LOR, 11) _(BAND, 12) _(BOR, 13) _(BXOR, 14)

/* Comparisons: 1 where a[i] op b[i] holds, else 0 (NaN compares unequal). */
#define TN_RT_COMPARE_DEF(_) _(EQ, 1) _(NE, 2) _(LT, 3) _(LE, 4) _(GT, 5) _(GE, 6)

enum {
#define TN_RT_U(name, num) TN_RT_##name = num,
  TN_RT_UNARY_DEF(TN_RT_U)
#undef TN_RT_U
};
enum {
#define TN_RT_B(name, num) TN_RT_B_##name = num,
  TN_RT_BINARY_DEF(TN_RT_B)
#undef TN_RT_B
};
enum {
#define TN_RT_C(name, num) TN_RT_C_##name = num,
  TN_RT_COMPARE_DEF(TN_RT_C)
#undef TN_RT_C
};

/* The widest vector ISA of the CPU, narrowed to config cpu_isa: what the
** runtime's math functions use, and what tier-2 kernels are compiled for. */
#define TN_RT_ISA_DEFAULT 0
#define TN_RT_ISA_AVX2 1   /* AVX2 and FMA */
#define TN_RT_ISA_AVX512 2 /* AVX-512 F */
int tn_rt_isa(void);

/* Eager's own math functions for unary op over float32 (f64 = 0) or
** float64 (f64 = 1) values: fn(n, a, r, mode) sets r[i] = op(a[i]) for
** i < n (r may be a), as MKL's VM functions vmsExp, vmdCos, ... do, which
** eager's float kernels (ATen's vml) call for exp, log, sin, cos, tanh and
** erf, with mode TN_RT_VM_MODE (vsExp's default mode handles every
** underflow, overflow or log(0) as an error: 4-10x eager's time there).
** Registered from torch's own library (backend._eager_math, after checking
** that each gives eager's values), the runtime's blocks of that op call it
** instead of libmvec's, which differ from eager's in the last bit for about
** one value in 50; NULL fn unregisters. Returns TN_EINVAL for an op other
** than those. Set before kernels run (it is read without a lock). */
int tn_rt_set_eager_math(int op, int f64, void *fn);

/* The mode eager passes them: VML_HA | VML_ERRMODE_IGNORE | VML_FTZDAZ_OFF. */
#define TN_RT_VM_MODE 0x140102LL

/* Eager's own function of unary op over float32 values (what its float32
** blocks call), or NULL. */
void *tn_rt_eager_fn(int op);

/* Ops a table of eager's functions is indexed by: 0 to this, exclusive. */
#define TN_RT_EAGER_OPS 32

/* The runtime op of an eager unary op's name ("exp", ...), or 0. */
int tn_rt_unary_named(const char *name);

/* Reductions of a row: sum, and max/min that propagate NaN (as eager's
** amax/amin do). ZERO_INF above is x, or 0 where x is infinite
** (logsumexp's shift). */
#define TN_RT_R_SUM 1
#define TN_RT_R_MAX 2
#define TN_RT_R_MIN 3
#define TN_RT_R_MEAN 4  /* accumulated as SUM; divided by the row's length (in double) when final */
#define TN_RT_R_ARGMAX 5 /* index of the first maximum (tn_rt_argreduce_*) */
#define TN_RT_R_ARGMIN 6 /* index of the first minimum */

/* The functions generated code calls, declared from the table of
** runtime_abi.h (which gives each one's contract). */
#define TN_RT_DECLARE(ret, name, params) ret name params;
TN_RT_ABI(TN_RT_DECLARE, int64_t)
#undef TN_RT_DECLARE

/* The position of the first of n indices (integers of isz bytes, 8 or 4,
** stride elements apart) outside [0, lim), or -1 when all lie inside. */
int64_t tn_rt_index_scan(const void *idx, int64_t stride, int64_t isz, int64_t lim, int64_t n);

/* v as a value of dtype, as eager converts a scalar: rounded to float32,
** float16 or bfloat16 (nearest even), an integer wrapped to an integer
** dtype's width (bool: v != 0); float64 unchanged. For the constants of
** generated code. */
double tn_rt_round(int dtype, double v);

/* Name and address of every runtime symbol, for tcc_add_symbol; ends with
** a NULL name. */
typedef struct tn_rt_symbol {
  const char *rs_name;
  const void *rs_addr;
} tn_rt_symbol;

const tn_rt_symbol *tn_rt_symbols(void);

/* At least the number of entries tn_rt_symbols() lists. */
#define TN_RT_MAX_SYMBOLS 96

/* The prototypes generated code declares (one C text). */
const char *tn_rt_prototypes(void);

#endif /* TN_RUNTIME_H */
