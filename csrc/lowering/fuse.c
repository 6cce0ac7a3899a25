/*
** Pointwise and row fusion (see fuse.h).
*/
#include "fuse.h"

#include <math.h>
#include <mimalloc.h>
#include <string.h>

#include "../neuron_backend/launch.h"
#include "../neuron_backend/runtime.h"

struct tn_fusion {
  mi_heap_t *fu_heap;
  tn_fgroup *fu_groups;
  uint32_t fu_ngroups;
};

/* -- What each op becomes ------------------------------------------------- */

#define FK_NONE 0
#define FK_UNARY 1     /* op(self) */
#define FK_BINARY 2    /* op(self, other) on tensors; add/sub take alpha */
#define FK_SCALAR 3    /* op(self, scalar); add/sub.Scalar take alpha */
#define FK_GELU 4      /* unary by approximate string */
#define FK_CLAMP 5     /* clamp(self, min?, max?) with scalars */
#define FK_COMPARE 6   /* comparison fr_op (TN_RT_C_*) of two tensors: bool */
#define FK_COMPARE_S 7 /* comparison of a tensor with a scalar: bool */
#define FK_WHERE 8     /* where.self(condition, self, other) */
#define FK_MASKED 9    /* masked_fill.Scalar / .Tensor(self, mask, value) */
#define FK_CAST 10     /* _to_copy: a cast (or a copy) */
#define FK_FACTORY 11  /* scalar_tensor / full: a constant */
#define FK_GATHER 12   /* embedding / index_select(dim 0): rows of a table picked by an index tensor */

typedef struct fuse_rule {
  int fr_kind;
  int fr_op;
} fuse_rule;

static fuse_rule fuse_rule_of(int op)
{
  switch (op) {
  case TN_OP_neg: return (fuse_rule){FK_UNARY, TN_RT_NEG};
  case TN_OP_abs: return (fuse_rule){FK_UNARY, TN_RT_ABS};
  case TN_OP_exp: return (fuse_rule){FK_UNARY, TN_RT_EXP};
  case TN_OP_log: return (fuse_rule){FK_UNARY, TN_RT_LOG};
  case TN_OP_log1p: return (fuse_rule){FK_UNARY, TN_RT_LOG1P};
  case TN_OP_expm1: return (fuse_rule){FK_UNARY, TN_RT_EXPM1};
  case TN_OP_sqrt: return (fuse_rule){FK_UNARY, TN_RT_SQRT};
  case TN_OP_rsqrt: return (fuse_rule){FK_UNARY, TN_RT_RSQRT};
  case TN_OP_reciprocal: return (fuse_rule){FK_UNARY, TN_RT_RECIPROCAL};
  case TN_OP_floor: return (fuse_rule){FK_UNARY, TN_RT_FLOOR};
  case TN_OP_ceil: return (fuse_rule){FK_UNARY, TN_RT_CEIL};
  case TN_OP_trunc: return (fuse_rule){FK_UNARY, TN_RT_TRUNC};
  case TN_OP_round: return (fuse_rule){FK_UNARY, TN_RT_ROUND};
  case TN_OP_sign: return (fuse_rule){FK_UNARY, TN_RT_SIGN};
  case TN_OP_relu: return (fuse_rule){FK_UNARY, TN_RT_RELU};
  case TN_OP_sigmoid: return (fuse_rule){FK_UNARY, TN_RT_SIGMOID};
  case TN_OP_tanh: return (fuse_rule){FK_UNARY, TN_RT_TANH};
  case TN_OP_silu: return (fuse_rule){FK_UNARY, TN_RT_SILU};
  case TN_OP_erf: return (fuse_rule){FK_UNARY, TN_RT_ERF};
  case TN_OP_sin: return (fuse_rule){FK_UNARY, TN_RT_SIN};
  case TN_OP_cos: return (fuse_rule){FK_UNARY, TN_RT_COS};
  case TN_OP_logical_not: return (fuse_rule){FK_UNARY, TN_RT_LNOT};
  case TN_OP_gelu: return (fuse_rule){FK_GELU, 0};
  case TN_OP_add_Tensor: return (fuse_rule){FK_BINARY, TN_RT_B_ADD};
  case TN_OP_sub_Tensor: return (fuse_rule){FK_BINARY, TN_RT_B_SUB};
  case TN_OP_mul_Tensor: return (fuse_rule){FK_BINARY, TN_RT_B_MUL};
  case TN_OP_div_Tensor: return (fuse_rule){FK_BINARY, TN_RT_B_DIV};
  case TN_OP_maximum: return (fuse_rule){FK_BINARY, TN_RT_B_MAXIMUM};
  case TN_OP_minimum: return (fuse_rule){FK_BINARY, TN_RT_B_MINIMUM};
  case TN_OP_pow_Tensor_Tensor: return (fuse_rule){FK_BINARY, TN_RT_B_POW};
  case TN_OP_logical_and: return (fuse_rule){FK_BINARY, TN_RT_B_LAND};
  case TN_OP_logical_or: return (fuse_rule){FK_BINARY, TN_RT_B_LOR};
  case TN_OP_bitwise_and_Tensor: return (fuse_rule){FK_BINARY, TN_RT_B_BAND};
  case TN_OP_bitwise_or_Tensor: return (fuse_rule){FK_BINARY, TN_RT_B_BOR};
  case TN_OP_bitwise_xor_Tensor: return (fuse_rule){FK_BINARY, TN_RT_B_BXOR};
  case TN_OP_bitwise_not: return (fuse_rule){FK_UNARY, TN_RT_BNOT};
  case TN_OP_bitwise_and_Scalar: return (fuse_rule){FK_SCALAR, TN_RT_B_BAND};
  case TN_OP_bitwise_or_Scalar: return (fuse_rule){FK_SCALAR, TN_RT_B_BOR};
  case TN_OP_bitwise_xor_Scalar: return (fuse_rule){FK_SCALAR, TN_RT_B_BXOR};
  case TN_OP_add_Scalar: return (fuse_rule){FK_SCALAR, TN_RT_B_ADD};
  case TN_OP_sub_Scalar: return (fuse_rule){FK_SCALAR, TN_RT_B_SUB};
  case TN_OP_mul_Scalar: return (fuse_rule){FK_SCALAR, TN_RT_B_MUL};
  case TN_OP_div_Scalar: return (fuse_rule){FK_SCALAR, TN_RT_B_DIV};
  case TN_OP_pow_Tensor_Scalar: return (fuse_rule){FK_SCALAR, TN_RT_B_POW};
  case TN_OP_clamp_min: return (fuse_rule){FK_SCALAR, TN_RT_B_CLAMP_MIN};
  case TN_OP_clamp_max: return (fuse_rule){FK_SCALAR, TN_RT_B_CLAMP_MAX};
  case TN_OP_clamp: return (fuse_rule){FK_CLAMP, 0};
  case TN_OP_eq_Tensor: return (fuse_rule){FK_COMPARE, TN_RT_C_EQ};
  case TN_OP_ne_Tensor: return (fuse_rule){FK_COMPARE, TN_RT_C_NE};
  case TN_OP_lt_Tensor: return (fuse_rule){FK_COMPARE, TN_RT_C_LT};
  case TN_OP_le_Tensor: return (fuse_rule){FK_COMPARE, TN_RT_C_LE};
  case TN_OP_gt_Tensor: return (fuse_rule){FK_COMPARE, TN_RT_C_GT};
  case TN_OP_ge_Tensor: return (fuse_rule){FK_COMPARE, TN_RT_C_GE};
  case TN_OP_eq_Scalar: return (fuse_rule){FK_COMPARE_S, TN_RT_C_EQ};
  case TN_OP_ne_Scalar: return (fuse_rule){FK_COMPARE_S, TN_RT_C_NE};
  case TN_OP_lt_Scalar: return (fuse_rule){FK_COMPARE_S, TN_RT_C_LT};
  case TN_OP_le_Scalar: return (fuse_rule){FK_COMPARE_S, TN_RT_C_LE};
  case TN_OP_gt_Scalar: return (fuse_rule){FK_COMPARE_S, TN_RT_C_GT};
  case TN_OP_ge_Scalar: return (fuse_rule){FK_COMPARE_S, TN_RT_C_GE};
  case TN_OP_where_self: return (fuse_rule){FK_WHERE, 0};
  case TN_OP_masked_fill_Scalar: case TN_OP_masked_fill_Tensor: return (fuse_rule){FK_MASKED, 0};
  case TN_OP_to_copy: return (fuse_rule){FK_CAST, 0};
  case TN_OP_scalar_tensor: case TN_OP_full: return (fuse_rule){FK_FACTORY, 0};
  case TN_OP_embedding: case TN_OP_index_select: case TN_OP_gather: return (fuse_rule){FK_GATHER, 0};
  default: return (fuse_rule){FK_NONE, 0};
  }
}

/* Ops that anchor a row group. */
static int row_op(int op)
{
  switch (op) {
  case TN_OP_softmax: case TN_OP_log_softmax: case TN_OP_native_layer_norm:
  case TN_OP_sum: case TN_OP_sum_dim_IntList: case TN_OP_mean: case TN_OP_mean_dim:
  case TN_OP_amax: case TN_OP_amin: case TN_OP_var_correction: case TN_OP_logsumexp:
    return 1;
  default:
    return 0;
  }
}

int tn_fuse_lowers(int op)
{
  return fuse_rule_of(op).fr_kind != FK_NONE || row_op(op) || op == TN_OP_mm || op == TN_OP_addmm ||
         op == TN_OP_bmm || op == TN_OP_baddbmm || op == TN_OP_argmax || op == TN_OP_argmin;
}

/* A finite number argument, or NONE (for clamp's optional bounds). */
static int arg_number(const tn_arg *a, double *out)
{
  switch (a->ar_tag) {
  case TN_ARG_INT: case TN_ARG_BOOL: *out = (double)a->u.ar_int; return isfinite(*out);
  case TN_ARG_FLOAT: *out = a->u.ar_float; return isfinite(*out);
  default: return 0;
  }
}

/* Whether m is row-major contiguous (an empty tensor always is). The
** expected stride is tracked as exp_val * s[exp_sym] (one symbol at most),
** which covers dynamic batch and sequence sizes; a stride that cannot be
** verified counts as not contiguous. */
static int meta_contiguous_from(const tn_meta *m, int first)
{
  int64_t exp_val = 1;
  int32_t exp_sym = -1;
  for (int d = 0; d < m->me_rank; d++)
    if (m->me_sizes[d].si_sym < 0 && m->me_sizes[d].si_val == 0)
      return 1; /* no elements: contiguous whatever the strides (as torch says) */
  for (int d = m->me_rank - 1; d >= first; d--) {
    tn_sint size = m->me_sizes[d], st = m->me_strides[d];
    if (size.si_sym < 0 && size.si_val == 1)
      continue; /* any stride will do */
    if (exp_sym < 0 ? (st.si_sym >= 0 || st.si_val != exp_val)
                    : (st.si_sym != exp_sym || (st.si_val ? st.si_val : 1) != exp_val))
      return 0;
    if (size.si_sym < 0) {
      if (size.si_val != 0 && exp_val > INT64_MAX / size.si_val)
        return 0;
      exp_val *= size.si_val;
    } else if (exp_sym < 0) {
      exp_sym = size.si_sym;
    } else if (d > 0) {
      return 0; /* a product of two symbols: not representable here */
    }
  }
  return 1;
}

static int meta_contiguous(const tn_meta *m)
{
  return meta_contiguous_from(m, 0);
}

int tn_fuse_contiguous(const tn_meta *m)
{
  return meta_contiguous(m);
}

/* Whether m is dense and non-overlapping in some order of its dims (a
** permuted layout, as eager's pointwise ops give a transposed input's
** result), its sizes and strides concrete: a kernel can write it in place. */
static int meta_dense(const tn_meta *m)
{
  int64_t need = 1;
  uint64_t used = 0;
  for (int d = 0; d < m->me_rank; d++)
    if (m->me_sizes[d].si_sym >= 0 || m->me_strides[d].si_sym >= 0)
      return 0;
  for (int d = 0; d < m->me_rank; d++)
    if (m->me_sizes[d].si_val == 0)
      return 1;
  /* the dims with more than one element, innermost first, each stepping
  ** over exactly the ones inside it */
  for (;;) {
    int best = -1;
    for (int d = 0; d < m->me_rank; d++)
      if (!(used >> d & 1) && m->me_sizes[d].si_val > 1 && m->me_strides[d].si_val == need)
        best = d;
    if (best < 0)
      break;
    used |= 1ull << best;
    if (need > INT64_MAX / m->me_sizes[best].si_val)
      return 0;
    need *= m->me_sizes[best].si_val;
  }
  for (int d = 0; d < m->me_rank; d++)
    if (!(used >> d & 1) && m->me_sizes[d].si_val > 1)
      return 0;
  return 1;
}

/* Whether stride st is val * s[sym] (sym < 0: the number val). */
static int sint_is(tn_sint st, int64_t val, int32_t sym)
{
  return sym < 0 ? st.si_sym < 0 && st.si_val == val : st.si_sym == sym && (st.si_val ? st.si_val : 1) == val;
}

