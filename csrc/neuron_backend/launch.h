/*
** The launcher: how a generated kernel's call runs, split across the
** kernel threads (pool.h) along the outermost (coalesced) dimension of its
** iteration space, and the pure arithmetic the Kernel binding (kernel_py.c)
** lays a launch out with: iteration order, row runs, index range checks.
** Plain C; whoever holds a lock (a GIL) releases it around what runs on
** other threads.
*/
#ifndef TN_LAUNCH_H
#define TN_LAUNCH_H

#include <stdint.h>

#include "../graph/graph.h"

/* Most operands (inputs, then outputs) one kernel takes. */
#define TN_LAUNCH_MAX_OPERANDS 64

/* Elements per thread below which a launch stays on one thread. */
#define TN_LAUNCH_PART_ELEMENTS 16384

/* A generated kernel (codegen.h): tn_kernel(rank, sizes, ptrs, strides,
** cols, cstrides). */
typedef void (*tn_launch_fn)(int64_t rank, const int64_t *sizes, void **ptrs, const int64_t *strides, int64_t cols,
                             const int64_t *cstrides);

/* A tier-2 kernel (codegen.h): tn_kernel's arguments; returns 0 when it ran
** the call, 1 (having done nothing) for a layout it leaves to tier 1. */
typedef int (*tn_launch_fn2)(int64_t rank, const int64_t *sizes, void **ptrs, const int64_t *strides, int64_t cols,
                             const int64_t *cstrides);

/* One launch, split along the outermost (coalesced) dimension. The arrays
** are borrowed: they live as long as the launch runs. */
typedef struct tn_launch {
  tn_launch_fn la_fn;
  tn_launch_fn2 la_fn2;         /* the kernel's tier 2, tried first, or NULL */
  int la_rank, la_nops;
  const int *la_isz;            /* bytes per element of each operand */
  const int64_t *la_sizes;      /* la_rank sizes */
  void *const *la_ptrs;         /* each operand's first element */
  const int64_t *la_strides;    /* operand k's stride of dim d: la_strides[k * la_rank + d] */
  int64_t la_cols;              /* row kernels: elements of a row */
  const int64_t *la_cstrides;   /* each operand's stride along a row */
} tn_launch;

/* Sets the threads a large launch splits across (the binding checks n
** lies in [1, 64]; 1 until set). Call with no launch running. */
void tn_launch_set_threads(int n);

/* How many parts work splits into: one per per_part units of it, at most
** the threads set and most (the units it can split along), at least one. */
int tn_launch_split_parts(int64_t work, int64_t per_part, int64_t most);

/* Part `part` of nparts of n units: [*start, *end), possibly empty. */
void tn_launch_part_range(int64_t n, int part, int nparts, int64_t *start, int64_t *end);

/* Runs la over [start, start + len) of its outermost dimension (a rank-0
** launch: once, for start 0). */
void tn_launch_range(const tn_launch *la, int64_t start, int64_t len);

/* A pool job (tn_pool_run): part `part` of nparts of the launch vctx. */
void tn_launch_part(void *vctx, int part, int nparts);

/* The stride that walks dims [from, rank) of an operand (strides st, 0
** where it broadcasts) as one run, or -1 when they do not form one. */
int64_t tn_launch_run_stride(const int64_t *st, const int64_t *shape, int from, int rank);

/* Reorders the dims of a pointwise launch (shape and every operand's
** strides) so that the first output's strides decrease: a transposed
** result is then written, and its transposed inputs read, at unit stride.
** key holds that output's strides (a row of bst, copied first). */
void tn_launch_iteration_order(int64_t *shape, int64_t (*bst)[TN_MAX_RANK], int nops, int rank, const int64_t *key);

/* How a check runs its parts on threads: tn_pool_run, or a caller's
** wrapper of it (one that releases a lock around it). */
typedef int (*tn_launch_pool_fn)(void (*fn)(void *ctx, int part, int nparts), void *ctx, int nparts);

/* Whether every element of an index tensor (sizes, strides in elements,
** elements of isz bytes: int64 or int32) lies in [0, n); if not, *bad is
** the first that does not. Rows are scanned with the runtime's vectorised
** tn_rt_index_scan, a large tensor's on the kernel threads (through
** pool_run), so that checking costs a fraction of the kernel it guards. */
int tn_launch_indices_in_range(const void *data, const int64_t *sizes, const int64_t *strides, int rank, int isz,
                               int64_t n, int64_t *bad, tn_launch_pool_fn pool_run);

#endif /* TN_LAUNCH_H */
