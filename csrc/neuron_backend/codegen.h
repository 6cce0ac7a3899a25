/*
** C code generation for fused kernel programs (csrc/lowering/fuse.h).
**
** A kernel is `void tn_kernel(i64 rank, const i64 *sizes, void **ptrs,
** const i64 *strides)`: operands (of the group's dtype) are the group's
** inputs then its outputs;
** operand k's stride of dimension d (in elements, 0 where it broadcasts) is
** strides[k * rank + d]. The body walks the outer dimensions with an
** odometer and the innermost in TN_RT_BLOCK blocks, calling the runtime's
** primitives. The text depends only on the program, never on shapes, so
** one kernel (and one cache entry) serves every shape. No system header is
** included: the runtime's prototypes are declared in the text.
*/
#ifndef TN_CODEGEN_H
#define TN_CODEGEN_H

#include <stddef.h>

#include "../lowering/fuse.h"

/* Writes the C source of grp into *src (malloc'd, NUL-terminated; free()
** it). TN_ENOMEM. */
int tn_codegen_pointwise(const tn_fgroup *grp, char **src);

#endif /* TN_CODEGEN_H */
