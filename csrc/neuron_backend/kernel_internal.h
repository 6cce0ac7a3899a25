/*
** What the Kernel binding's files share (kernel_py.c: the Kernel type,
** gemm_py.c: the call of a GEMM kernel): a kernel's layout and a prepared
** launch.
*/
#ifndef TN_KERNEL_INTERNAL_H
#define TN_KERNEL_INTERNAL_H

#include "../tn_py.h"

#include "../graph/graph.h"
#include "launch.h"
#include "tcc.h"
#include "tier2.h"

/* An input read as a view of the tensor passed: the layout that tensor must
** have (its sizes, and its strides where a size is not 1), and the view's
** sizes, strides and offset (elements from the tensor's first). */
typedef struct kernel_view {
  int kv_on;
  int kv_brank, kv_rank;
  int64_t kv_bsizes[TN_MAX_RANK], kv_bstrides[TN_MAX_RANK];
  int64_t kv_sizes[TN_MAX_RANK], kv_strides[TN_MAX_RANK];
  int64_t kv_offset;
} kernel_view;

/* A compiled kernel: an instance of _C.Kernel. */
typedef struct {
  PyObject_HEAD
  tn_tcc_unit *ke_unit;
  tn_launch_fn ke_fn;
  int ke_ninputs, ke_noutputs;
  int ke_isz[TN_LAUNCH_MAX_OPERANDS]; /* bytes per element of each operand */
  int ke_rdims;          /* row kernels: trailing dims that form a row; else 0 */
  int ke_nonempty;       /* raise (as eager does) when rows are empty */
  int ke_gemm;           /* called with (a, b, rest...): the kernel gets (a @ b, rest...) */
  int ke_epilogue;       /* GEMM kernels: 0 when the product itself is the one output */
  uint8_t ke_out_kinds[TN_LAUNCH_MAX_OPERANDS]; /* TN_FO_* */
  PyObject *ke_empty;    /* torch.empty */
  PyObject *ke_dtypes;   /* tuple: each operand's torch dtype */
  PyObject *ke_empty_kws; /* tuple: {"dtype": d} of each output, for ke_empty */
  PyObject *ke_out_strides; /* tuple: per output, None (contiguous) or its strides (pointwise kernels) */
  PyObject *ke_empty_strided; /* torch.empty_strided, when some output has strides */
  int ke_strided;         /* whether some output has strides */
  int ke_ngathers;        /* gathered tables: (table operand, index operand, dim or -1 for rows) */
  int ke_gather[TN_LAUNCH_MAX_OPERANDS][3];
  kernel_view *ke_views;  /* per input, or NULL when every input is read as passed */
  int ke_donor[TN_LAUNCH_MAX_OPERANDS]; /* per output: the input whose tensor it may take (its last use), or -1 */
  int ke_ninto;           /* outputs written into tensors passed after the inputs (a cat's buffer) */
  int ke_into_dim[TN_LAUNCH_MAX_OPERANDS]; /* per output: the dim it is a slice of that tensor along, or -1 */
  int64_t ke_into_off[TN_LAUNCH_MAX_OPERANDS]; /* ... and the slice's offset there */
  PyObject *ke_source;   /* str */
  PyObject *ke_tier2_source; /* str, or NULL where tier 2 writes no such kernel */
  tn_tier2_obj *ke_t2;    /* its compiled tier 2 once loaded (never replaced: launches may be running it) */
  tn_launch_fn2 ke_fn2;   /* ... and its tn_kernel2, or NULL */
  int64_t ke_calls;       /* launches prepared */
  int ke_t2_asked;        /* whether tn_py_tier2_hook was called for it */
} KernelObject;

/* What a kernel with a tier-2 source calls when it has been prepared
** config.tier2_after_calls times: fn(kernel), which compiles or loads its
** tier 2 (at once or in the background); None until set
** (_C.set_tier2_hook). Owned here. */
extern PyObject *tn_py_tier2_hook;

/* A launch, ready to run: its operands read, its outputs allocated. */
typedef struct kernel_prepared {
  tn_launch pr_la;
  int pr_rank;                  /* of the iteration space, before coalescing */
  int64_t pr_shape[TN_MAX_RANK]; /* the iteration space */
  int64_t pr_numel;             /* elements of the iteration space */
  int pr_run;                   /* whether there is anything to compute */
  int64_t pr_csizes[TN_MAX_RANK];
  int64_t pr_st[TN_LAUNCH_MAX_OPERANDS * TN_MAX_RANK], pr_cst[TN_LAUNCH_MAX_OPERANDS];
  void *pr_ptrs[TN_LAUNCH_MAX_OPERANDS];
  PyObject *pr_held; /* operands copied for the launch, or NULL */
} kernel_prepared;

/* The interned name "data_ptr" (made at module init). */
extern PyObject *tn_py_str_data_ptr;

/* Reads tensor t's shape, stride and data pointer; t is input i of the
** call and must be of the dtype of kernel operand op. 0, or -1 with an
** exception set (TypeError: another dtype). */
int tn_py_kernel_read_tensor(KernelObject *k, PyObject *t, int i, int op, int64_t *sizes, int64_t *strides,
                             int *rank, void **data);

/* Reads k's input tensors (args), allocates its outputs and fills p.
** Returns the tuple of outputs (new reference) or NULL with an exception
** set; either way the caller releases p->pr_held. */
PyObject *tn_py_kernel_prepare(KernelObject *k, PyObject *args, kernel_prepared *p);

/* Runs a prepared launch, split across threads (without the GIL) when it
** is large. Call with the GIL held. */
void tn_py_kernel_execute(const kernel_prepared *p);

/* A GEMM kernel's call (gemm_py.c): the product of args[0] and args[1],
** then the epilogue over (product, args[2:]). Returns the tuple of
** outputs (new reference) or NULL with an exception set. */
PyObject *tn_py_gemm_run(KernelObject *k, PyObject *args);

#endif /* TN_KERNEL_INTERNAL_H */
