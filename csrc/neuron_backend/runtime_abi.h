/*
** The runtime's ABI: every function of runtime.h that generated kernels may
** call, one entry each, X(return type, name, (parameters)). From this table
** come the C prototypes (runtime.h), the symbols registered with
** tcc_add_symbol (tn_rt_symbols) and the prototypes every generated unit
** declares (tn_rt_prototypes, runtime.c): adding a runtime function is one
** entry here, and its definition.
**
** An entry is written as generated code declares it, and its text, taken
** through #, is part of every kernel's source and hence of cache keys: the
** order and spelling of entries are fixed. Types are C's own, since
** generated code includes no system header (unsigned short is uint16_t,
** int int32_t, short int16_t, signed char int8_t, unsigned char uint8_t),
** but for i64, TN_RT_ABI's second argument: int64_t in C, the i64 of
** generated code (a typedef of long long) in its text.
*/
#ifndef TN_RUNTIME_ABI_H
#define TN_RUNTIME_ABI_H

#define TN_RT_ABI(X, i64) \
  /* dst[i] = src[i * stride] for i < n (stride in elements; 0 broadcasts). */ \
  X(void, tn_rt_load_f32, (float *dst, const float *src, i64 stride, i64 n)) \
  /* dst[i * stride] = src[i] for i < n. */ \
  X(void, tn_rt_store_f32, (float *dst, i64 stride, const float *src, i64 n)) \
  /* float16 / bfloat16 <-> float32 block conversions (strides in elements; \
  ** stores round to nearest even). */ \
  X(void, tn_rt_load_f16, (float *dst, const unsigned short *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_f16, (unsigned short *dst, i64 stride, const float *src, i64 n)) \
  X(void, tn_rt_load_bf16, (float *dst, const unsigned short *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_bf16, (unsigned short *dst, i64 stride, const float *src, i64 n)) \
  /* dst[i] = v. */ \
  X(void, tn_rt_fill_f32, (float *dst, float v, i64 n)) \
  /* dst[i] = op(a[i]); dst may alias a. Unknown op: dst is left as is. */ \
  X(void, tn_rt_unary_f32, (int op, float *dst, const float *a, i64 n)) \
  /* dst[i] = op(a[i], b[i]); dst may alias a or b. */ \
  X(void, tn_rt_binary_f32, (int op, float *dst, const float *a, const float *b, i64 n)) \
  /* dst[i] = op(a[i], s); dst may alias a. */ \
  X(void, tn_rt_binary_s_f32, (int op, float *dst, const float *a, float s, i64 n)) \
  /* float64 blocks: the same operations computed in double. */ \
  X(void, tn_rt_load_f64, (double *dst, const double *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_f64, (double *dst, i64 stride, const double *src, i64 n)) \
  X(void, tn_rt_fill_f64, (double *dst, double v, i64 n)) \
  X(void, tn_rt_unary_f64, (int op, double *dst, const double *a, i64 n)) \
  X(void, tn_rt_binary_f64, (int op, double *dst, const double *a, const double *b, i64 n)) \
  X(void, tn_rt_binary_s_f64, (int op, double *dst, const double *a, double s, i64 n)) \
  /* Integer blocks: every integer dtype computes in int64, wrapping as two's \
  ** complement; a store wraps to the tensor's width. Their fill and ops \
  ** follow the bool blocks'. */ \
  X(void, tn_rt_load_i64, (i64 *dst, const i64 *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_i64, (i64 *dst, i64 stride, const i64 *src, i64 n)) \
  X(void, tn_rt_load_i32, (i64 *dst, const int *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_i32, (int *dst, i64 stride, const i64 *src, i64 n)) \
  X(void, tn_rt_load_i16, (i64 *dst, const short *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_i16, (short *dst, i64 stride, const i64 *src, i64 n)) \
  X(void, tn_rt_load_i8, (i64 *dst, const signed char *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_i8, (signed char *dst, i64 stride, const i64 *src, i64 n)) \
  X(void, tn_rt_load_u8, (i64 *dst, const unsigned char *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_u8, (unsigned char *dst, i64 stride, const i64 *src, i64 n)) \
  /* Bool blocks: bytes, 0 or 1, as a bool tensor holds them (read and \
  ** written in place). Unary: LNOT; binary: LAND, LOR, BAND, BOR, BXOR, \
  ** MAXIMUM, MINIMUM (on 0 and 1: and, or, xor, or, and). Their \
  ** comparisons and where are those of the other blocks below. */ \
  X(void, tn_rt_load_b8, (unsigned char *dst, const unsigned char *src, i64 stride, i64 n)) \
  X(void, tn_rt_store_b8, (unsigned char *dst, i64 stride, const unsigned char *src, i64 n)) \
  X(void, tn_rt_fill_b8, (unsigned char *dst, unsigned char v, i64 n)) \
  X(void, tn_rt_unary_b8, (int op, unsigned char *dst, const unsigned char *a, i64 n)) \
  X(void, tn_rt_binary_b8, (int op, unsigned char *dst, const unsigned char *a, const unsigned char *b, i64 n)) \
  X(void, tn_rt_binary_s_b8, (int op, unsigned char *dst, const unsigned char *a, unsigned char s, i64 n)) \
  X(void, tn_rt_compare_b8, (int op, unsigned char *dst, const unsigned char *a, const unsigned char *b, i64 n)) \
  X(void, tn_rt_compare_s_b8, (int op, unsigned char *dst, const unsigned char *a, unsigned char s, i64 n)) \
  X(void, tn_rt_where_b8, (unsigned char *dst, const unsigned char *c, const unsigned char *a, \
                           const unsigned char *b, i64 n)) \
  /* int64 blocks (the integer blocks' compute type). Unary ops: NEG, ABS, \
  ** RELU, BNOT (~x), SIGN, and FLOOR / CEIL / TRUNC / ROUND (x itself); \
  ** binary: ADD, SUB, MUL, MAXIMUM, MINIMUM, CLAMP_MIN, CLAMP_MAX, BAND, \
  ** BOR, BXOR. */ \
  X(void, tn_rt_fill_i64, (i64 *dst, i64 v, i64 n)) \
  X(void, tn_rt_unary_i64, (int op, i64 *dst, const i64 *a, i64 n)) \
  X(void, tn_rt_binary_i64, (int op, i64 *dst, const i64 *a, const i64 *b, i64 n)) \
  X(void, tn_rt_binary_s_i64, (int op, i64 *dst, const i64 *a, i64 s, i64 n)) \
  /* Comparisons (TN_RT_C_*) of float32, float64, int64 or bool blocks, and \
  ** with a scalar: dst[i] is 0 or 1 (a bool block). */ \
  X(void, tn_rt_compare_f32, (int op, unsigned char *dst, const float *a, const float *b, i64 n)) \
  X(void, tn_rt_compare_s_f32, (int op, unsigned char *dst, const float *a, float s, i64 n)) \
  X(void, tn_rt_compare_f64, (int op, unsigned char *dst, const double *a, const double *b, i64 n)) \
  X(void, tn_rt_compare_s_f64, (int op, unsigned char *dst, const double *a, double s, i64 n)) \
  X(void, tn_rt_compare_i64, (int op, unsigned char *dst, const i64 *a, const i64 *b, i64 n)) \
  X(void, tn_rt_compare_s_i64, (int op, unsigned char *dst, const i64 *a, i64 s, i64 n)) \
  /* dst[i] = c[i] ? a[i] : b[i] (c: a bool block); dst may alias a or b. */ \
  X(void, tn_rt_where_f32, (float *dst, const unsigned char *c, const float *a, const float *b, i64 n)) \
  X(void, tn_rt_where_f64, (double *dst, const unsigned char *c, const double *a, const double *b, i64 n)) \
  X(void, tn_rt_where_i64, (i64 *dst, const unsigned char *c, const i64 *a, const i64 *b, i64 n)) \
  /* Converts a block holding values of dtype `from` (TN_DTYPE_*) to one of \
  ** dtype `to`, as eager's casts do: float16 and bfloat16 values (held as \
  ** float32, maybe unrounded) are rounded to their dtype first, and values of \
  ** an integer dtype (maybe not yet wrapped) are wrapped to it first; floats go to \
  ** integers by truncation (NaN and out-of-range values as x86 gives them: \
  ** the most negative int64, or of int32 for narrower types, then wrapped); \
  ** to bool is x != 0 (NaN is true); integers wrap to their width. dst and \
  ** src are blocks of the dtypes' compute types (float, double, int64 or \
  ** bytes for bool); \
  ** dst may alias src when those are the same. */ \
  X(void, tn_rt_cast, (int to, int from, void *dst, const void *src, i64 n)) \
  /* Element gather: dst (n contiguous elements of esz bytes: 1, 2, 4 or 8) \
  ** gets element e from base + e * st + index_e * dimst (byte offsets), where \
  ** index_e is the integer of isz bytes (8 or 4) at idx + e * ist. The \
  ** launcher has checked every index. */ \
  X(void, tn_rt_gather, (void *dst, const char *base, i64 st, const char *idx, i64 ist, i64 isz, i64 dimst, \
                         i64 esz, i64 n)) \
  /* The reduction op of a[0..n): sums (and MEAN, which is the sum here) are \
  ** accumulated in double; n == 0 gives the identity (0, -inf, +inf). */ \
  X(double, tn_rt_reduce_f32, (int op, const float *a, i64 n)) \
  /* A row's argmax or argmin (op TN_RT_R_ARGMAX / ARGMIN), block by block: \
  ** a[0..n) is the block starting at column j0; *at (-1 before the first \
  ** block) and *best are the index and value of the first maximum (minimum) \
  ** so far. A NaN counts as both, the first NaN winning, and ties go to the \
  ** first, as eager's. Float blocks (float32, float16, bfloat16); _f64 and \
  ** _i64 for double and int64 blocks. */ \
  X(void, tn_rt_argreduce_f32, (int op, const float *a, i64 n, i64 j0, float *best, i64 *at)) \
  X(void, tn_rt_argreduce_f64, (int op, const double *a, i64 n, i64 j0, double *best, i64 *at)) \
  X(void, tn_rt_argreduce_i64, (int op, const i64 *a, i64 n, i64 j0, i64 *best, i64 *at)) \
  /* Combines two partial results of reduction op. */ \
  X(double, tn_rt_combine, (int op, double acc, double part)) \
  /* Tiles of short rows (rows x cols values packed in the buffer; rs and cs \
  ** are the tensor's row and element strides): 2-D loads and stores (of \
  ** every block type, as the 1-D ones above), one \
  ** final reduction per row (MEAN divided), op(a, s[row]), and s[row] \
  ** repeated over each row. */ \
  X(void, tn_rt_load2d_f32, (float *dst, const float *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_f32, (float *dst, i64 rs, i64 cs, const float *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_f16, (float *dst, const unsigned short *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_f16, (unsigned short *dst, i64 rs, i64 cs, const float *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_bf16, (float *dst, const unsigned short *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_bf16, (unsigned short *dst, i64 rs, i64 cs, const float *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_f64, (double *dst, const double *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_f64, (double *dst, i64 rs, i64 cs, const double *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_i64, (i64 *dst, const i64 *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_i64, (i64 *dst, i64 rs, i64 cs, const i64 *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_i32, (i64 *dst, const int *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_i32, (int *dst, i64 rs, i64 cs, const i64 *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_i16, (i64 *dst, const short *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_i16, (short *dst, i64 rs, i64 cs, const i64 *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_i8, (i64 *dst, const signed char *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_i8, (signed char *dst, i64 rs, i64 cs, const i64 *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_u8, (i64 *dst, const unsigned char *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_u8, (unsigned char *dst, i64 rs, i64 cs, const i64 *src, i64 rows, i64 cols)) \
  X(void, tn_rt_load2d_b8, (unsigned char *dst, const unsigned char *src, i64 rs, i64 cs, i64 rows, i64 cols)) \
  X(void, tn_rt_store2d_b8, (unsigned char *dst, i64 rs, i64 cs, const unsigned char *src, i64 rows, i64 cols)) \
  X(void, tn_rt_reduce_rows_f32, (int op, float *dst, const float *a, i64 rows, i64 cols)) \
  X(void, tn_rt_binary_rs_f32, (int op, float *dst, const float *a, const float *s, i64 rows, i64 cols)) \
  X(void, tn_rt_splat_rows_f32, (float *dst, const float *s, i64 rows, i64 cols)) \
  /* dst = op(a, row) with one row of cols broadcast over every row. */ \
  X(void, tn_rt_binary_rb_f32, (int op, float *dst, const float *a, const float *row, i64 rows, i64 cols))

#endif /* TN_RUNTIME_ABI_H */
