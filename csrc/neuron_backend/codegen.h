/*
** C code generation for fused kernel programs (csrc/lowering/fuse.h).
**
** A kernel is `void tn_kernel(i64 rank, const i64 *sizes, void **ptrs,
** const i64 *strides, i64 cols, const i64 *cstrides)`: operands (of their
** dtypes, fg_odtypes) are the group's inputs then its outputs; operand k's
** stride of dimension d (in elements, 0 where it broadcasts) is
** strides[k * rank + d].
**
** Pointwise kernels ignore cols, and cstrides but for gathers: the body
** walks the outer dimensions with an odometer and the innermost in
** TN_RT_BLOCK blocks, calling the runtime's primitives; where the innermost
** is short (128 elements at most) and nothing is gathered, a block holds a
** tile of rows of the last two dims instead (2-D loads and stores). A gathered table
** (fg_gather) is given with strides 0 over the index's dims and its own
** over the rest, its index with the index's strides over its dims and 0
** over the rest (so both broadcast to the result), and cstrides[k] the
** table's row stride: at each outer position the kernel moves the table's
** pointer to the row the index there picks (rows must be whole: the
** index's dims are all outer ones; the caller has checked every index). Row kernels (fg_reduce_dims > 0) take
** sizes and strides of the rows' space, and each row is cols elements at
** stride cstrides[k] for operand k (per-row outputs are written at the
** row's base); each phase of the program is one blocked pass over the row. The text depends only on the program, never on shapes, so
** one kernel (and one cache entry) serves every shape. No system header is
** included: the runtime's prototypes are declared in the text.
*/
#ifndef TN_CODEGEN_H
#define TN_CODEGEN_H

#include <stddef.h>

#include "../lowering/fuse.h"

/* Writes the C source of grp into *src (malloc'd, NUL-terminated; free()
** it). TN_ENOMEM. */
int tn_codegen_kernel(const tn_fgroup *grp, char **src);

/* Writes grp's tier-2 source into *src (malloc'd; free() it), or sets *src
** to NULL when tier 2 does not write this kind of group (only float32 and
** bool values, no gathers, no argmax/argmin). The unit is for an optimising
** compiler (the system C compiler at -O3, with -fopenmp-simd so that math
** calls take libmvec's vector versions) and includes no system header. It
** defines `int tn_kernel2(...)`, tn_kernel's signature, which returns 0
** when it ran the call and 1, before touching anything, for a layout it
** leaves to tier 1: strides along the innermost dim (pointwise) or the row
** other than 0 or 1 for inputs, or 1 for outputs; rows under 16 elements.
** TN_ENOMEM. */
int tn_codegen_tier2(const tn_fgroup *grp, char **src);

#endif /* TN_CODEGEN_H */