/* Whether m, of some symbolic size, is dense and non-overlapping in some
** order of its dims (a transposed input's elementwise result in a dynamic
** variant), each stride the product of the sizes inside it: a constant
** times at most one symbol, as meta_contiguous_from tracks it. The strides
** follow from the sizes at run time: sets pos[d] to the place of dim d,
** innermost 0 (tn_fuse_dense_order). A concrete size 0 or 1 is not taken:
** the symbolic trace's stride of a dim of one element is not always
** eager's (eager's follows the inputs' strides), and a later op of
** PyTorch's reads it (a cat of two such parts came back channels_last). */
static int meta_dense_order(const tn_meta *m, int8_t *pos)
{
  int64_t val = 1;
  int32_t sym = -1;
  uint64_t used = 0;
  for (int d = 0; d < m->me_rank; d++)
    if (m->me_sizes[d].si_sym < 0 && m->me_sizes[d].si_val <= 1)
      return 0;
  for (int k = 0; k < m->me_rank; k++) {
    int best = -1;
    for (int d = 0; d < m->me_rank && best < 0; d++)
      if (!(used >> d & 1) && sint_is(m->me_strides[d], val, sym))
        best = d;
    if (best < 0)
      return 0;
    used |= 1ull << best;
    pos[best] = (int8_t)k;
    tn_sint size = m->me_sizes[best];
    if (size.si_sym < 0) {
      if (__builtin_mul_overflow(val, size.si_val, &val))
        return 0;
    } else if (sym < 0) {
      sym = size.si_sym;
    } else if (k + 1 < m->me_rank) {
      return 0; /* a product of two symbols: not representable here */
    }
  }
  return 1;
}

int tn_fuse_dense_order(const tn_meta *m, int8_t *pos)
{
  int concrete = 1;
  for (int d = 0; d < m->me_rank; d++)
    concrete &= m->me_sizes[d].si_sym < 0 && m->me_strides[d].si_sym < 0;
  return !concrete && !meta_contiguous(m) && meta_dense_order(m, pos);
}

/* Whether a and b have the same sizes (the same iteration space). */
static int same_space(const tn_meta *a, const tn_meta *b)
{
  if (a->me_rank != b->me_rank)
    return 0;
  for (int d = 0; d < a->me_rank; d++)
    if (a->me_sizes[d].si_val != b->me_sizes[d].si_val || a->me_sizes[d].si_sym != b->me_sizes[d].si_sym)
      return 0;
  return 1;
}

/* -- Dtypes --------------------------------------------------------------- */

/* What a dtype's blocks hold: float (float32, float16, bfloat16), double,
** int64 (integers), bytes (bool), or nothing we compute (DC_NONE). */
#define DC_NONE 0
#define DC_FLOAT 1
#define DC_DOUBLE 2
#define DC_INT 3
#define DC_BOOL 4

static int dtype_class(int dt)
{
  switch (dt) {
  case TN_DTYPE_FLOAT32: case TN_DTYPE_FLOAT16: case TN_DTYPE_BFLOAT16: return DC_FLOAT;
  case TN_DTYPE_FLOAT64: return DC_DOUBLE;
  case TN_DTYPE_UINT8: case TN_DTYPE_INT8: case TN_DTYPE_INT16: case TN_DTYPE_INT32: case TN_DTYPE_INT64:
    return DC_INT;
  case TN_DTYPE_BOOL: return DC_BOOL;
  default: return DC_NONE;
  }
}

static int float_dtype(int dt)
{
  return dtype_class(dt) == DC_FLOAT;
}

/* float16 and bfloat16: computed in float32, so values may need rounding. */
static int narrow_float(int dt)
{
  return dt == TN_DTYPE_FLOAT16 || dt == TN_DTYPE_BFLOAT16;
}

/* The range of an integer dtype (bool: 0..1; int64: what a double holds
** exactly, the constants' carrier). */
static void int_range(int dt, double *lo, double *hi)
{
  switch (dt) {
  case TN_DTYPE_BOOL: *lo = 0; *hi = 1; break;
  case TN_DTYPE_UINT8: *lo = 0; *hi = 255; break;
  case TN_DTYPE_INT8: *lo = -128; *hi = 127; break;
  case TN_DTYPE_INT16: *lo = -32768; *hi = 32767; break;
  case TN_DTYPE_INT32: *lo = -2147483648.0; *hi = 2147483647.0; break;
  default: *lo = -0x1p53; *hi = 0x1p53; break;
  }
}

/* Whether every value of dtype `from` is one of dtype `to` in the same
** blocks (so a conversion is no work): float16/bfloat16 to float32,
** narrower integers to wider ones. */
static int widens(int to, int from)
{
  double flo, fhi, tlo, thi;
  if (to == TN_DTYPE_FLOAT32)
    return narrow_float(from);
  if (dtype_class(to) != DC_INT || dtype_class(from) != DC_INT)
    return 0;
  int_range(from, &flo, &fhi);
  int_range(to, &tlo, &thi);
  return to == TN_DTYPE_INT64 || (flo >= tlo && fhi <= thi);
}

/* A number argument of any value (a double holds it exactly). */
static int arg_scalar(const tn_arg *a, double *out)
{
  switch (a->ar_tag) {
  case TN_ARG_INT: case TN_ARG_BOOL:
    *out = (double)a->u.ar_int;
    return a->u.ar_int >= -(INT64_C(1) << 53) && a->u.ar_int <= (INT64_C(1) << 53);
  case TN_ARG_FLOAT: *out = a->u.ar_float; return 1;
  default: return 0;
  }
}

/* Whether v, the scalar of an op computing in dtype dt, is one we compute
** as eager does: an integer within the range of an integer dtype; for
** floats any finite number, or any number at all with nonfinite (values
** eager stores: they must not overflow dt). */
static int scalar_fits(int dt, double v, int nonfinite)
{
  double lo, hi;
  if (dtype_class(dt) != DC_INT && dt != TN_DTYPE_BOOL)
    return nonfinite ? !(isfinite(v) && !isfinite(tn_rt_round(dt, v))) : isfinite(v);
  int_range(dt, &lo, &hi);
  return v == floor(v) && v >= lo && v <= hi;
}

/* Whether a is a scalar argument that fits dt (scalar_fits); NONE passes
** when optional. */
static int arg_fits(const tn_arg *a, int dt, int nonfinite, int optional)
{
  double v;
  if (a->ar_tag == TN_ARG_NONE)
    return optional;
  return arg_scalar(a, &v) && scalar_fits(dt, v, nonfinite);
}

/* Whether the op of rule r computes in dtype dt: floats have every op but
** the bitwise ones; integers the ring and bitwise ops, abs, relu, sign,
** the roundings, max/min and clamps; bool the logical and bitwise ops,
** max/min. Every dtype has selections, casts, constants and gathers;
** comparisons give bool. */
static int rule_fits_dtype(fuse_rule r, int dt)
{
  int logical = (r.fr_kind == FK_UNARY && r.fr_op == TN_RT_LNOT) ||
                (r.fr_kind == FK_BINARY && (r.fr_op == TN_RT_B_LAND || r.fr_op == TN_RT_B_LOR));
  int bitwise = (r.fr_kind == FK_UNARY && r.fr_op == TN_RT_BNOT) ||
                ((r.fr_kind == FK_BINARY || r.fr_kind == FK_SCALAR) && r.fr_op >= TN_RT_B_BAND &&
                 r.fr_op <= TN_RT_B_BXOR);
  if (logical || r.fr_kind == FK_COMPARE || r.fr_kind == FK_COMPARE_S)
    return dt == TN_DTYPE_BOOL;
  if (bitwise) /* integers and bool (torch has no float bitwise ops) */
    return dtype_class(dt) == DC_INT || dt == TN_DTYPE_BOOL;
  if (dt == TN_DTYPE_BOOL) /* max / min, selections, casts, constants, gathers */
    return r.fr_kind == FK_WHERE || r.fr_kind == FK_MASKED || r.fr_kind == FK_CAST || r.fr_kind == FK_FACTORY ||
           r.fr_kind == FK_GATHER ||
           (r.fr_kind == FK_BINARY && (r.fr_op == TN_RT_B_MAXIMUM || r.fr_op == TN_RT_B_MINIMUM));
  if (dtype_class(dt) != DC_INT)
    return 1;
  switch (r.fr_kind) {
  case FK_UNARY:
    return r.fr_op == TN_RT_NEG || r.fr_op == TN_RT_ABS || r.fr_op == TN_RT_RELU || r.fr_op == TN_RT_SIGN ||
           r.fr_op == TN_RT_FLOOR || r.fr_op == TN_RT_CEIL || r.fr_op == TN_RT_TRUNC || r.fr_op == TN_RT_ROUND;
  case FK_BINARY: case FK_SCALAR:
    return r.fr_op == TN_RT_B_MAXIMUM || r.fr_op == TN_RT_B_MINIMUM || r.fr_op == TN_RT_B_ADD ||
           r.fr_op == TN_RT_B_SUB || r.fr_op == TN_RT_B_MUL || r.fr_op == TN_RT_B_CLAMP_MIN ||
           r.fr_op == TN_RT_B_CLAMP_MAX;
  case FK_CLAMP: case FK_WHERE: case FK_MASKED: case FK_CAST: case FK_FACTORY: case FK_GATHER:
    return 1;
  default: /* gelu */
    return 0;
  }
}

static int arg_dtype(const tn_graph *g, const tn_arg *a)
{
  return tn_graph_value(g, a->u.ar_ref)->va_meta.me_dtype;
}

/* Whether the factory n (scalar_tensor, full of any shape) is a constant
** we can make: an ordinary tensor of a dtype we compute, of a value that
** fits it. Sets *v to that value, as the dtype holds it. Its shape needs
** no operand: elementwise readers broadcast it into their own. */
static int factory_value(const tn_graph *g, const tn_node *n, double *v)
{
  if (fuse_rule_of(n->no_op).fr_kind != FK_FACTORY || n->no_nout != 1)
    return 0;
  const tn_meta *out = &tn_graph_value(g, n->no_out[0])->va_meta;
  int full = n->no_op == TN_OP_full, dt = out->me_dtype;
  const tn_arg *val = &n->no_args[full ? 1 : 0], *layout = &n->no_args[full ? 3 : 2];
  if (!dtype_class(dt) || !arg_scalar(val, v) ||
      (layout->ar_tag != TN_ARG_NONE && layout->u.ar_int != 0))
    return 0;
  if (dt == TN_DTYPE_BOOL) {
    *v = *v != 0;
    return 1;
  }
  if (!scalar_fits(dt, *v, 1))
    return 0;
  *v = tn_rt_round(dt, *v);
  return 1;
}

/* The table and index arguments of gather node n (embedding(weight,
** indices), index_select(self, 0, index), gather(self, dim, index)). */
static void gather_args(const tn_node *n, int *table, int *index)
{
  *table = 0;
  *index = n->no_op == TN_OP_embedding ? 1 : 2;
}

/* The dim an element gather (aten.gather) n picks along, from 0; -1 for
** gathers of whole rows. */
static int gather_dim(const tn_graph *g, const tn_node *n)
{
  if (n->no_op != TN_OP_gather)
    return -1;
  int r = tn_graph_value(g, n->no_args[0].u.ar_ref)->va_meta.me_rank;
  int64_t d = n->no_args[1].u.ar_int;
  return (int)(d < 0 ? d + r : d);
}

