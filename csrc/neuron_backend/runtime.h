/*
** The runtime that generated kernels call: block primitives over float32
** (float16 and bfloat16 tensors are converted on load and store) and
** float64, compiled by the extension's build with optimisation (libtcc,
** which does not optimise, only emits the loops that call them). NaN, infinity and
** signed zero follow eager PyTorch.
**
** Generated code sees these through prototypes it declares itself (no
** system headers) and addresses registered with tcc_add_symbol; the op
** numbers below are part of the generated source, hence of cache keys.
*/
#ifndef TN_RUNTIME_H
#define TN_RUNTIME_H

#include <stdint.h>

#include "../tn_common.h"

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

/* Reductions of a row: sum, and max/min that propagate NaN (as eager's
** amax/amin do). ZERO_INF above is x, or 0 where x is infinite
** (logsumexp's shift). */
#define TN_RT_R_SUM 1
#define TN_RT_R_MAX 2
#define TN_RT_R_MIN 3
#define TN_RT_R_MEAN 4  /* accumulated as SUM; divided by the row's length (in double) when final */
#define TN_RT_R_ARGMAX 5 /* index of the first maximum (tn_rt_argreduce_*) */
#define TN_RT_R_ARGMIN 6 /* index of the first minimum */

/* dst[i] = src[i * stride] for i < n (stride in elements; 0 broadcasts). */
void tn_rt_load_f32(float *dst, const float *src, int64_t stride, int64_t n);

/* dst[i * stride] = src[i] for i < n. */
void tn_rt_store_f32(float *dst, int64_t stride, const float *src, int64_t n);

/* float16 / bfloat16 <-> float32 block conversions (strides in elements;
** stores round to nearest even). */
void tn_rt_load_f16(float *dst, const uint16_t *src, int64_t stride, int64_t n);
void tn_rt_store_f16(uint16_t *dst, int64_t stride, const float *src, int64_t n);
void tn_rt_load_bf16(float *dst, const uint16_t *src, int64_t stride, int64_t n);
void tn_rt_store_bf16(uint16_t *dst, int64_t stride, const float *src, int64_t n);

/* dst[i] = v. */
void tn_rt_fill_f32(float *dst, float v, int64_t n);

/* dst[i] = op(a[i]); dst may alias a. Unknown op: dst is left as is. */
void tn_rt_unary_f32(int op, float *dst, const float *a, int64_t n);

/* dst[i] = op(a[i], b[i]); dst may alias a or b. */
void tn_rt_binary_f32(int op, float *dst, const float *a, const float *b, int64_t n);

/* dst[i] = op(a[i], s); dst may alias a. */
void tn_rt_binary_s_f32(int op, float *dst, const float *a, float s, int64_t n);

/* float64 blocks: the same operations computed in double. */
void tn_rt_load_f64(double *dst, const double *src, int64_t stride, int64_t n);
void tn_rt_store_f64(double *dst, int64_t stride, const double *src, int64_t n);
void tn_rt_fill_f64(double *dst, double v, int64_t n);
void tn_rt_unary_f64(int op, double *dst, const double *a, int64_t n);
void tn_rt_binary_f64(int op, double *dst, const double *a, const double *b, int64_t n);
void tn_rt_binary_s_f64(int op, double *dst, const double *a, double s, int64_t n);

/* Integer blocks: every integer dtype computes in int64, wrapping as two's
** complement; a store wraps to the tensor's width. Unary ops: NEG, ABS,
** RELU, BNOT (~x), SIGN, and FLOOR / CEIL / TRUNC / ROUND (x itself); binary: ADD, SUB, MUL, MAXIMUM, MINIMUM, CLAMP_MIN,
** CLAMP_MAX, BAND, BOR, BXOR. */
void tn_rt_load_i64(int64_t *dst, const int64_t *src, int64_t stride, int64_t n);
void tn_rt_store_i64(int64_t *dst, int64_t stride, const int64_t *src, int64_t n);
void tn_rt_load_i32(int64_t *dst, const int32_t *src, int64_t stride, int64_t n);
void tn_rt_store_i32(int32_t *dst, int64_t stride, const int64_t *src, int64_t n);
void tn_rt_load_i16(int64_t *dst, const int16_t *src, int64_t stride, int64_t n);
void tn_rt_store_i16(int16_t *dst, int64_t stride, const int64_t *src, int64_t n);
void tn_rt_load_i8(int64_t *dst, const int8_t *src, int64_t stride, int64_t n);
void tn_rt_store_i8(int8_t *dst, int64_t stride, const int64_t *src, int64_t n);
void tn_rt_load_u8(int64_t *dst, const uint8_t *src, int64_t stride, int64_t n);
void tn_rt_store_u8(uint8_t *dst, int64_t stride, const int64_t *src, int64_t n);
void tn_rt_fill_i64(int64_t *dst, int64_t v, int64_t n);
void tn_rt_unary_i64(int op, int64_t *dst, const int64_t *a, int64_t n);
void tn_rt_binary_i64(int op, int64_t *dst, const int64_t *a, const int64_t *b, int64_t n);
void tn_rt_binary_s_i64(int op, int64_t *dst, const int64_t *a, int64_t s, int64_t n);

