/*
** Fusion: the graph's lowerable nodes become kernel programs (lists of
** block instructions over buffers), which csrc/neuron_backend/codegen.c
** turns into C. Two kinds of group:
**
** Pointwise groups. A node is fusable when its op has a runtime primitive
** for its dtypes, its output is contiguous (or densely permuted, of
** concrete sizes: tn_fuse_contiguous) and its scalar arguments fit
** its dtype. Dtypes: float32, float64 (computed in double), float16 and
** bfloat16 (computed in float32, rounded to their dtype after every op, as
** eager stores each op's result),
** integers (computed in int64, wrapped to their width where a reader needs
** the value: emit_wrap in fuse.c), bool (bytes of 0 or 1). A node computes in its output's dtype (its inputs
** cast to it, as torch's promotion did; the graph says which), comparisons
** in their inputs' one dtype. A factory (scalar_tensor, full) whose users
** are all in one group, and take their shape from other operands, becomes
** a constant of that group. A
** gather (embedding, index_select along dim 0) of whole rows of a table of
** rank >= 2 by an int64/int32 index becomes a load of those rows: the
** table and the index are operands of the kernel (never computed in the
** group), the row of each outer position picked when the kernel gets
** there; the caller checks the indices first and gives the operands'
** shapes as the broadcast needs them (tn_codegen_kernel documents it). An
** element gather (aten.gather(self, dim, index), int64 index of self's
** rank) is a load too: each element from the place its index picks along
** dim (fg_gather_dim), the table's stride there passed as its cst. It
** joins the group of one of its producers when it has that group's
** iteration shape and every input it takes from outside the group exists
** before the group's first node: a group then runs as one unit at the place
** of its first node. Groups of a single node are dropped (eager's
** vectorised kernel is as good), but one whose result only a cat reads:
** the back end has it write into the cat's result. A group's iteration shape is the broadcast
** of its external inputs, so kernels take sizes at run time and one kernel
** serves every shape.
**
** GEMM groups. A float32 mm or addmm (alpha = beta = 1) of matrices takes
** in the pointwise groups that consume its result (same rule as norms):
** the launcher multiplies with BLAS, and the kernel is the epilogue
** (bias, activation, residual add) over the product. A plain mm is a
** group of its own: its product is the result.
**
** Row groups. A reduction or norm over the trailing dims of its input
** (softmax, log_softmax, layer norm, sum, mean, amax, amin, var, logsumexp)
** runs as a kernel over rows: the pointwise group that produces its input
** joins it as a prologue and, for norms, the pointwise groups that consume
** its result join as an epilogue (same rule: their outside inputs exist
** before the group starts). The program's per-row scalars (REDUCE results
** and arithmetic on them) split it into phases, each one pass over the row
** in blocks; whatever a later pass needs is recomputed from the inputs, so
** no row is ever held whole. argmax and argmin over the last dim (or all
** dims) are row kernels of their own, also without row groups: eager's
** are several times slower than its max (program LOAD, REDUCE ARGMAX or
** ARGMIN, SSTORE of an int64 index; codegen gives them their own body).
*/
#ifndef TN_FUSE_H
#define TN_FUSE_H

#include <stdint.h>

#include "../graph/graph.h"

/* Instruction kinds of a kernel program. */
#define TN_FI_LOAD   1  /* buf[dst] <- external input fi_a; with fi_b >= 0, from the rows that
                         ** index operand fi_b picks (a gather) */
#define TN_FI_CONST  2  /* buf[dst] <- fi_value in every lane (once per kernel) */
#define TN_FI_UNARY  3  /* buf[dst] <- op(buf[a]) */
#define TN_FI_BINARY 4  /* buf[dst] <- op(buf[a], buf[b]) */
#define TN_FI_STORE  5  /* output fi_dst <- buf[a] */
/* row groups only: r[] are per-row float scalars */
#define TN_FI_REDUCE  6  /* r[dst] <- reduction fi_op (TN_RT_R_*) of buf[a] over the row */
#define TN_FI_SPLAT   7  /* buf[dst] <- r[a] in every lane */
#define TN_FI_SCONST  8  /* r[dst] <- fi_value */
#define TN_FI_SCOLS   9  /* r[dst] <- elements per row */
#define TN_FI_SUNARY  10 /* r[dst] <- op(r[a]) */
#define TN_FI_SBINARY 11 /* r[dst] <- op(r[a], r[b]) */
#define TN_FI_SSTORE  12 /* output fi_dst (one element per row) <- r[a] */
/* pointwise groups only */
#define TN_FI_COMPARE 13 /* buf[dst] (bool) <- comparison fi_op (TN_RT_C_*) of buf[a] and buf[b] */
#define TN_FI_WHERE   14 /* buf[dst] <- buf[a] (bool) ? buf[b] : buf[c] */
#define TN_FI_CAST    15 /* buf[dst] <- buf[a] converted from its dtype to buf[dst]'s (tn_rt_cast) */

/* fg_gather of an index operand. */
#define TN_FG_INDEX (-2)

/* Shapes of a group's outputs. */
#define TN_FO_FULL    0  /* the iteration shape */
#define TN_FO_KEEPDIM 1  /* the iteration shape with the reduced dims 1 */
#define TN_FO_ROW     2  /* the iteration shape without the reduced dims */