static int fusable(const tn_graph *g, const tn_node *n)
{
  fuse_rule r = fuse_rule_of(n->no_op);
  if (r.fr_kind == FK_NONE || r.fr_kind == FK_FACTORY || n->no_nout != 1)
    return 0;
  const tn_meta *out = &tn_graph_value(g, n->no_out[0])->va_meta;
  int dt = out->me_dtype;
  int8_t pos[TN_MAX_RANK];
  if (!dtype_class(dt) || !(meta_contiguous(out) || meta_dense(out) || tn_fuse_dense_order(out, pos)) ||
      !rule_fits_dtype(r, dt))
    return 0;
  for (uint32_t i = 0; i < n->no_nargs; i++)
    if (n->no_args[i].ar_tag == TN_ARG_TENSOR && (!dtype_class(arg_dtype(g, &n->no_args[i])) ||
        /* eager raises for a bool tensor in a subtraction ("Subtraction, the `-` operator, with a bool
        ** tensor is not supported"): the node is eager's, to raise as it does */
        ((r.fr_kind == FK_BINARY || r.fr_kind == FK_SCALAR) && r.fr_op == TN_RT_B_SUB &&
         arg_dtype(g, &n->no_args[i]) == TN_DTYPE_BOOL)))
      return 0;
  switch (r.fr_kind) {
  case FK_BINARY:
    return n->no_nargs < 3 || arg_fits(&n->no_args[2], dt, 0, 0);
  case FK_SCALAR:
    return arg_fits(&n->no_args[1], dt, 0, 0) && (n->no_nargs < 3 || arg_fits(&n->no_args[2], dt, 0, 0));
  case FK_CLAMP:
    return arg_fits(&n->no_args[1], dt, 0, 1) && arg_fits(&n->no_args[2], dt, 0, 1);
  case FK_GELU: { /* exact or tanh, in every float dtype */
    const tn_arg *s = &n->no_args[1];
    return s->ar_len == 4 && (memcmp(s->u.ar_str, "none", 4) == 0 || memcmp(s->u.ar_str, "tanh", 4) == 0);
  }
  case FK_COMPARE: /* in their one dtype (mixed ones would need torch's promotion) */
    return arg_dtype(g, &n->no_args[0]) == arg_dtype(g, &n->no_args[1]);
  case FK_COMPARE_S: { /* in the tensor's dtype; an integer tensor against a float compares in the
                       ** default float dtype (which the graph does not say): left to eager */
    double v;
    int t = arg_dtype(g, &n->no_args[0]);
    return arg_scalar(&n->no_args[1], &v) &&
           ((dtype_class(t) != DC_INT && t != TN_DTYPE_BOOL) || n->no_args[1].ar_tag != TN_ARG_FLOAT);
  }
  case FK_WHERE:
    return arg_dtype(g, &n->no_args[0]) == TN_DTYPE_BOOL;
  case FK_MASKED:
    if (arg_dtype(g, &n->no_args[1]) != TN_DTYPE_BOOL)
      return 0;
    if (n->no_op == TN_OP_masked_fill_Tensor) /* eager raises unless value is 0-dim */
      return tn_graph_value(g, n->no_args[2].u.ar_ref)->va_meta.me_rank == 0;
    return dt == TN_DTYPE_BOOL ? arg_fits(&n->no_args[2], TN_DTYPE_BOOL, 0, 0) : arg_fits(&n->no_args[2], dt, 1, 0);
  case FK_GATHER: { /* whole rows of a table of rank >= 2 (a row per outer position of the kernel) */
    int t, i;
    gather_args(n, &t, &i);
    const tn_meta *tm = &tn_graph_value(g, n->no_args[t].u.ar_ref)->va_meta;
    int idt = arg_dtype(g, &n->no_args[i]);
    if (n->no_op == TN_OP_gather) { /* an element per index element, along one dim of a table of its rank */
      int64_t d = n->no_args[1].u.ar_int;
      const tn_meta *im = &tn_graph_value(g, n->no_args[2].u.ar_ref)->va_meta;
      return tm->me_rank >= 1 && im->me_rank == tm->me_rank && d >= -tm->me_rank && d < tm->me_rank &&
             idt == TN_DTYPE_INT64 && !(n->no_args[3].ar_tag == TN_ARG_BOOL && n->no_args[3].u.ar_int) &&
             meta_contiguous(out);
    }
    if (n->no_op == TN_OP_index_select &&
        (n->no_args[1].u.ar_int != 0 || tn_graph_value(g, n->no_args[2].u.ar_ref)->va_meta.me_rank != 1))
      return 0;
    return tm->me_rank >= 2 && (idt == TN_DTYPE_INT64 || idt == TN_DTYPE_INT32) && meta_contiguous(out);
  }
  case FK_CAST: /* a plain strided CPU tensor: no layout, device or pinning */
    return n->no_args[2].ar_tag == TN_ARG_NONE && n->no_args[3].ar_tag == TN_ARG_NONE &&
           (n->no_args[4].ar_tag == TN_ARG_NONE || n->no_args[4].u.ar_int == 0);
  default:
    return 1;
  }
}

/* Whether node n computes in one float dtype dt throughout (what row and
** GEMM groups take in: every tensor it reads and writes is of dt, its
** result contiguous). */
static int uniform_node(const tn_graph *g, const tn_node *n, int dt)
{
  int k = fuse_rule_of(n->no_op).fr_kind;
  if (k != FK_UNARY && k != FK_BINARY && k != FK_SCALAR && k != FK_GELU && k != FK_CLAMP)
    return 0;
  const tn_meta *out = &tn_graph_value(g, n->no_out[0])->va_meta;
  if (out->me_dtype != dt || !meta_contiguous(out))
    return 0;
  for (uint32_t i = 0; i < n->no_nargs; i++)
    if (n->no_args[i].ar_tag == TN_ARG_TENSOR && arg_dtype(g, &n->no_args[i]) != dt)
      return 0;
  return 1;
}


/* -- Row reductions ------------------------------------------------------- */

/* Whether a names exactly the trailing dims of a rank-r tensor (an int, an
** int list, or NONE / an empty list: every dim); sets *k to their number. */
static int trailing_dims(const tn_arg *a, int r, int *k)
{
  uint64_t seen = 0;
  if (a->ar_tag == TN_ARG_INT) {
    *k = 1;
    return a->u.ar_int == -1 || a->u.ar_int == r - 1;
  }
  if (a->ar_tag == TN_ARG_NONE || (a->ar_tag == TN_ARG_INT_LIST && a->ar_len == 0)) {
    *k = r;
    return 1;
  }
  if (a->ar_tag != TN_ARG_INT_LIST || a->ar_len > (uint32_t)r)
    return 0;
  for (uint32_t i = 0; i < a->ar_len; i++) {
    tn_sint d = a->u.ar_ints[i];
    int64_t v = d.si_val < 0 ? d.si_val + r : d.si_val;
    if (d.si_sym >= 0 || v < r - (int64_t)a->ar_len || v >= r || (seen >> v & 1))
      return 0;
    seen |= 1ull << v;
  }
  *k = (int)a->ar_len;
  return 1;
}

/* Whether n is a reduction or norm the row kernel computes: over trailing
** dims of a float input of rank >= 1, every output of the input's dtype and
** contiguous. Sets *k to the number of reduced dims. */
static int row_reducible(const tn_graph *g, const tn_node *n, int *k)
{
  double v;
  if (!row_op(n->no_op) || n->no_args[0].ar_tag != TN_ARG_TENSOR)
    return 0;
  const tn_meta *x = &tn_graph_value(g, n->no_args[0].u.ar_ref)->va_meta;
  int r = x->me_rank;
  if (r < 1 || !float_dtype(x->me_dtype))
    return 0;
  for (uint32_t o = 0; o < n->no_nout; o++) {
    const tn_meta *m = &tn_graph_value(g, n->no_out[o])->va_meta;
    if (m->me_dtype != x->me_dtype || !meta_contiguous(m))
      return 0;
  }
  switch (n->no_op) {
  case TN_OP_softmax: case TN_OP_log_softmax:
    return n->no_args[2].u.ar_int == 0 && trailing_dims(&n->no_args[1], r, k);
  case TN_OP_native_layer_norm:
    *k = (int)n->no_args[1].ar_len;
    if (*k < 1 || *k > r || !isfinite(n->no_args[4].u.ar_float))
      return 0;
    for (int i = 2; i <= 3; i++)
      if (n->no_args[i].ar_tag == TN_ARG_TENSOR &&
          tn_graph_value(g, n->no_args[i].u.ar_ref)->va_meta.me_dtype != x->me_dtype)
        return 0;
    return 1;
  case TN_OP_sum: case TN_OP_mean:
    *k = r;
    return 1;
  case TN_OP_var_correction:
    if (n->no_args[2].ar_tag != TN_ARG_NONE && !arg_number(&n->no_args[2], &v))
      return 0;
    return trailing_dims(&n->no_args[1], r, k);
  default: /* sum.dim_IntList, mean.dim, amax, amin, logsumexp */
    return trailing_dims(&n->no_args[1], r, k);
  }
}

/* Whether the rows n reduces (its input's k trailing dims) are known to
** hold at least min_row elements (0: any rows; a symbolic size is not
** known). */
static int row_long_enough(const tn_graph *g, const tn_node *n, int k, int64_t min_row)
{
  const tn_meta *x = &tn_graph_value(g, n->no_args[0].u.ar_ref)->va_meta;
  int64_t len = 1;
  if (min_row <= 0)
    return 1;
  for (int d = x->me_rank - k; d < x->me_rank; d++) {
    if (x->me_sizes[d].si_sym >= 0 || x->me_sizes[d].si_val < 0)
      return 0;
    if (__builtin_mul_overflow(len, x->me_sizes[d].si_val, &len))
      return 1; /* more than any min_row (the graph fuzzer's sizes) */
    if (len >= min_row)
      return 1;
  }
  return len >= min_row;
}

/* Whether op reduces its rows to one value each (not softmax, log_softmax,
** layer norm: those write whole rows). */
static int plain_reduction(int op)
{
  return row_op(op) && op != TN_OP_softmax && op != TN_OP_log_softmax && op != TN_OP_native_layer_norm;
}

/* Whether value v holds float16/bfloat16 values, or values pointwise ops
** computed from such (depth producers back at most). */
static int half_source(const tn_graph *g, int32_t v, int depth)
{
  const tn_value *val = tn_graph_value(g, v);
  if (narrow_float(val->va_meta.me_dtype))
    return 1;
  if (val->va_node < 0 || depth == 0)
    return 0;
  const tn_node *n = tn_graph_node(g, val->va_node);
  if (fuse_rule_of(n->no_op).fr_kind == FK_NONE)
    return 0;
  for (uint32_t a = 0; a < n->no_nargs; a++)
    if (n->no_args[a].ar_tag == TN_ARG_TENSOR && half_source(g, n->no_args[a].u.ar_ref, depth - 1))
      return 1;
  return 0;
}

/* Whether value v reaches a float16/bfloat16 value through pointwise ops
** (depth of them at most): CPU autocast's cast of a float32 layer norm's
** result for the linear layer after it. */
static int half_sink(const tn_graph *g, int32_t v, int depth)
{
  uint32_t nodes = tn_graph_num_nodes(g);
  for (uint32_t i = 0; i < nodes; i++) {
    const tn_node *n = tn_graph_node(g, (int32_t)i);
    int uses = 0;
    for (uint32_t a = 0; a < n->no_nargs && !uses; a++)
      uses = n->no_args[a].ar_tag == TN_ARG_TENSOR && n->no_args[a].u.ar_ref == v;
    if (!uses || n->no_nout < 1)
      continue;
    if (narrow_float(tn_graph_value(g, n->no_out[0])->va_meta.me_dtype))
      return 1;
    if (depth > 0 && fuse_rule_of(n->no_op).fr_kind != FK_NONE && half_sink(g, n->no_out[0], depth - 1))
      return 1;
  }
  return 0;
}

/* Whether row_fusion=auto takes n's rows (TN_FUSE_AUTO_ROWS), k trailing
** dims of its input:
** - a reduction (not softmax, log_softmax or layer norm: those write
**   whole rows) whose rows are not one unit-stride run of memory, as
**   meta_contiguous tells over those dims, stays eager's: a mean over H
**   and W of a channels-last 8x32x32x32 input, rows of stride 32, ran
**   157 us as a row kernel at tier 2 (its loads gathered) against eager's
**   16 us;
** - an op that sums rows (all but amax and amin) of float16/bfloat16
**   values, or of float32 ones computed from them (a mixed-precision RMS
**   norm's x.to(float32).pow(2).mean(-1)), stays eager's: its float32
**   steps differ from eager's kernel in the last bit, which the rounding
**   to the dtype turns into an ulp now and then, and a network spreads
**   (real MiniLM in bfloat16: 4-7 of 8 calls outside assert_close of
**   eager, 0 with them eager's; T5's encoder: 2933 of 28672 elements an
**   ulp or more away); the row kernels gave bfloat16 MiniLM nothing
**   (1.07x eager's speed against 1.08x);
** - so does one whose float32 result is rounded to float16/bfloat16 after
**   pointwise ops at most (CPU autocast's cast for the next linear layer:
**   real MiniLM under bfloat16 autocast, an embeddings layer norm an ulp
**   off eager's made 0.013 at its output). */
static int rows_auto(const tn_graph *g, const tn_node *n, int k)
{
  const tn_meta *x = &tn_graph_value(g, n->no_args[0].u.ar_ref)->va_meta;
  if (n->no_op != TN_OP_amax && n->no_op != TN_OP_amin &&
      (half_source(g, n->no_args[0].u.ar_ref, 8) || (n->no_nout > 0 && half_sink(g, n->no_out[0], 8))))
    return 0;
  return !plain_reduction(n->no_op) || meta_contiguous_from(x, x->me_rank - k);
}

/* Whether n is an argmax or argmin a kernel of its own computes (eager's
** is several times slower than its max): over the last dim, or all dims
** (dim None), of an input of rank >= 1 of a dtype we compute, not bool.
** Sets *k to the number of reduced dims. */
static int argreduce_lowerable(const tn_graph *g, const tn_node *n, int *k)
{
  if ((n->no_op != TN_OP_argmax && n->no_op != TN_OP_argmin) || n->no_args[0].ar_tag != TN_ARG_TENSOR)
    return 0;
  const tn_meta *x = &tn_graph_value(g, n->no_args[0].u.ar_ref)->va_meta;
  const tn_meta *out = &tn_graph_value(g, n->no_out[0])->va_meta;
  int c = dtype_class(x->me_dtype);
  if (x->me_rank < 1 || !c || c == DC_BOOL || out->me_dtype != TN_DTYPE_INT64 || !meta_contiguous(out))
    return 0;
  return trailing_dims(&n->no_args[1], x->me_rank, k) && *k >= 1;
}