/* Bool blocks: bytes, 0 or 1, as a bool tensor holds them (read and
** written in place). Unary: LNOT; binary: LAND, LOR, BAND, BOR, BXOR,
** MAXIMUM, MINIMUM (on 0 and 1: and, or, xor, or, and). */
void tn_rt_load_b8(uint8_t *dst, const uint8_t *src, int64_t stride, int64_t n);
void tn_rt_store_b8(uint8_t *dst, int64_t stride, const uint8_t *src, int64_t n);
void tn_rt_fill_b8(uint8_t *dst, uint8_t v, int64_t n);
void tn_rt_unary_b8(int op, uint8_t *dst, const uint8_t *a, int64_t n);
void tn_rt_binary_b8(int op, uint8_t *dst, const uint8_t *a, const uint8_t *b, int64_t n);
void tn_rt_binary_s_b8(int op, uint8_t *dst, const uint8_t *a, uint8_t s, int64_t n);

/* Comparisons (TN_RT_C_*) of float32, float64, int64 or bool blocks, and
** with a scalar: dst[i] is 0 or 1 (a bool block). */
void tn_rt_compare_f32(int op, uint8_t *dst, const float *a, const float *b, int64_t n);
void tn_rt_compare_s_f32(int op, uint8_t *dst, const float *a, float s, int64_t n);
void tn_rt_compare_f64(int op, uint8_t *dst, const double *a, const double *b, int64_t n);
void tn_rt_compare_s_f64(int op, uint8_t *dst, const double *a, double s, int64_t n);
void tn_rt_compare_i64(int op, uint8_t *dst, const int64_t *a, const int64_t *b, int64_t n);
void tn_rt_compare_s_i64(int op, uint8_t *dst, const int64_t *a, int64_t s, int64_t n);
void tn_rt_compare_b8(int op, uint8_t *dst, const uint8_t *a, const uint8_t *b, int64_t n);
void tn_rt_compare_s_b8(int op, uint8_t *dst, const uint8_t *a, uint8_t s, int64_t n);

/* dst[i] = c[i] ? a[i] : b[i] (c: a bool block); dst may alias a or b. */
void tn_rt_where_f32(float *dst, const uint8_t *c, const float *a, const float *b, int64_t n);
void tn_rt_where_f64(double *dst, const uint8_t *c, const double *a, const double *b, int64_t n);
void tn_rt_where_i64(int64_t *dst, const uint8_t *c, const int64_t *a, const int64_t *b, int64_t n);
void tn_rt_where_b8(uint8_t *dst, const uint8_t *c, const uint8_t *a, const uint8_t *b, int64_t n);

/* Converts a block holding values of dtype `from` (TN_DTYPE_*) to one of
** dtype `to`, as eager's casts do: float16 and bfloat16 values (held as
** float32, maybe unrounded) are rounded to their dtype first, and values of
** an integer dtype (maybe not yet wrapped) are wrapped to it first; floats go to
** integers by truncation (NaN and out-of-range values as x86 gives them:
** the most negative int64, or of int32 for narrower types, then wrapped);
** to bool is x != 0 (NaN is true); integers wrap to their width. dst and
** src are blocks of the dtypes' compute types (float, double, int64 or
** bytes for bool);
** dst may alias src when those are the same. */
void tn_rt_cast(int to, int from, void *dst, const void *src, int64_t n);

/* Element gather: dst (n contiguous elements of esz bytes: 1, 2, 4 or 8)
** gets element e from base + e * st + index_e * dimst (byte offsets), where
** index_e is the integer of isz bytes (8 or 4) at idx + e * ist. The
** launcher has checked every index. */
void tn_rt_gather(void *dst, const char *base, int64_t st, const char *idx, int64_t ist, int64_t isz,
                  int64_t dimst, int64_t esz, int64_t n);