typedef struct tn_finst {
  int fi_kind;
  int fi_op;        /* runtime op number (runtime.h) */
  int32_t fi_dst, fi_a, fi_b, fi_c;
  double fi_value;
} tn_finst;

typedef struct tn_fgroup {
  int32_t *fg_nodes;       /* graph node ids, in graph order */
  uint32_t fg_nnodes;
  int32_t *fg_inputs;      /* external tensor values, operand order */
  uint32_t fg_ninputs;
  int32_t *fg_gather;      /* per input: -1, or for a gather's table the operand of its index (the
                           ** next one), or TN_FG_INDEX for that index (not loaded as a block) */
  int32_t *fg_gather_dim;  /* per input: for the table of an element gather (aten.gather) the dim its
                           ** index picks along; -1 otherwise (whole rows, or no gather) */
  int32_t *fg_donor;       /* per output: the input whose buffer it may be written into, or -1. A donor
                           ** is another group's contiguous result of the output's dtype and shape that
                           ** only this group reads: its last use. Its loads copy, never alias. */
  int32_t *fg_into_cat;    /* per output of a pointwise group: the cat whose result it is written into
                           ** (the cat's value), or -1; then fg_into_dim, fg_into_off: the slice along
                           ** that dim, from that offset, it fills (its donor is then -1) */
  int32_t *fg_into_dim;
  int64_t *fg_into_off;
  int32_t *fg_outputs;     /* values the group materialises, operand order after the inputs */
  uint32_t fg_noutputs;
  uint8_t *fg_out_kinds;   /* TN_FO_* per output */
  int fg_dtype;            /* row and GEMM groups: of every operand (float32, float16 or bfloat16) */
  uint8_t *fg_odtypes;     /* dtype of each operand (inputs, then outputs) */
  uint8_t *fg_bdtypes;     /* dtype of each buffer's values: its block holds them as float (float32,
                           ** float16, bfloat16), double (float64), int64 (integers) or bytes (bool) */
  int fg_reduce_dims;      /* row groups: trailing dims that form a row; 0 for pointwise */
  int fg_nonempty;         /* rows must not be empty (amax/amin raise on empty in eager) */
  int32_t fg_gemm_a, fg_gemm_b; /* GEMM groups: the matrices (else -1); fg_inputs[0] is then their
                                 ** product, computed by the launcher and loaded as operand 0 */
  tn_finst *fg_prog;       /* loads, consts, ops, reductions, stores */
  uint32_t fg_nprog;
  uint32_t fg_nbufs;
  uint32_t fg_nscalars;
} tn_fgroup;

typedef struct tn_fusion tn_fusion;

/* Whether the lowering turns op into generated code (else its nodes run
** through PyTorch): the registry behind torchneuron_jit.lowered_ops(). */
int tn_fuse_lowers(int op);

/* Whether m is row-major contiguous (a stride tracked as a constant
** times at most one symbol; one that cannot be verified is not). Group
** outputs that are not are dense in a permuted order with concrete strides
** (a transposed input's elementwise result), which the kernel's caller
** allocates as the graph says. */
int tn_fuse_contiguous(const tn_meta *m);

/* Whether m has a symbolic size or stride, no dim of concrete size 0 or 1,
** is not row-major contiguous, and is dense in some order of its dims with
** strides that follow from its sizes (a transposed input's elementwise
** result in a dynamic variant).
** Then sets pos[d] (m->me_rank entries) to dim d's place in that order,
** innermost 0: a kernel's caller allocates the output with the strides
** the sizes of the call give (out_strides entry -1 - pos[d]). */
int tn_fuse_dense_order(const tn_meta *m, int8_t *pos);

/* Flags of tn_fuse_graph. */
#define TN_FUSE_ROWS 1  /* form row groups (else reductions stay with eager) */
#define TN_FUSE_GEMM 2  /* form GEMM groups: mm / addmm / bmm / baddbmm with their pointwise epilogue */
#define TN_FUSE_LINEAR_ACT 4 /* leave the relu / gelu that alone reads a float32 aten.linear (TN_OP_linear,
                              ** not lowered) out of groups: oneDNN takes it into the GEMM (torchneuron_jit/gemm.py) */
#define TN_FUSE_AUTO_ROWS 8 /* row_fusion=auto's rows (fuse.c rows_auto): a reduction whose rows are not one
                             ** unit-stride run of its input (channels-last over H and W), and a row op that sums
                             ** (all but amax, amin) values of float16/bfloat16 or computed from them, stay with
                             ** eager's kernels */

/* Finds the pointwise groups of g and, with TN_FUSE_ROWS, its row groups: those whose rows are known to hold
** min_row elements or more (0: all; shorter rows stay with eager's kernels). The result lives in a mimalloc heap
** of its own, which belongs to the calling thread. TN_ENOMEM. */
int tn_fuse_graph(const tn_graph *g, int flags, int64_t min_row, tn_fusion **out);

uint32_t tn_fusion_count(const tn_fusion *f);
const tn_fgroup *tn_fusion_group(const tn_fusion *f, uint32_t i);

/* Frees f (from the thread that made it). NULL is fine. */
void tn_fusion_free(tn_fusion *f);

#endif /* TN_FUSE_H */