/* Whether n is a GEMM the launcher computes: float32 mm, or addmm with
** alpha = beta = 1, of rank-2 matrices; bmm, or baddbmm with alpha = beta
** = 1, of rank-3 batches; its output contiguous. */
static int gemm_lowerable(const tn_graph *g, const tn_node *n)
{
  double v;
  int bias = n->no_op == TN_OP_addmm || n->no_op == TN_OP_baddbmm;
  int rank = n->no_op == TN_OP_bmm || n->no_op == TN_OP_baddbmm ? 3 : 2;
  if (n->no_op != TN_OP_mm && n->no_op != TN_OP_addmm && n->no_op != TN_OP_bmm && n->no_op != TN_OP_baddbmm)
    return 0;
  const tn_meta *out = &tn_graph_value(g, n->no_out[0])->va_meta;
  if (out->me_dtype != TN_DTYPE_FLOAT32 || out->me_rank != rank || !meta_contiguous(out))
    return 0;
  for (int i = 0; i < bias + 2; i++) {
    const tn_meta *m = &tn_graph_value(g, n->no_args[i].u.ar_ref)->va_meta;
    if (m->me_dtype != TN_DTYPE_FLOAT32 || (i >= bias && m->me_rank != rank))
      return 0;
  }
  if (bias && !(arg_number(&n->no_args[3], &v) && v == 1 && arg_number(&n->no_args[4], &v) && v == 1))
    return 0;
  return 1;
}

/* Whether node n reads value v (as a tensor argument or in a tensor list). */
static int node_reads(const tn_node *n, int32_t v)
{
  uint32_t a = 0, e = 0;
  for (int32_t u; (u = tn_graph_node_input(n, &a, &e)) >= 0;)
    if (u == v)
      return 1;
  return 0;
}

/* Whether value v is one of g's results. */
static int graph_output(const tn_graph *g, int32_t v)
{
  for (uint32_t o = 0; o < tn_graph_num_outputs(g); o++)
    if (tn_graph_outputs(g)[o] == v)
      return 1;
  return 0;
}

/* -- Grouping ------------------------------------------------------------- */

typedef struct fuse_state {
  tn_fusion *fs_f;
  const tn_graph *fs_g;
  int32_t *fs_group_of;     /* node -> group or -1 */
  int32_t *fs_first;        /* group -> first node */
  int32_t *fs_count;        /* group -> nodes */
  int32_t *fs_anchor;       /* group -> its reduction node, or -1 (pointwise) */
  int8_t *fs_rdims;         /* group -> reduced trailing dims (row groups), -1 for GEMM groups */
  uint32_t fs_ngroups;
  uint32_t *fs_seen;        /* node -> stamp of the last search that visited it */
  int32_t *fs_stack;        /* that search's nodes to visit */
  uint32_t fs_stamp;
} fuse_state;

static int32_t producer(const tn_graph *g, int32_t v)
{
  return tn_graph_value(g, v)->va_node;
}

/* Whether node p is in group k or h. */
static int in_groups(const fuse_state *s, int32_t p, int32_t k, int32_t h)
{
  return s->fs_group_of[p] == k || (h >= 0 && s->fs_group_of[p] == h);
}

/* Pushes the producers of node i's tensor inputs that lie outside groups
** k and h, from node lo on, not yet seen by this search. Returns whether
** one of them is in k or h (only when members is set: for nodes outside). */
static int push_inputs(fuse_state *s, int32_t i, int32_t k, int32_t h, int32_t lo, uint32_t *top, int members)
{
  const tn_node *n = tn_graph_node(s->fs_g, i);
  uint32_t a = 0, e = 0;
  for (int32_t v; (v = tn_graph_node_input(n, &a, &e)) >= 0;) {
    int32_t p = producer(s->fs_g, v);
    if (p < lo || s->fs_seen[p] == s->fs_stamp)
      continue;
    if (in_groups(s, p, k, h)) {
      if (members)
        return 1;
      continue;
    }
    s->fs_seen[p] = s->fs_stamp;
    s->fs_stack[(*top)++] = p;
  }
  return 0;
}

/* Whether a tensor that groups k and h (h may be -1) read from outside
** themselves depends on one of their nodes: as one kernel, they would then
** need their own result first. Anything else may run before the kernel:
** the back end puts the nodes back in a topological order after fusion,
** so a group need not start after all its inputs in the graph's order. */
static int reaches(fuse_state *s, int32_t k, int32_t h)
{
  uint32_t nn = tn_graph_num_nodes(s->fs_g), top = 0;
  int32_t lo = h >= 0 && s->fs_first[h] < s->fs_first[k] ? s->fs_first[h] : s->fs_first[k];
  s->fs_stamp++;
  for (uint32_t i = (uint32_t)lo; i < nn; i++)
    if (in_groups(s, (int32_t)i, k, h))
      push_inputs(s, (int32_t)i, k, h, lo, &top, 0);
  while (top > 0)
    if (push_inputs(s, s->fs_stack[--top], k, h, lo, &top, 1))
      return 1;
  return 0;
}

/* Whether every gather in groups k and h (h may be -1) reads its table and
** index from outside them (a kernel picks rows of a tensor it is given,
** not of one it computes). */
static int gathers_outside(fuse_state *s, int32_t k, int32_t h)
{
  const tn_graph *g = s->fs_g;
  for (uint32_t i = 0; i < tn_graph_num_nodes(g); i++) {
    const tn_node *n = tn_graph_node(g, (int32_t)i);
    int t, x;
    if (!in_groups(s, (int32_t)i, k, h) || fuse_rule_of(n->no_op).fr_kind != FK_GATHER)
      continue;
    gather_args(n, &t, &x);
    int32_t pt = producer(g, n->no_args[t].u.ar_ref), px = producer(g, n->no_args[x].u.ar_ref);
    if ((pt >= 0 && in_groups(s, pt, k, h)) || (px >= 0 && in_groups(s, px, k, h)))
      return 0;
  }
  return 1;
}

/* Nodes one kernel takes at most: a generated kernel keeps a block of
** TN_RT_BLOCK values on its stack per buffer (one or more per node), so a
** chain of 1500 adds made one 12 MB frame and overflowed the stack. 128
** nodes stay under about 2 MB; a longer chain is several kernels. */
#define FUSE_MAX_NODES 128

/* Whether group h can run inside group k (k starts first): same shape,
** and no cycle through the two. */
static int may_merge(fuse_state *s, int32_t h, int32_t k)
{
  const tn_graph *g = s->fs_g;
  if (h == k || s->fs_first[h] < s->fs_first[k] || s->fs_count[h] + s->fs_count[k] > FUSE_MAX_NODES ||
      !same_space(&tn_graph_value(g, tn_graph_node(g, s->fs_first[h])->no_out[0])->va_meta,
                   &tn_graph_value(g, tn_graph_node(g, s->fs_first[k])->no_out[0])->va_meta))
    return 0;
  return !reaches(s, k, h) && gathers_outside(s, k, h);
}

/* Moves every node of group h into group k. */
static void move_group(fuse_state *s, int32_t h, int32_t k)
{
  for (uint32_t j = (uint32_t)s->fs_first[h]; j < tn_graph_num_nodes(s->fs_g); j++)
    if (s->fs_group_of[j] == h)
      s->fs_group_of[j] = k;
  s->fs_count[k] += s->fs_count[h];
  s->fs_count[h] = 0;
  if (s->fs_first[h] < s->fs_first[k])
    s->fs_first[k] = s->fs_first[h];
}

/* Whether node i may join group k (and then puts it there): same shape,
** and no cycle. First merges into k the groups of i's inputs that can
** run inside it. */
static int may_join(fuse_state *s, uint32_t i, int32_t k)
{
  const tn_graph *g = s->fs_g;
  const tn_node *n = tn_graph_node(g, (int32_t)i);
  const tn_meta *out = &tn_graph_value(g, n->no_out[0])->va_meta;
  const tn_node *first = tn_graph_node(g, s->fs_first[k]);
  if (s->fs_count[k] + 1 > FUSE_MAX_NODES || !same_space(out, &tn_graph_value(g, first->no_out[0])->va_meta))
    return 0;
  for (uint32_t a = 0; a < n->no_nargs; a++) {
    if (n->no_args[a].ar_tag != TN_ARG_TENSOR)
      continue;
    int32_t p = producer(g, n->no_args[a].u.ar_ref), h = p >= 0 ? s->fs_group_of[p] : -1;
    if (h >= 0 && h != k && may_merge(s, h, k))
      move_group(s, h, k);
  }
  s->fs_group_of[i] = k;
  if (reaches(s, k, -1) || !gathers_outside(s, k, -1)) {
    s->fs_group_of[i] = -1;
    return 0;
  }
  s->fs_count[k]++;
  return 1;
}

/* Whether every node of pointwise group h computes in dtype dt alone
** (uniform_node): what a row or GEMM group may take in. */
static int uniform_group(fuse_state *s, int32_t h, int dt)
{
  for (uint32_t i = (uint32_t)s->fs_first[h]; i < tn_graph_num_nodes(s->fs_g); i++)
    if (s->fs_group_of[i] == h && !uniform_node(s->fs_g, tn_graph_node(s->fs_g, (int32_t)i), dt))
      return 0;
  return 1;
}

/* Takes into group r the pointwise groups that read the first result of
** node i (r's anchor), compute in its dtype and can run inside r. */
static void absorb_consumers(fuse_state *s, int32_t r, uint32_t i)
{
  const tn_graph *g = s->fs_g;
  int32_t v = tn_graph_node(g, (int32_t)i)->no_out[0];
  int dt = tn_graph_value(g, v)->va_meta.me_dtype;
  for (uint32_t j = i + 1; j < tn_graph_num_nodes(g); j++) {
    int32_t h = s->fs_group_of[j];
    if (h >= 0 && h != r && s->fs_anchor[h] < 0 && node_reads(tn_graph_node(g, (int32_t)j), v) &&
        uniform_group(s, h, dt) && may_merge(s, h, r))
      move_group(s, h, r);
  }
}

/* Makes row group of reduction node i (k reduced dims), taking in the
** pointwise group that produces its input and, for norms, the pointwise
** groups that consume its result. */
static void form_row_group(fuse_state *s, uint32_t i, int k)
{
  const tn_graph *g = s->fs_g;
  const tn_node *n = tn_graph_node(g, (int32_t)i);
  int32_t r = (int32_t)s->fs_ngroups++;
  s->fs_first[r] = (int32_t)i;
  s->fs_count[r] = 1;
  s->fs_anchor[r] = (int32_t)i;
  s->fs_rdims[r] = (int8_t)k;
  s->fs_group_of[i] = r;

  int32_t p = producer(g, n->no_args[0].u.ar_ref);
  int32_t pro = p >= 0 ? s->fs_group_of[p] : -1;
  if (pro >= 0 && pro != r && s->fs_anchor[pro] < 0 &&
      uniform_group(s, pro, tn_graph_value(g, n->no_args[0].u.ar_ref)->va_meta.me_dtype) && !reaches(s, pro, r))
    move_group(s, pro, r);
  if (tn_op_class(n->no_op) == TN_OPC_NORM)
    absorb_consumers(s, r, i);
}

/* Makes the GEMM group of node i with its epilogue (none for a plain mm:
** the launcher's GEMM is its own kernel). */
static void form_gemm_group(fuse_state *s, uint32_t i)
{
  int32_t r = (int32_t)s->fs_ngroups++;
  s->fs_first[r] = (int32_t)i;
  s->fs_count[r] = 1;
  s->fs_anchor[r] = (int32_t)i;
  s->fs_rdims[r] = -1;
  s->fs_group_of[i] = r;
  absorb_consumers(s, r, i);
}

/* The pointwise group that holds every reader of node i's result, or -1
** (a reader elsewhere, or the result is a graph output). */
static int32_t sole_reader_group(fuse_state *s, uint32_t i)
{
  const tn_graph *g = s->fs_g;
  int32_t v = tn_graph_node(g, (int32_t)i)->no_out[0], k = -1;
  if (graph_output(g, v))
    return -1;
  for (uint32_t j = i + 1; j < tn_graph_num_nodes(g); j++) {
    if (!node_reads(tn_graph_node(g, (int32_t)j), v))
      continue;
    int32_t h = s->fs_group_of[j];
    if (h < 0 || s->fs_anchor[h] >= 0 || (k >= 0 && h != k))
      return -1;
    k = h;
  }
  return k;
}

/* The one node that reads value v, or -1 (none, several, or v is a graph
** output). */
static int32_t sole_reader(const tn_graph *g, int32_t v)
{
  int32_t at = -1, from = producer(g, v) + 1; /* an input (no producer): from node 0 */
  if (graph_output(g, v))
    return -1;
  for (uint32_t j = (uint32_t)from; j < tn_graph_num_nodes(g); j++)
    if (node_reads(tn_graph_node(g, (int32_t)j), v)) {
      if (at >= 0)
        return -1;
      at = (int32_t)j;
    }
  return at;
}