/* A row's argmax or argmin (op TN_RT_R_ARGMAX / ARGMIN), block by block:
** a[0..n) is the block starting at column j0; *at (-1 before the first
** block) and *best are the index and value of the first maximum (minimum)
** so far. A NaN counts as both, the first NaN winning, and ties go to the
** first, as eager's. Float blocks (float32, float16, bfloat16); _f64 and
** _i64 for double and int64 blocks. */
void tn_rt_argreduce_f32(int op, const float *a, int64_t n, int64_t j0, float *best, int64_t *at);
void tn_rt_argreduce_f64(int op, const double *a, int64_t n, int64_t j0, double *best, int64_t *at);
void tn_rt_argreduce_i64(int op, const int64_t *a, int64_t n, int64_t j0, int64_t *best, int64_t *at);

/* The position of the first of n indices (integers of isz bytes, 8 or 4,
** stride elements apart) outside [0, lim), or -1 when all lie inside. */
int64_t tn_rt_index_scan(const void *idx, int64_t stride, int64_t isz, int64_t lim, int64_t n);

/* v as a value of dtype, as eager converts a scalar: rounded to float32,
** float16 or bfloat16 (nearest even), an integer wrapped to an integer
** dtype's width (bool: v != 0); float64 unchanged. For the constants of
** generated code. */
double tn_rt_round(int dtype, double v);

/* The reduction op of a[0..n): sums (and MEAN, which is the sum here) are
** accumulated in double; n == 0 gives the identity (0, -inf, +inf). */
double tn_rt_reduce_f32(int op, const float *a, int64_t n);

/* Combines two partial results of reduction op. */
double tn_rt_combine(int op, double acc, double part);

/* Tiles of short rows (rows x cols values packed in the buffer; rs and cs
** are the tensor's row and element strides): 2-D loads and stores (of
** every block type, as the 1-D ones above), one
** final reduction per row (MEAN divided), op(a, s[row]), and s[row]
** repeated over each row. */
void tn_rt_load2d_f32(float *dst, const float *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_f32(float *dst, int64_t rs, int64_t cs, const float *src, int64_t rows, int64_t cols);
void tn_rt_load2d_f16(float *dst, const uint16_t *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_f16(uint16_t *dst, int64_t rs, int64_t cs, const float *src, int64_t rows, int64_t cols);
void tn_rt_load2d_bf16(float *dst, const uint16_t *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_bf16(uint16_t *dst, int64_t rs, int64_t cs, const float *src, int64_t rows, int64_t cols);
void tn_rt_load2d_f64(double *dst, const double *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_f64(double *dst, int64_t rs, int64_t cs, const double *src, int64_t rows, int64_t cols);
void tn_rt_load2d_i64(int64_t *dst, const int64_t *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_i64(int64_t *dst, int64_t rs, int64_t cs, const int64_t *src, int64_t rows, int64_t cols);
void tn_rt_load2d_i32(int64_t *dst, const int32_t *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_i32(int32_t *dst, int64_t rs, int64_t cs, const int64_t *src, int64_t rows, int64_t cols);
void tn_rt_load2d_i16(int64_t *dst, const int16_t *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_i16(int16_t *dst, int64_t rs, int64_t cs, const int64_t *src, int64_t rows, int64_t cols);
void tn_rt_load2d_i8(int64_t *dst, const int8_t *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_i8(int8_t *dst, int64_t rs, int64_t cs, const int64_t *src, int64_t rows, int64_t cols);
void tn_rt_load2d_u8(int64_t *dst, const uint8_t *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_u8(uint8_t *dst, int64_t rs, int64_t cs, const int64_t *src, int64_t rows, int64_t cols);
void tn_rt_load2d_b8(uint8_t *dst, const uint8_t *src, int64_t rs, int64_t cs, int64_t rows, int64_t cols);
void tn_rt_store2d_b8(uint8_t *dst, int64_t rs, int64_t cs, const uint8_t *src, int64_t rows, int64_t cols);
void tn_rt_reduce_rows_f32(int op, float *dst, const float *a, int64_t rows, int64_t cols);
void tn_rt_binary_rs_f32(int op, float *dst, const float *a, const float *s, int64_t rows, int64_t cols);
void tn_rt_splat_rows_f32(float *dst, const float *s, int64_t rows, int64_t cols);
/* dst = op(a, row) with one row of cols broadcast over every row. */
void tn_rt_binary_rb_f32(int op, float *dst, const float *a, const float *row, int64_t rows, int64_t cols);

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