/* The cat slot of value v: when v's only reader is a cat that takes it
** once, into a contiguous result of v's dtype and rank with elements, every
** part of concrete size along the cat's dim (a symbolic size elsewhere, as
** in a dynamic variant, is at least 2), a kernel computing v can write it straight
** into the cat's result (which saves the cat's copy of it; the back end's
** _fuse and _finish_cats do the rest). Sets *cat (the cat's result), *dim
** (the dim it joins along) and *offset (where v starts there: empty parts
** take no room, as eager skips them); 0 when v has no slot. */
static int cat_slot(const tn_graph *g, int32_t v, int32_t *cat, int *dim, int64_t *offset)
{
  int32_t at = producer(g, v) >= 0 ? sole_reader(g, v) : -1, uses = 0;
  const tn_node *c = at >= 0 ? tn_graph_node(g, at) : NULL;
  if (!c || c->no_op != TN_OP_cat || c->no_args[0].ar_tag != TN_ARG_TENSOR_LIST || c->no_args[1].ar_tag != TN_ARG_INT)
    return 0;
  const tn_meta *cm = &tn_graph_value(g, c->no_out[0])->va_meta, *vm = &tn_graph_value(g, v)->va_meta;
  if (cm->me_dtype != vm->me_dtype || cm->me_rank != vm->me_rank || cm->me_rank == 0 || !meta_contiguous(cm))
    return 0;
  int64_t numel = 1, d = c->no_args[1].u.ar_int, off = 0, at_off = -1;
  for (int k = 0; k < cm->me_rank; k++)
    if (cm->me_sizes[k].si_sym < 0 && __builtin_mul_overflow(numel, cm->me_sizes[k].si_val, &numel))
      return 0;  /* no tensor has that many elements (the graph fuzzer's sizes) */
  d = d < 0 ? d + cm->me_rank : d;
  if (numel == 0 || d < 0 || d >= cm->me_rank)
    return 0;
  for (uint32_t e = 0; e < c->no_args[0].ar_len; e++) {
    int32_t part = c->no_args[0].u.ar_refs[e];
    const tn_meta *pm = &tn_graph_value(g, part)->va_meta;
    int64_t pn = 1;
    for (int k = 0; k < pm->me_rank; k++) {
      if (pm->me_sizes[k].si_sym >= 0 && k == d)
        return 0; /* a part of symbolic size along the cat: the offsets are not static */
      /* a symbol: 2 or more; only whether pn is 0 counts, so past int64 (2^32 * 2^32 wrapped to 0) it goes on
      ** from 1 */
      if (__builtin_mul_overflow(pn, pm->me_sizes[k].si_sym >= 0 ? 2 : pm->me_sizes[k].si_val, &pn))
        pn = 1;
    }
    if (part == v) {
      uses++;
      at_off = off;
    }
    if (pn) /* eager skips empty parts, of any rank */
      off += pm->me_rank > d ? pm->me_sizes[d].si_val : 0;
  }
  if (uses != 1)
    return 0;
  *cat = c->no_out[0];
  *dim = (int)d;
  *offset = at_off;
  return 1;
}

/* Whether the one node of group k computes a value with a cat slot: the
** group is kept though it has one node. */
static int feeds_cat(const fuse_state *s, int32_t k)
{
  int32_t cat;
  int dim;
  int64_t off;
  return cat_slot(s->fs_g, tn_graph_node(s->fs_g, s->fs_first[k])->no_out[0], &cat, &dim, &off);
}

/* Whether group k reads a tensor from outside that is not a factory:
** a kernel needs one input at least (its iteration space). */
static int has_real_input(fuse_state *s, int32_t k)
{
  const tn_graph *g = s->fs_g;
  double v;
  for (uint32_t i = (uint32_t)s->fs_first[k]; i < tn_graph_num_nodes(g); i++) {
    const tn_node *n = tn_graph_node(g, (int32_t)i);
    for (uint32_t a = 0; s->fs_group_of[i] == k && a < n->no_nargs; a++) {
      if (n->no_args[a].ar_tag != TN_ARG_TENSOR)
        continue;
      int32_t p = producer(g, n->no_args[a].u.ar_ref);
      if (p < 0 || (s->fs_group_of[p] != k && !factory_value(g, tn_graph_node(g, p), &v)))
        return 1;
    }
  }
  return 0;
}

/* Whether every reader of the factory node i's value v takes its
** result's shape from another tensor operand: a kernel's iteration shape is
** the broadcast of its real inputs, which a constant must not enlarge. A
** gather's index or table must be a real operand, so no gather qualifies. */
static int factory_fits_readers(const tn_graph *g, uint32_t i)
{
  const tn_node *f = tn_graph_node(g, (int32_t)i);
  if (f->no_nout == 0)
    return 0;
  int32_t v = f->no_out[0];
  for (uint32_t j = i + 1; j < tn_graph_num_nodes(g); j++) {
    const tn_node *n = tn_graph_node(g, (int32_t)j);
    /* a reader with no tensor output (or an operand that is no value) covers nothing */
    const tn_value *out = n->no_nout > 0 ? tn_graph_value(g, n->no_out[0]) : NULL;
    int reads = 0, covered = 0;
    for (uint32_t a = 0; a < n->no_nargs; a++) {
      const tn_arg *arg = &n->no_args[a];
      if (arg->ar_tag != TN_ARG_TENSOR)
        continue;
      if (arg->u.ar_ref == v) {
        reads = 1;
      } else if (out != NULL) {
        const tn_value *in = tn_graph_value(g, arg->u.ar_ref);
        covered |= in != NULL && same_space(&in->va_meta, &out->va_meta);
      }
    }
    if (reads && (!covered || fuse_rule_of(n->no_op).fr_kind == FK_GATHER))
      return 0;
  }
  return 1;
}

/* Makes node i, when it is a factory whose readers all lie in one
** pointwise group (and take their shape from elsewhere), a constant of
** that group. */
static void absorb_factory(fuse_state *s, uint32_t i)
{
  double v;
  if (s->fs_group_of[i] >= 0 || !factory_value(s->fs_g, tn_graph_node(s->fs_g, (int32_t)i), &v))
    return;
  int32_t k = sole_reader_group(s, i);
  if (k < 0 || !has_real_input(s, k) || !factory_fits_readers(s->fs_g, i))
    return;
  s->fs_group_of[i] = k;
  s->fs_count[k]++;
  if ((int32_t)i < s->fs_first[k])
    s->fs_first[k] = (int32_t)i;
}

/* -- Programs ----------------------------------------------------------------- */

typedef struct prog_builder {
  tn_fusion *pb_f;
  tn_finst *pb_prog;
  uint32_t pb_n, pb_cap;
  uint32_t pb_nbufs, pb_nscalars;
  uint8_t *pb_bdt;    /* dtype of each buffer's values */
  uint8_t *pb_exact;  /* whether a buffer's values are rounded (float16/bfloat16) or wrapped (narrow
                      ** integers) to its dtype */
  uint32_t pb_bcap;
  int32_t (*pb_casts)[3]; /* conversions made: source buffer, dtype, result buffer */
  uint32_t pb_ncasts, pb_castcap;
  int pb_dtype;       /* row groups: the dtype of their splat row scalars */
  int pb_rc;
} prog_builder;

static void emit(prog_builder *b, tn_finst fi)
{
  if (b->pb_rc != TN_OK)
    return;
  if (b->pb_n == b->pb_cap) {
    uint32_t cap = b->pb_cap ? 2 * b->pb_cap : 32;
    tn_finst *p = mi_heap_reallocn(b->pb_f->fu_heap, b->pb_prog, cap, sizeof *p);
    if (!p) {
      b->pb_rc = TN_ENOMEM;
      return;
    }
    b->pb_prog = p;
    b->pb_cap = cap;
  }
  b->pb_prog[b->pb_n++] = fi;
}

static tn_finst inst(int kind, int op, int32_t dst, int32_t a, int32_t c, double v)
{
  return (tn_finst){kind, op, dst, a, c, -1, v};
}

/* A new buffer holding values of dtype dt (exact: rounded to a float16 /
** bfloat16 dtype, wrapped to an integer one; other dtypes always are). */
static int32_t new_buf(prog_builder *b, int dt, int exact)
{
  uint32_t k = b->pb_nbufs++;
  if (b->pb_rc != TN_OK)
    return (int32_t)k;
  if (k == b->pb_bcap) {
    uint32_t cap = b->pb_bcap ? 2 * b->pb_bcap : 32;
    uint8_t *d = mi_heap_reallocn(b->pb_f->fu_heap, b->pb_bdt, cap, 1);
    uint8_t *e = d ? mi_heap_reallocn(b->pb_f->fu_heap, b->pb_exact, cap, 1) : NULL;
    if (d)
      b->pb_bdt = d;
    if (!e) {
      b->pb_rc = TN_ENOMEM;
      return (int32_t)k;
    }
    b->pb_exact = e;
    b->pb_bcap = cap;
  }
  b->pb_bdt[k] = (uint8_t)dt;
  b->pb_exact[k] = (uint8_t)(exact || !(narrow_float(dt) || (dtype_class(dt) == DC_INT && dt != TN_DTYPE_INT64)));
  return (int32_t)k;
}

static int buf_dtype(const prog_builder *b, int32_t v)
{
  return b->pb_rc == TN_OK ? b->pb_bdt[v] : TN_DTYPE_FLOAT32;
}

static int32_t emit_const(prog_builder *b, double v, int dt)
{
  int32_t dst = new_buf(b, dt, 1);
  emit(b, inst(TN_FI_CONST, 0, dst, -1, -1, v));
  return dst;
}

/* An op computing values of dtype dt (its operands in dt's blocks;
** rounded to float16/bfloat16 by a later cast or store, unless the op
** makes one of its rounded operands' values: neg, abs, relu, max, min). */
static int32_t emit_op_dt(prog_builder *b, int kind, int op, int32_t a, int32_t c, int dt)
{
  int keeps = (kind == TN_FI_UNARY && (op == TN_RT_NEG || op == TN_RT_ABS || op == TN_RT_RELU)) ||
              (kind == TN_FI_BINARY && (op == TN_RT_B_MAXIMUM || op == TN_RT_B_MINIMUM));
  int exact = !narrow_float(dt) || (keeps && b->pb_rc == TN_OK && b->pb_exact[a] && (c < 0 || b->pb_exact[c]));
  int32_t dst = new_buf(b, dt, exact); /* integers: emit_wrap says otherwise */
  emit(b, inst(kind, op, dst, a, c, 0));
  return dst;
}

/* The same with a's dtype (row programs, where all share one). */
static int32_t emit_op(prog_builder *b, int kind, int op, int32_t a, int32_t c)
{
  return emit_op_dt(b, kind, op, a, c, buf_dtype(b, a));
}

static int32_t emit_cast(prog_builder *b, int32_t a, int to)
{
  int32_t dst = new_buf(b, to, 1);
  emit(b, inst(TN_FI_CAST, 0, dst, a, -1, 0));
  return dst;
}

/* a as a value of dtype to: a itself where its values already are
** (widens), else a cast, made once per buffer and dtype. */
static int32_t emit_convert(prog_builder *b, int32_t a, int to)
{
  int from = buf_dtype(b, a);
  if (from == to || (b->pb_rc == TN_OK && b->pb_exact[a] && widens(to, from)))
    return a;
  for (uint32_t i = 0; i < b->pb_ncasts; i++)
    if (b->pb_casts[i][0] == a && b->pb_casts[i][1] == to)
      return b->pb_casts[i][2];
  int32_t dst = emit_cast(b, a, to);
  if (b->pb_ncasts == b->pb_castcap) {
    uint32_t cap = b->pb_castcap ? 2 * b->pb_castcap : 8;
    int32_t(*c)[3] = mi_heap_reallocn(b->pb_f->fu_heap, b->pb_casts, cap, sizeof *c);
    if (!c) {
      b->pb_rc = TN_ENOMEM;
      return dst;
    }
    b->pb_casts = c;
    b->pb_castcap = cap;
  }
  b->pb_casts[b->pb_ncasts][0] = a;
  b->pb_casts[b->pb_ncasts][1] = to;
  b->pb_casts[b->pb_ncasts++][2] = dst;
  return dst;
}

/* a with its values rounded to its float16/bfloat16 dtype, or wrapped to
** its integer width (what eager compares, or takes the max of). */
static int32_t emit_exact(prog_builder *b, int32_t a)
{
  return b->pb_rc != TN_OK || b->pb_exact[a] ? a : emit_cast(b, a, b->pb_bdt[a]);
}

static int32_t emit_scalar(prog_builder *b, int kind, int op, int32_t a, int32_t c, double v)
{
  int32_t dst = (int32_t)b->pb_nscalars++;
  emit(b, inst(kind, op, dst, a, c, v));
  return dst;
}

static int32_t emit_splat(prog_builder *b, int32_t r)
{
  int32_t dst = new_buf(b, b->pb_dtype, 0);
  emit(b, inst(TN_FI_SPLAT, 0, dst, r, -1, 0));
  return dst;
}

static int32_t emit_row_mean(prog_builder *b, int32_t x)
{
  return emit_scalar(b, TN_FI_REDUCE, TN_RT_R_MEAN, x, -1, 0);
}

/* Sum of squares of x - mean over the row (mean: a scalar); sets *d to x - mean. */
static int32_t emit_row_ssq(prog_builder *b, int32_t x, int32_t mean, int32_t *d)
{
  *d = emit_op(b, TN_FI_BINARY, TN_RT_B_SUB, x, emit_splat(b, mean));
  return emit_scalar(b, TN_FI_REDUCE, TN_RT_R_SUM, emit_op(b, TN_FI_BINARY, TN_RT_B_MUL, *d, *d), -1, 0);
}

/* Emits reduction node n of a row group: its row outputs go to bufof, its
** per-row outputs to sof (and, splat, to bufof for pointwise readers). */
static void emit_row(prog_builder *b, const tn_node *n, int32_t *bufof, int32_t *sof)
{
  int32_t x = bufof[n->no_args[0].u.ar_ref], d, t, e, sum, m;
  double v;
  switch (n->no_op) {
  case TN_OP_softmax: case TN_OP_log_softmax:
    m = emit_scalar(b, TN_FI_REDUCE, TN_RT_R_MAX, x, -1, 0);
    t = emit_op(b, TN_FI_BINARY, TN_RT_B_SUB, x, emit_splat(b, m));
    e = emit_op(b, TN_FI_UNARY, TN_RT_EXP, t, -1);
    sum = emit_scalar(b, TN_FI_REDUCE, TN_RT_R_SUM, e, -1, 0);
    if (n->no_op == TN_OP_softmax)
      bufof[n->no_out[0]] = emit_op(b, TN_FI_BINARY, TN_RT_B_DIV, e, emit_splat(b, sum));
    else
      bufof[n->no_out[0]] = emit_op(b, TN_FI_BINARY, TN_RT_B_SUB, t,
                                    emit_splat(b, emit_scalar(b, TN_FI_SUNARY, TN_RT_LOG, sum, -1, 0)));
    break;
  case TN_OP_native_layer_norm: {
    int32_t mean = emit_row_mean(b, x);
    int32_t var = emit_scalar(b, TN_FI_SBINARY, TN_RT_B_DIV, emit_row_ssq(b, x, mean, &d),
                              emit_scalar(b, TN_FI_SCOLS, 0, -1, -1, 0), 0);
    int32_t rstd = emit_scalar(b, TN_FI_SUNARY, TN_RT_RSQRT,
                               emit_scalar(b, TN_FI_SBINARY, TN_RT_B_ADD, var,
                                           emit_scalar(b, TN_FI_SCONST, 0, -1, -1, n->no_args[4].u.ar_float), 0),
                               -1, 0);
    int32_t y = emit_op(b, TN_FI_BINARY, TN_RT_B_MUL, d, emit_splat(b, rstd));
    if (n->no_args[2].ar_tag == TN_ARG_TENSOR)
      y = emit_op(b, TN_FI_BINARY, TN_RT_B_MUL, y, bufof[n->no_args[2].u.ar_ref]);
    if (n->no_args[3].ar_tag == TN_ARG_TENSOR)
      y = emit_op(b, TN_FI_BINARY, TN_RT_B_ADD, y, bufof[n->no_args[3].u.ar_ref]);
    bufof[n->no_out[0]] = y;
    sof[n->no_out[1]] = mean;
    sof[n->no_out[2]] = rstd;
    break;
  }
  case TN_OP_sum: case TN_OP_sum_dim_IntList:
    sof[n->no_out[0]] = emit_scalar(b, TN_FI_REDUCE, TN_RT_R_SUM, x, -1, 0);
    break;
  case TN_OP_mean: case TN_OP_mean_dim:
    sof[n->no_out[0]] = emit_row_mean(b, x);
    break;
  case TN_OP_amax: case TN_OP_amin:
    sof[n->no_out[0]] = emit_scalar(b, TN_FI_REDUCE, n->no_op == TN_OP_amax ? TN_RT_R_MAX : TN_RT_R_MIN, x, -1, 0);
    break;
  case TN_OP_argmax: case TN_OP_argmin: /* an index: the kernel's own body (codegen's cg_argreduce) */
    sof[n->no_out[0]] = emit_scalar(b, TN_FI_REDUCE, n->no_op == TN_OP_argmax ? TN_RT_R_ARGMAX : TN_RT_R_ARGMIN, x,
                                    -1, 0);
    break;
  case TN_OP_var_correction: {
    int32_t ssq = emit_row_ssq(b, x, emit_row_mean(b, x), &d);
    /* less (sum of d)^2 / n, the corrected two-pass formula: x - mean in the row's dtype is off by the mean's
    ** rounding, which adds n times its square (9.5e-4 to a variance of 1.07 around 1e6, where eager's Welford
    ** in double is exact); clamped at 0, which rounding may cross where every d is one value */
    int32_t sd = emit_scalar(b, TN_FI_REDUCE, TN_RT_R_SUM, d, -1, 0);
    ssq = emit_scalar(b, TN_FI_SBINARY, TN_RT_B_SUB, ssq,
                      emit_scalar(b, TN_FI_SBINARY, TN_RT_B_DIV, emit_scalar(b, TN_FI_SBINARY, TN_RT_B_MUL, sd, sd, 0),
                                  emit_scalar(b, TN_FI_SCOLS, 0, -1, -1, 0), 0), 0);
    ssq = emit_scalar(b, TN_FI_SBINARY, TN_RT_B_CLAMP_MIN, ssq, emit_scalar(b, TN_FI_SCONST, 0, -1, -1, 0), 0);
    if (!arg_number(&n->no_args[2], &v))
      v = 1; /* correction=None: Bessel's */
    int32_t dof = emit_scalar(b, TN_FI_SBINARY, TN_RT_B_SUB, emit_scalar(b, TN_FI_SCOLS, 0, -1, -1, 0),
                              emit_scalar(b, TN_FI_SCONST, 0, -1, -1, v), 0);
    dof = emit_scalar(b, TN_FI_SBINARY, TN_RT_B_CLAMP_MIN, dof, emit_scalar(b, TN_FI_SCONST, 0, -1, -1, 0), 0);
    sof[n->no_out[0]] = emit_scalar(b, TN_FI_SBINARY, TN_RT_B_DIV, ssq, dof, 0);
    break;
  }
  case TN_OP_logsumexp:
    /* shifted by the max, or by 0 where the max is infinite (as eager) */
    m = emit_scalar(b, TN_FI_SUNARY, TN_RT_ZERO_INF, emit_scalar(b, TN_FI_REDUCE, TN_RT_R_MAX, x, -1, 0), -1, 0);
    t = emit_op(b, TN_FI_BINARY, TN_RT_B_SUB, x, emit_splat(b, m));
    sum = emit_scalar(b, TN_FI_REDUCE, TN_RT_R_SUM, emit_op(b, TN_FI_UNARY, TN_RT_EXP, t, -1), -1, 0);
    sof[n->no_out[0]] = emit_scalar(b, TN_FI_SBINARY, TN_RT_B_ADD,
                                    emit_scalar(b, TN_FI_SUNARY, TN_RT_LOG, sum, -1, 0), m, 0);
    break;
  default:
    break;
  }
  for (uint32_t o = 0; o < n->no_nout; o++)
    if (sof[n->no_out[o]] >= 0)
      bufof[n->no_out[o]] = emit_splat(b, sof[n->no_out[o]]);
}

/* Whether the integer op of rule r gives a result that depends only on the
** low bits of its operands (sums, differences, products, bitwise ops): an
** operand not yet wrapped to its width gives the same low bits. */
static int low_bits_op(fuse_rule r)
{
  if (r.fr_kind == FK_UNARY)
    return r.fr_op == TN_RT_NEG || r.fr_op == TN_RT_BNOT;
  return r.fr_op == TN_RT_B_ADD || r.fr_op == TN_RT_B_SUB || r.fr_op == TN_RT_B_MUL || r.fr_op == TN_RT_B_BAND ||
         r.fr_op == TN_RT_B_BOR || r.fr_op == TN_RT_B_BXOR;
}

/* r, the result of an integer op of rule r narrower than int64, marked
** "not wrapped" when the op can leave its dtype's range (neg, abs, ~, +,
** -, *) or passes an operand's unwrapped low bits on (&, |, ^): it is
** wrapped, as eager's kernels of that width compute it, only
** where a reader needs the value (emit_exact: abs, relu, max, min, clamps,
** comparisons), by a cast, or by the store. Wrapping later is the same as
** wrapping after every op for the low-bits ops between. */
static int32_t emit_wrap(prog_builder *b, int32_t r, fuse_rule rule)
{
  int dt = buf_dtype(b, r);
  if (dtype_class(dt) == DC_INT && dt != TN_DTYPE_INT64 && b->pb_rc == TN_OK &&
      (low_bits_op(rule) || (rule.fr_kind == FK_UNARY && rule.fr_op == TN_RT_ABS)))
    b->pb_exact[r] = 0;
  return r;
}

/* a as its reader needs it (emit_exact): wrapped when the rule's op reads
** more than the low bits of an integer operand (float16/bfloat16 values
** are rounded after every op already). */
static int32_t emit_operand(prog_builder *b, int32_t a, fuse_rule rule)
{
  if (dtype_class(buf_dtype(b, a)) == DC_INT)
    return low_bits_op(rule) ? a : emit_exact(b, a);
  return a;
}

/* pow(x, v) as eager computes it for the exponents its kernels
** special-case (PowKernel.cpp: 2 -> x*x, 3 -> x*x*x, -2 -> 1/(x*x), 0.5
** -> sqrt, -0.5 -> rsqrt, -1 -> reciprocal; pow_Tensor_Scalar_out: 1 -> a
** copy, 0 -> ones), bit for bit on every ISA: float32 and float64, and
** bfloat16 with x*x rounded to bfloat16 inside x*x*x and 1/(x*x); float16
** special-cases only 0 and 1. -1 for any other exponent (the math
** library's pow). A fused powf of an integral exponent was 17x slower
** than eager's x*x*x (GPT-2's gelu_new). */
static int32_t emit_pow_scalar(prog_builder *b, int32_t x, double v, int dt)
{
  const int mul = TN_RT_B_MUL;
  if (v == 0)
    return emit_const(b, 1, dt);
  if (v == 1)
    return emit_cast(b, x, dt);
  if (dt == TN_DTYPE_FLOAT16)
    return -1;
  if (v == 0.5)
    return emit_op_dt(b, TN_FI_UNARY, TN_RT_SQRT, x, -1, dt);
  if (v == -0.5)
    return emit_op_dt(b, TN_FI_UNARY, TN_RT_RSQRT, x, -1, dt);
  if (v == -1)
    return emit_op_dt(b, TN_FI_UNARY, TN_RT_RECIPROCAL, x, -1, dt);
  if (narrow_float(dt)) /* bfloat16 compares its exponent rounded */
    v = tn_rt_round(dt, v);
  if (v == 2)
    return emit_op_dt(b, TN_FI_BINARY, mul, x, x, dt);
  if (v == 3)
    return emit_op_dt(b, TN_FI_BINARY, mul, emit_exact(b, emit_op_dt(b, TN_FI_BINARY, mul, x, x, dt)), x, dt);
  if (v == -2)
    return emit_op_dt(b, TN_FI_BINARY, TN_RT_B_DIV, emit_const(b, 1, dt),
                      emit_exact(b, emit_op_dt(b, TN_FI_BINARY, mul, x, x, dt)), dt);
  return -1;
}

/* Emits node n of graph g; bufof maps value ids to buffers. Every input
** is first converted to the dtype n computes in. Returns n's buffer. */
static int32_t emit_node(prog_builder *b, const tn_graph *g, const tn_node *n, const int32_t *bufof)
{
  fuse_rule r = fuse_rule_of(n->no_op);
  int dt = tn_graph_value(g, n->no_out[0])->va_meta.me_dtype;
  int32_t x = n->no_nargs && n->no_args[0].ar_tag == TN_ARG_TENSOR ? bufof[n->no_args[0].u.ar_ref] : -1, y;
  double v = 0, alpha = 1;
  switch (r.fr_kind) {
  case FK_UNARY: /* on bool, ~x is logical not */
    return emit_wrap(b, emit_op_dt(b, TN_FI_UNARY, r.fr_op == TN_RT_BNOT && dt == TN_DTYPE_BOOL ? TN_RT_LNOT : r.fr_op,
                                   emit_operand(b, emit_convert(b, x, dt), r), -1, dt), r);
  case FK_GELU:
    return emit_op_dt(b, TN_FI_UNARY, memcmp(n->no_args[1].u.ar_str, "tanh", 4) == 0 ? TN_RT_GELU_TANH : TN_RT_GELU,
                      emit_convert(b, x, dt), -1, dt);
  case FK_BINARY: {
    /* eager's float16/bfloat16 mul and div read a 0-dim second operand of
    ** another dtype at float32 precision (x * s); a first one (s * x),
    ** and add's and sub's, it rounds to dt first */
    int cdt = narrow_float(dt) && (r.fr_op == TN_RT_B_MUL || r.fr_op == TN_RT_B_DIV) ? TN_DTYPE_FLOAT32 : dt;
    y = bufof[n->no_args[1].u.ar_ref];
    x = emit_operand(b, emit_convert(b, x, dt), r);
    y = emit_operand(b, buf_dtype(b, y) == dt ? y : emit_convert(b, y, cdt), r);
    if (n->no_nargs > 2 && arg_scalar(&n->no_args[2], &alpha) && alpha != 1) /* alpha in dt, as eager's */
      y = emit_wrap(b, emit_op_dt(b, TN_FI_BINARY, TN_RT_B_MUL, y, emit_const(b, tn_rt_round(dt, alpha), dt), dt),
                    (fuse_rule){FK_BINARY, TN_RT_B_MUL});
    return emit_wrap(b, emit_op_dt(b, TN_FI_BINARY, r.fr_op, x, y, dt), r);
  }
  case FK_SCALAR:
    arg_scalar(&n->no_args[1], &v);
    if (r.fr_op == TN_RT_B_POW && dtype_class(dt) != DC_INT) {
      int32_t p = emit_pow_scalar(b, emit_convert(b, x, dt), v, dt);
      if (p >= 0)
        return p;
    }
    /* eager adds the scalar, and raises to the exponent, rounded to a
    ** float16/bfloat16 tensor's dtype; alpha too */
    if (narrow_float(dt) && (r.fr_op == TN_RT_B_ADD || r.fr_op == TN_RT_B_SUB || r.fr_op == TN_RT_B_POW))
      v = tn_rt_round(dt, v);
    if (n->no_nargs > 2 && arg_scalar(&n->no_args[2], &alpha)) /* other * alpha, as ATen */
      v = dtype_class(dt) == DC_FLOAT ? (double)((float)tn_rt_round(dt, alpha) * (float)v) : v * alpha;
    return emit_wrap(b, emit_op_dt(b, TN_FI_BINARY, r.fr_op, emit_operand(b, emit_convert(b, x, dt), r),
                                   emit_const(b, v, dt), dt), r);
  case FK_CLAMP:
    x = y = emit_operand(b, emit_convert(b, x, dt), r);
    if (arg_scalar(&n->no_args[1], &v))
      x = emit_op_dt(b, TN_FI_BINARY, TN_RT_B_CLAMP_MIN, x, emit_const(b, v, dt), dt);
    if (arg_scalar(&n->no_args[2], &v))
      x = emit_op_dt(b, TN_FI_BINARY, TN_RT_B_CLAMP_MAX, x, emit_const(b, v, dt), dt);
    return x == y ? emit_cast(b, x, dt) : x; /* clamp(x, None, None): a copy */
  case FK_COMPARE: {
    int c = arg_dtype(g, &n->no_args[0]);
    y = emit_exact(b, emit_convert(b, bufof[n->no_args[1].u.ar_ref], c));
    x = emit_exact(b, emit_convert(b, x, c));
    int32_t dst = new_buf(b, TN_DTYPE_BOOL, 1);
    emit(b, inst(TN_FI_COMPARE, r.fr_op, dst, x, y, 0));
    return dst;
  }
  case FK_COMPARE_S: {
    /* in the tensor's dtype, the scalar converted to it; a bool tensor
    ** against a number compares as int64 (torch's promotion) */
    int c = arg_dtype(g, &n->no_args[0]);
    arg_scalar(&n->no_args[1], &v);
    if (c == TN_DTYPE_BOOL && n->no_args[1].ar_tag != TN_ARG_BOOL)
      c = TN_DTYPE_INT64;
    x = emit_exact(b, emit_convert(b, x, c));
    int32_t dst = new_buf(b, TN_DTYPE_BOOL, 1);
    emit(b, inst(TN_FI_COMPARE, r.fr_op, dst, x, emit_const(b, tn_rt_round(c, v), c), 0));
    return dst;
  }
  case FK_WHERE: case FK_MASKED: {
    /* where(cond, a, b); masked_fill(self, mask, value) = where(mask, value, self) */
    int masked = r.fr_kind == FK_MASKED;
    int32_t cond = bufof[n->no_args[masked ? 1 : 0].u.ar_ref], a, c;
    if (n->no_op == TN_OP_masked_fill_Scalar) {
      arg_scalar(&n->no_args[2], &v);
      a = emit_const(b, tn_rt_round(dt, v), dt);
    } else {
      a = emit_convert(b, bufof[n->no_args[masked ? 2 : 1].u.ar_ref], dt);
    }
    c = emit_convert(b, bufof[n->no_args[masked ? 0 : 2].u.ar_ref], dt);
    int32_t dst = new_buf(b, dt, b->pb_rc == TN_OK && b->pb_exact[a] && b->pb_exact[c]);
    emit(b, (tn_finst){TN_FI_WHERE, 0, dst, cond, a, c, 0});
    return dst;
  }
  case FK_CAST:
    return emit_cast(b, x, dt);
  case FK_FACTORY:
    factory_value(g, n, &v);
    return emit_const(b, v, dt);
  case FK_GATHER: /* its rows were loaded with the inputs */
    return bufof[n->no_out[0]];
  default:
    return x;
  }
}

static int32_t *heap_ids(tn_fusion *f, uint32_t n)
{
  return mi_heap_calloc(f->fu_heap, n ? n : 1, sizeof(int32_t));
}

/* needed[v] = whether value v must be written: read outside the group
** that makes it, or a graph output. */
static void mark_needed(fuse_state *s, uint8_t *needed)
{
  const tn_graph *g = s->fs_g;
  memset(needed, 0, tn_graph_num_values(g));
  for (uint32_t i = 0; i < tn_graph_num_nodes(g); i++) {
    const tn_node *n = tn_graph_node(g, (int32_t)i);
    uint32_t a = 0, e = 0;
    for (int32_t v; (v = tn_graph_node_input(n, &a, &e)) >= 0;) {
      int32_t p = producer(g, v);
      if (p >= 0 && s->fs_group_of[p] >= 0 && s->fs_group_of[p] != s->fs_group_of[i])
        needed[v] = 1;
    }
  }
  for (uint32_t o = 0; o < tn_graph_num_outputs(g); o++)
    needed[tn_graph_outputs(g)[o]] = 1;
}

/* At least the operands group k's kernel takes (build_group): the values
** it reads from outside (counted once; a gather's table and index once
** more, as they are operands of their own), a GEMM's product, and the
** values it must write (needed). vmark: per value, the stamp of the last
** count that took it (stamp: this count's, never 0). */
static uint32_t group_operands(fuse_state *s, int32_t k, const uint8_t *needed, uint32_t *vmark, uint32_t stamp)
{
  const tn_graph *g = s->fs_g;
  uint32_t count = s->fs_anchor[k] >= 0 && s->fs_rdims[k] < 0 ? 1 : 0;
  for (uint32_t i = (uint32_t)s->fs_first[k]; i < tn_graph_num_nodes(g); i++) {
    if (s->fs_group_of[i] != k)
      continue;
    const tn_node *n = tn_graph_node(g, (int32_t)i);
    if (fuse_rule_of(n->no_op).fr_kind == FK_GATHER)
      count += 2;
    uint32_t a = 0, e = 0;
    for (int32_t v; (v = tn_graph_node_input(n, &a, &e)) >= 0;) {
      int32_t p = producer(g, v);
      if ((p < 0 || s->fs_group_of[p] != k) && vmark[v] != stamp) {
        vmark[v] = stamp;
        count++;
      }
    }
    for (uint32_t o = 0; o < n->no_nout; o++)
      count += needed[n->no_out[o]];
  }
  return count;
}

/* Builds group k's node list, operands and program. */
static int build_group(fuse_state *s, int32_t k, tn_fgroup *grp, int32_t *bufof, int32_t *sof, uint8_t *needed)
{
  const tn_graph *g = s->fs_g;
  tn_fusion *f = s->fs_f;
  uint32_t nn = (uint32_t)s->fs_count[k], nvals = tn_graph_num_values(g);
  prog_builder b = {f, NULL, 0, 0, 0, 0, NULL, NULL, 0, NULL, 0, 0, TN_DTYPE_FLOAT32, TN_OK};
  int32_t anchor = s->fs_anchor[k];
  uint32_t maxargs = 0, maxouts = 0;

  for (uint32_t i = (uint32_t)s->fs_first[k]; i < tn_graph_num_nodes(g); i++)
    if (s->fs_group_of[i] == k) {
      maxargs += tn_graph_node(g, (int32_t)i)->no_nargs;
      maxouts += tn_graph_node(g, (int32_t)i)->no_nout;
    }
  grp->fg_nodes = heap_ids(f, nn);
  grp->fg_inputs = heap_ids(f, maxargs);
  grp->fg_outputs = heap_ids(f, maxouts);
  grp->fg_out_kinds = mi_heap_zalloc(f->fu_heap, maxouts ? maxouts : 1);
  if (!grp->fg_nodes || !grp->fg_inputs || !grp->fg_outputs || !grp->fg_out_kinds)
    return TN_ENOMEM;
  for (uint32_t i = 0, j = 0; i < tn_graph_num_nodes(g); i++)
    if (s->fs_group_of[i] == k)
      grp->fg_nodes[j++] = (int32_t)i;
  grp->fg_nnodes = nn;
  grp->fg_dtype = b.pb_dtype = tn_graph_value(g, tn_graph_node(g, grp->fg_nodes[0])->no_out[0])->va_meta.me_dtype;
  int gemm = anchor >= 0 && s->fs_rdims[k] < 0;
  const tn_node *an = anchor >= 0 ? tn_graph_node(g, anchor) : NULL;
  grp->fg_reduce_dims = anchor >= 0 && !gemm ? s->fs_rdims[k] : 0;
  grp->fg_nonempty = an && (an->no_op == TN_OP_amax || an->no_op == TN_OP_amin || an->no_op == TN_OP_argmax ||
                            an->no_op == TN_OP_argmin);
  grp->fg_gemm_a = grp->fg_gemm_b = -1;
  if (gemm) { /* the product is operand 0, in the place of the node's result */
    int m = an->no_op == TN_OP_addmm || an->no_op == TN_OP_baddbmm ? 1 : 0;
    grp->fg_gemm_a = an->no_args[m].u.ar_ref;
    grp->fg_gemm_b = an->no_args[m + 1].u.ar_ref;
    grp->fg_inputs[grp->fg_ninputs++] = an->no_out[0];
  }

  /* external inputs, first use order; each gets a buffer and a load. A
  ** gather's table and index are operands of their own (never shared):
  ** the table loaded from the row the index picks, the index not loaded */
  grp->fg_gather = heap_ids(f, maxargs);
  grp->fg_gather_dim = heap_ids(f, maxargs);
  int32_t *gathered = heap_ids(f, maxargs); /* a gathered table's operand -> the gather node's result */
  if (!grp->fg_gather || !grp->fg_gather_dim || !gathered)
    return TN_ENOMEM;
  for (uint32_t i = 0; i < maxargs; i++)
    grp->fg_gather[i] = grp->fg_gather_dim[i] = -1;
  for (uint32_t i = 0; i < nn; i++) {
    const tn_node *n = tn_graph_node(g, grp->fg_nodes[i]);
    int t = -1, x = -1;
    if (fuse_rule_of(n->no_op).fr_kind == FK_GATHER) {
      gather_args(n, &t, &x);
      gathered[grp->fg_ninputs] = n->no_out[0];
      grp->fg_gather_dim[grp->fg_ninputs] = gather_dim(g, n);
      grp->fg_gather[grp->fg_ninputs] = (int32_t)grp->fg_ninputs + 1;
      grp->fg_gather[grp->fg_ninputs + 1] = TN_FG_INDEX;
      grp->fg_inputs[grp->fg_ninputs++] = n->no_args[t].u.ar_ref;
      grp->fg_inputs[grp->fg_ninputs++] = n->no_args[x].u.ar_ref;
    }
    for (uint32_t a = 0; a < n->no_nargs; a++) {
      if (n->no_args[a].ar_tag != TN_ARG_TENSOR || (int)a == t || (int)a == x ||
          (gemm && grp->fg_nodes[i] == anchor &&
           a >= (an->no_op == TN_OP_addmm || an->no_op == TN_OP_baddbmm ? 1u : 0u)))
        continue;
      int32_t v = n->no_args[a].u.ar_ref, p = producer(g, v), seen = 0;
      for (uint32_t o = 0; o < grp->fg_ninputs && !seen; o++)
        seen = grp->fg_inputs[o] == v && grp->fg_gather[o] == -1;
      if ((p < 0 || s->fs_group_of[p] != k) && !seen)
        grp->fg_inputs[grp->fg_ninputs++] = v;
    }
  }
  for (uint32_t v = 0; v < nvals; v++)
    bufof[v] = sof[v] = -1;
  for (uint32_t i = 0; i < grp->fg_ninputs; i++) {
    int32_t buf = -1;
    if (grp->fg_gather[i] != TN_FG_INDEX) {
      buf = new_buf(&b, tn_graph_value(g, grp->fg_inputs[i])->va_meta.me_dtype, 1);
      emit(&b, inst(TN_FI_LOAD, 0, buf, (int32_t)i, grp->fg_gather[i], 0));
    }
    if (grp->fg_gather[i] == -1)
      bufof[grp->fg_inputs[i]] = buf;
    else if (grp->fg_gather[i] >= 0) /* the gathered rows are the result of the gather node */
      bufof[gathered[i]] = buf;
  }
  int xrank = anchor >= 0 ? tn_graph_value(g, tn_graph_node(g, anchor)->no_args[0].u.ar_ref)->va_meta.me_rank : 0;
  for (uint32_t i = 0; i < nn; i++) {
    const tn_node *n = tn_graph_node(g, grp->fg_nodes[i]);
    /* a float16/bfloat16 value is rounded to its dtype, as eager stores
    ** each op's result, where a node reads it (a store rounds it anyway):
    ** a chain kept in float32 between ops was up to 3% from eager in
    ** bfloat16 (exp(x * 2 + y)) */
    for (uint32_t a = 0; a < n->no_nargs; a++) {
      int32_t *v = n->no_args[a].ar_tag == TN_ARG_TENSOR ? &bufof[n->no_args[a].u.ar_ref] : NULL;
      if (v && *v >= 0 && narrow_float(buf_dtype(&b, *v)))
        *v = emit_exact(&b, *v);
    }
    if (grp->fg_nodes[i] == anchor && gemm) {
      if (n->no_op == TN_OP_addmm || n->no_op == TN_OP_baddbmm) /* the product plus the bias */
        bufof[n->no_out[0]] = emit_op(&b, TN_FI_BINARY, TN_RT_B_ADD, bufof[n->no_out[0]],
                                      bufof[n->no_args[0].u.ar_ref]);
    } else if (grp->fg_nodes[i] == anchor)
      emit_row(&b, n, bufof, sof);
    else
      bufof[n->no_out[0]] = emit_node(&b, g, n, bufof);
    for (uint32_t o = 0; o < n->no_nout; o++) {
      int32_t v = n->no_out[o];
      if (!needed[v])
        continue;
      uint8_t kind = sof[v] < 0 ? TN_FO_FULL
                   : tn_graph_value(g, v)->va_meta.me_rank == xrank ? TN_FO_KEEPDIM : TN_FO_ROW;
      grp->fg_out_kinds[grp->fg_noutputs] = kind;
      grp->fg_outputs[grp->fg_noutputs++] = v;
    }
  }
  for (uint32_t o = 0; o < grp->fg_noutputs; o++) {
    int32_t v = grp->fg_outputs[o];
    if (grp->fg_out_kinds[o] == TN_FO_FULL)
      emit(&b, inst(TN_FI_STORE, 0, (int32_t)o, bufof[v], -1, 0));
    else
      emit(&b, inst(TN_FI_SSTORE, 0, (int32_t)o, sof[v], -1, 0));
  }
  grp->fg_odtypes = mi_heap_malloc(f->fu_heap, grp->fg_ninputs + grp->fg_noutputs + 1);
  if (!grp->fg_odtypes)
    return TN_ENOMEM;
  for (uint32_t o = 0; o < grp->fg_ninputs + grp->fg_noutputs; o++) {
    int32_t v = o < grp->fg_ninputs ? grp->fg_inputs[o] : grp->fg_outputs[o - grp->fg_ninputs];
    grp->fg_odtypes[o] = (uint8_t)tn_graph_value(g, v)->va_meta.me_dtype;
  }
  grp->fg_bdtypes = b.pb_bdt;
  grp->fg_prog = b.pb_prog;
  grp->fg_nprog = b.pb_n;
  grp->fg_nbufs = b.pb_nbufs;
  grp->fg_nscalars = b.pb_nscalars;
  return b.pb_rc;
}

/* Whether n is a relu or gelu whose input is the float32 result of an
** aten.linear (not lowered: PyTorch runs it) that n alone reads: the
** activation a oneDNN linear takes as its post-op (TN_FUSE_LINEAR_ACT). */
static int linear_activation(const tn_graph *g, const tn_node *n)
{
  if ((n->no_op != TN_OP_relu && n->no_op != TN_OP_gelu) || n->no_args[0].ar_tag != TN_ARG_TENSOR)
    return 0;
  int32_t v = n->no_args[0].u.ar_ref, p = producer(g, v);
  if (p < 0 || tn_graph_node(g, p)->no_op != TN_OP_linear ||
      tn_graph_value(g, v)->va_meta.me_dtype != TN_DTYPE_FLOAT32)
    return 0;
  return sole_reader(g, v) >= 0; /* n alone (it reads v) */
}

/* Sets a pointwise group's cat slots (tn_fgroup.fg_into_*: cat_slot) and
** its donors (tn_fgroup.fg_donor): for each contiguous output of a
** pointwise group without a cat slot, an input of its dtype and shape, once, that another
** group computed (a fresh tensor, contiguous) and that nothing reads but
** that group and this one (k), which runs after it: the buffer the input
** leaves behind can take the output. */
static int find_donors(fuse_state *s, int32_t k, tn_fgroup *grp)
{
  const tn_graph *g = s->fs_g;
  grp->fg_donor = heap_ids(s->fs_f, grp->fg_noutputs);
  grp->fg_into_cat = heap_ids(s->fs_f, grp->fg_noutputs);
  grp->fg_into_dim = heap_ids(s->fs_f, grp->fg_noutputs);
  grp->fg_into_off = mi_heap_calloc(s->fs_f->fu_heap, grp->fg_noutputs ? grp->fg_noutputs : 1, sizeof(int64_t));
  if (!grp->fg_donor || !grp->fg_into_cat || !grp->fg_into_dim || !grp->fg_into_off)
    return TN_ENOMEM;
  for (uint32_t o = 0; o < grp->fg_noutputs; o++)
    grp->fg_donor[o] = grp->fg_into_cat[o] = -1;
  if (grp->fg_reduce_dims || grp->fg_gemm_a >= 0)
    return TN_OK;
  for (uint32_t o = 0; o < grp->fg_noutputs; o++) {
    int dim;
    if (cat_slot(g, grp->fg_outputs[o], &grp->fg_into_cat[o], &dim, &grp->fg_into_off[o]))
      grp->fg_into_dim[o] = dim;
    else
      grp->fg_into_cat[o] = -1;
  }
  for (uint32_t i = 0; i < grp->fg_ninputs; i++) {
    int32_t v = grp->fg_inputs[i], p = producer(g, v), ok = p >= 0 && s->fs_group_of[p] >= 0 &&
                                                            s->fs_group_of[p] != k && grp->fg_gather[i] == -1;
    const tn_meta *vm = &tn_graph_value(g, v)->va_meta;
    ok = ok && meta_contiguous(vm);
    for (uint32_t j = 0; ok && j < grp->fg_ninputs; j++)
      ok = j == i || grp->fg_inputs[j] != v;
    ok = ok && !graph_output(g, v);
    for (uint32_t j = (uint32_t)p + 1; ok && j < tn_graph_num_nodes(g); j++)
      ok = !node_reads(tn_graph_node(g, (int32_t)j), v) || s->fs_group_of[j] == k ||
           s->fs_group_of[j] == s->fs_group_of[p];
    for (uint32_t o = 0; ok && o < grp->fg_noutputs; o++) {
      const tn_meta *wm = &tn_graph_value(g, grp->fg_outputs[o])->va_meta;
      if (grp->fg_donor[o] < 0 && grp->fg_into_cat[o] < 0 && grp->fg_out_kinds[o] == TN_FO_FULL &&
          wm->me_dtype == vm->me_dtype &&
          same_space(wm, vm) && meta_contiguous(wm)) {
        grp->fg_donor[o] = (int32_t)i;
        break;
      }
    }
  }
  return TN_OK;
}

int tn_fuse_graph(const tn_graph *g, int flags, int64_t min_row, tn_fusion **out)
{
  uint32_t nn = tn_graph_num_nodes(g), nv = tn_graph_num_values(g);
  int rc = TN_OK;
  tn_fusion *f = NULL;
  mi_heap_t *heap = mi_heap_new();

  *out = NULL;
  if (!heap)
    return TN_ENOMEM;
  if (!(f = mi_heap_zalloc(heap, sizeof *f))) {
    mi_heap_destroy(heap);
    return TN_ENOMEM;
  }
  f->fu_heap = heap;
  fuse_state s = {f, g, heap_ids(f, nn), heap_ids(f, nn), heap_ids(f, nn), heap_ids(f, nn),
                  mi_heap_zalloc(heap, nn ? nn : 1), 0, mi_heap_calloc(heap, nn ? nn : 1, sizeof(uint32_t)),
                  heap_ids(f, nn), 0};
  int32_t *bufof = heap_ids(f, nv), *sof = heap_ids(f, nv);
  int32_t *renum = heap_ids(f, nn);
  uint8_t *needed = mi_heap_zalloc(heap, nv ? nv : 1);
  uint32_t *vmark = mi_heap_calloc(heap, nv ? nv : 1, sizeof(uint32_t)), stamp = 0;
  if (!s.fs_group_of || !s.fs_first || !s.fs_count || !s.fs_anchor || !s.fs_rdims || !s.fs_seen || !s.fs_stack ||
      !bufof || !sof || !renum || !needed || !vmark) {
    mi_heap_destroy(heap);
    return TN_ENOMEM;
  }

  for (uint32_t i = 0; i < nn; i++)
    s.fs_group_of[i] = -1;
  for (uint32_t i = 0; i < nn; i++) {
    const tn_node *n = tn_graph_node(g, (int32_t)i);
    if (!fusable(g, n) || ((flags & TN_FUSE_LINEAR_ACT) && linear_activation(g, n)))
      continue;
    for (uint32_t a = 0; a < n->no_nargs && s.fs_group_of[i] < 0; a++) {
      if (n->no_args[a].ar_tag != TN_ARG_TENSOR)
        continue;
      int32_t p = producer(g, n->no_args[a].u.ar_ref);
      if (p >= 0 && s.fs_group_of[p] >= 0)
        may_join(&s, i, s.fs_group_of[p]);
    }
    if (s.fs_group_of[i] < 0) {
      int32_t k = (int32_t)s.fs_ngroups++;
      s.fs_first[k] = (int32_t)i;
      s.fs_count[k] = 1;
      s.fs_anchor[k] = -1;
      s.fs_group_of[i] = k;
    }
  }
  for (uint32_t i = 0; (flags & TN_FUSE_ROWS) && i < nn; i++) {
    int k;
    const tn_node *n = tn_graph_node(g, (int32_t)i);
    if (s.fs_group_of[i] < 0 && row_reducible(g, n, &k) && row_long_enough(g, n, k, min_row) &&
        (!(flags & TN_FUSE_AUTO_ROWS) || rows_auto(g, n, k)))
      form_row_group(&s, i, k);
  }

  for (uint32_t i = 0; (flags & TN_FUSE_GEMM) && i < nn; i++)
    if (s.fs_group_of[i] < 0 && gemm_lowerable(g, tn_graph_node(g, (int32_t)i)))
      form_gemm_group(&s, i);

  for (uint32_t i = 0; i < nn; i++) { /* argmax / argmin: a row kernel each, without row_fusion too */
    int k;
    if (s.fs_group_of[i] < 0 && argreduce_lowerable(g, tn_graph_node(g, (int32_t)i), &k)) {
      int32_t r = (int32_t)s.fs_ngroups++;
      s.fs_first[r] = (int32_t)i;
      s.fs_count[r] = 1;
      s.fs_anchor[r] = (int32_t)i;
      s.fs_rdims[r] = (int8_t)k;
      s.fs_group_of[i] = r;
    }
  }

  /* single-node pointwise groups stay with eager (but those feeding a cat) */
  for (uint32_t k = 0; k < s.fs_ngroups; k++) /* kept (0: numbered below) or not (-1) */
    renum[k] = s.fs_count[k] >= 2 || (s.fs_anchor[k] >= 0 && s.fs_count[k] >= 1) ||
               (s.fs_count[k] == 1 && feeds_cat(&s, (int32_t)k)) ? 0 : -1;
  for (uint32_t i = 0; i < nn; i++)
    if (s.fs_group_of[i] >= 0 && renum[s.fs_group_of[i]] < 0)
      s.fs_group_of[i] = -1;
  for (uint32_t i = 0; i < nn; i++)
    absorb_factory(&s, i);

  /* a kernel takes at most TN_LAUNCH_MAX_OPERANDS tensors: a group that would take more (a sum of 64 cached
  ** tensors) leaves its nodes to PyTorch, and what the other groups must write is counted again */
  for (int dissolved = 1; dissolved;) {
    mark_needed(&s, needed);
    dissolved = 0;
    for (uint32_t k = 0; k < s.fs_ngroups; k++)
      if (renum[k] >= 0 && group_operands(&s, (int32_t)k, needed, vmark, ++stamp) > TN_LAUNCH_MAX_OPERANDS) {
        for (uint32_t i = 0; i < nn; i++)
          if (s.fs_group_of[i] == (int32_t)k)
            s.fs_group_of[i] = -1;
        renum[k] = -1;
        dissolved = 1;
      }
  }
  uint32_t kept = 0; /* the groups kept, numbered */
  for (uint32_t k = 0; k < s.fs_ngroups; k++)
    if (renum[k] >= 0)
      renum[k] = (int32_t)kept++;

  f->fu_groups = mi_heap_calloc(heap, kept ? kept : 1, sizeof(tn_fgroup));
  if (!f->fu_groups)
    rc = TN_ENOMEM;
  for (uint32_t k = 0; rc == TN_OK && k < s.fs_ngroups; k++)
    if (renum[k] >= 0 && (rc = build_group(&s, (int32_t)k, &f->fu_groups[renum[k]], bufof, sof, needed)) == TN_OK)
      rc = find_donors(&s, (int32_t)k, &f->fu_groups[renum[k]]);
  f->fu_ngroups = kept;
  if (rc != TN_OK) {
    mi_heap_destroy(heap);
    return rc;
  }
  *out = f;
  return TN_OK;
}

uint32_t tn_fusion_count(const tn_fusion *f) { return f->fu_ngroups; }

const tn_fgroup *tn_fusion_group(const tn_fusion *f, uint32_t i)
{
  return i < f->fu_ngroups ? &f->fu_groups[i] : NULL;
}

void tn_fusion_free(tn_fusion *f)
{
  if (f)
    mi_heap_destroy(f->fu_heap); /* f itself lives in the heap */
}
