/*
** The op table: every ATen overload the graph IR knows by id, with its
** argument signature, output count and class. The builder validates nodes
** against it; the lowering (later) dispatches on it. Anything else enters the
** graph as TN_OP_fallback with its qualified name as the node's target.
**
** Signature letters, one per schema argument in schema order (keyword-only
** arguments included, defaults spelled out by the caller):
**   T tensor        t tensor or None     L tensor list   O list of tensors or None
**   s scalar (int, float, bool or symbol)            S scalar or None
**   i int           I int or None        l int list   M int list or None
**   z int or symbol Z int, symbol or None            y int list that may hold symbols
**   b bool          B bool or None       f float
**   c string        C string or None
**   d dtype or None o layout or None     v device or None   m memory format or None
** Outputs: a count, or -1 for "any number" (split_with_sizes).
*/
#ifndef TN_GRAPH_OPS_H
#define TN_GRAPH_OPS_H

/* Op classes: what validation (and later lowering) may assume. */
#define TN_OPC_FALLBACK  0  /* anything: run through torch.ops eagerly */
#define TN_OPC_POINTWISE 1  /* elementwise over the broadcast of its tensor args */
#define TN_OPC_FACTORY   2  /* creates a tensor from scalars */
#define TN_OPC_REDUCE    3  /* reduction over dims */
#define TN_OPC_NORM      4  /* softmax family and layer norm: reduce + pointwise */
#define TN_OPC_VIEW      5  /* view or copy that moves data without arithmetic */
#define TN_OPC_INDEX     6  /* gathers by index tensors */
#define TN_OPC_MATMUL    7  /* GEMM family */

/* _(id, qualified name, signature, outputs, class) */
#define TN_OP_DEF(_) \
  _(fallback,              "fallback",                  "",        -1, TN_OPC_FALLBACK) \
  /* pointwise, unary */ \
  _(abs,                   "aten::abs",                 "T",        1, TN_OPC_POINTWISE) \
  _(neg,                   "aten::neg",                 "T",        1, TN_OPC_POINTWISE) \
  _(exp,                   "aten::exp",                 "T",        1, TN_OPC_POINTWISE) \
  _(log,                   "aten::log",                 "T",        1, TN_OPC_POINTWISE) \
  _(log1p,                 "aten::log1p",               "T",        1, TN_OPC_POINTWISE) \
  _(expm1,                 "aten::expm1",               "T",        1, TN_OPC_POINTWISE) \
  _(sqrt,                  "aten::sqrt",                "T",        1, TN_OPC_POINTWISE) \
  _(rsqrt,                 "aten::rsqrt",               "T",        1, TN_OPC_POINTWISE) \
  _(relu,                  "aten::relu",                "T",        1, TN_OPC_POINTWISE) \
  _(sigmoid,               "aten::sigmoid",             "T",        1, TN_OPC_POINTWISE) \
  _(tanh,                  "aten::tanh",                "T",        1, TN_OPC_POINTWISE) \
  _(silu,                  "aten::silu",                "T",        1, TN_OPC_POINTWISE) \
  _(erf,                   "aten::erf",                 "T",        1, TN_OPC_POINTWISE) \
  _(sin,                   "aten::sin",                 "T",        1, TN_OPC_POINTWISE) \
  _(cos,                   "aten::cos",                 "T",        1, TN_OPC_POINTWISE) \
  _(logical_not,           "aten::logical_not",         "T",        1, TN_OPC_POINTWISE) \
  _(gelu,                  "aten::gelu",                "Tc",       1, TN_OPC_POINTWISE) \
  _(to_copy,               "aten::_to_copy",            "TdovBbm",  1, TN_OPC_POINTWISE) \
  /* pointwise, binary and ternary */ \
  _(add_Tensor,            "aten::add.Tensor",          "TTs",      1, TN_OPC_POINTWISE) \
  _(add_Scalar,            "aten::add.Scalar",          "Tss",      1, TN_OPC_POINTWISE) \
  _(sub_Tensor,            "aten::sub.Tensor",          "TTs",      1, TN_OPC_POINTWISE) \
  _(sub_Scalar,            "aten::sub.Scalar",          "Tss",      1, TN_OPC_POINTWISE) \
  _(mul_Tensor,            "aten::mul.Tensor",          "TT",       1, TN_OPC_POINTWISE) \
  _(mul_Scalar,            "aten::mul.Scalar",          "Ts",       1, TN_OPC_POINTWISE) \
  _(div_Tensor,            "aten::div.Tensor",          "TT",       1, TN_OPC_POINTWISE) \
  _(div_Scalar,            "aten::div.Scalar",          "Ts",       1, TN_OPC_POINTWISE) \
  _(div_Tensor_mode,       "aten::div.Tensor_mode",     "TTC",      1, TN_OPC_POINTWISE) \
  _(pow_Tensor_Scalar,     "aten::pow.Tensor_Scalar",   "Ts",       1, TN_OPC_POINTWISE) \
  _(pow_Tensor_Tensor,     "aten::pow.Tensor_Tensor",   "TT",       1, TN_OPC_POINTWISE) \
  _(pow_Scalar,            "aten::pow.Scalar",          "sT",       1, TN_OPC_POINTWISE) \
  _(clamp,                 "aten::clamp",               "TSS",      1, TN_OPC_POINTWISE) \
  _(clamp_Tensor,          "aten::clamp.Tensor",        "Ttt",      1, TN_OPC_POINTWISE) \
  _(clamp_min,             "aten::clamp_min",           "Ts",       1, TN_OPC_POINTWISE) \
  _(clamp_max,             "aten::clamp_max",           "Ts",       1, TN_OPC_POINTWISE) \
  _(where_self,            "aten::where.self",          "TTT",      1, TN_OPC_POINTWISE) \
  _(eq_Tensor,             "aten::eq.Tensor",           "TT",       1, TN_OPC_POINTWISE) \
  _(eq_Scalar,             "aten::eq.Scalar",           "Ts",       1, TN_OPC_POINTWISE) \
  _(ne_Tensor,             "aten::ne.Tensor",           "TT",       1, TN_OPC_POINTWISE) \
  _(ne_Scalar,             "aten::ne.Scalar",           "Ts",       1, TN_OPC_POINTWISE) \
  _(lt_Tensor,             "aten::lt.Tensor",           "TT",       1, TN_OPC_POINTWISE) \
  _(lt_Scalar,             "aten::lt.Scalar",           "Ts",       1, TN_OPC_POINTWISE) \
  _(le_Tensor,             "aten::le.Tensor",           "TT",       1, TN_OPC_POINTWISE) \
  _(le_Scalar,             "aten::le.Scalar",           "Ts",       1, TN_OPC_POINTWISE) \
  _(gt_Tensor,             "aten::gt.Tensor",           "TT",       1, TN_OPC_POINTWISE) \
  _(gt_Scalar,             "aten::gt.Scalar",           "Ts",       1, TN_OPC_POINTWISE) \
  _(ge_Tensor,             "aten::ge.Tensor",           "TT",       1, TN_OPC_POINTWISE) \
  _(ge_Scalar,             "aten::ge.Scalar",           "Ts",       1, TN_OPC_POINTWISE) \
  _(logical_and,           "aten::logical_and",         "TT",       1, TN_OPC_POINTWISE) \
  _(logical_or,            "aten::logical_or",          "TT",       1, TN_OPC_POINTWISE) \
  _(maximum,               "aten::maximum",             "TT",       1, TN_OPC_POINTWISE) \
  _(minimum,               "aten::minimum",             "TT",       1, TN_OPC_POINTWISE) \
  _(masked_fill_Scalar,    "aten::masked_fill.Scalar",  "TTs",      1, TN_OPC_POINTWISE) \
  _(masked_fill_Tensor,    "aten::masked_fill.Tensor",  "TTT",      1, TN_OPC_POINTWISE) \
  /* factories */ \
  _(full,                  "aten::full",                "ysdovB",   1, TN_OPC_FACTORY) \
  _(scalar_tensor,         "aten::scalar_tensor",       "sdovB",    1, TN_OPC_FACTORY) \
  _(arange,                "aten::arange",              "sdovB",    1, TN_OPC_FACTORY) \
  _(arange_start,          "aten::arange.start",        "ssdovB",   1, TN_OPC_FACTORY) \
  _(arange_start_step,     "aten::arange.start_step",   "sssdovB",  1, TN_OPC_FACTORY) \
  /* reductions */ \
  _(sum,                   "aten::sum",                 "Td",       1, TN_OPC_REDUCE) \
  _(sum_dim_IntList,       "aten::sum.dim_IntList",     "TMbd",     1, TN_OPC_REDUCE) \
  _(mean,                  "aten::mean",                "Td",       1, TN_OPC_REDUCE) \
  _(mean_dim,              "aten::mean.dim",            "TMbd",     1, TN_OPC_REDUCE) \
  _(amax,                  "aten::amax",                "Tlb",      1, TN_OPC_REDUCE) \
  _(amin,                  "aten::amin",                "Tlb",      1, TN_OPC_REDUCE) \
  _(var_correction,        "aten::var.correction",      "TMSb",     1, TN_OPC_REDUCE) \
  _(argmax,                "aten::argmax",              "TIb",      1, TN_OPC_REDUCE) \
  _(argmin,                "aten::argmin",              "TIb",      1, TN_OPC_REDUCE) \
  _(logsumexp,             "aten::logsumexp",           "Tlb",      1, TN_OPC_REDUCE) \
  _(softmax,               "aten::_softmax",            "Tib",      1, TN_OPC_NORM) \
  _(log_softmax,           "aten::_log_softmax",        "Tib",      1, TN_OPC_NORM) \
  _(native_layer_norm,     "aten::native_layer_norm",   "Tyttf",    3, TN_OPC_NORM) \
  /* views and copies */ \
  _(view,                  "aten::view",                "Ty",       1, TN_OPC_VIEW) \
  _(unsafe_view,           "aten::_unsafe_view",        "Ty",       1, TN_OPC_VIEW) \
  _(reshape,               "aten::reshape",             "Ty",       1, TN_OPC_VIEW) \
  _(permute,               "aten::permute",             "Tl",       1, TN_OPC_VIEW) \
  _(transpose_int,         "aten::transpose.int",       "Tii",      1, TN_OPC_VIEW) \
  _(t,                     "aten::t",                   "T",        1, TN_OPC_VIEW) \
  _(expand,                "aten::expand",              "Tyb",      1, TN_OPC_VIEW) \
  _(squeeze,               "aten::squeeze",             "T",        1, TN_OPC_VIEW) \
  _(squeeze_dim,           "aten::squeeze.dim",         "Ti",       1, TN_OPC_VIEW) \
  _(squeeze_dims,          "aten::squeeze.dims",        "Tl",       1, TN_OPC_VIEW) \
  _(unsqueeze,             "aten::unsqueeze",           "Ti",       1, TN_OPC_VIEW) \
  _(slice_Tensor,          "aten::slice.Tensor",        "TiZZz",    1, TN_OPC_VIEW) \
  _(select_int,            "aten::select.int",          "Tiz",      1, TN_OPC_VIEW) \
  _(clone,                 "aten::clone",               "Tm",       1, TN_OPC_VIEW) \
  _(cat,                   "aten::cat",                 "Li",       1, TN_OPC_VIEW) \
  _(split_with_sizes,      "aten::split_with_sizes",    "Tyi",     -1, TN_OPC_VIEW) \
  /* gathers */ \
  _(embedding,             "aten::embedding",           "TTzbb",    1, TN_OPC_INDEX) \
  _(index_select,          "aten::index_select",        "TiT",      1, TN_OPC_INDEX) \
  _(gather,                "aten::gather",              "TiTb",     1, TN_OPC_INDEX) \
  /* matmul */ \
  _(mm,                    "aten::mm",                  "TT",       1, TN_OPC_MATMUL) \
  _(bmm,                   "aten::bmm",                 "TT",       1, TN_OPC_MATMUL) \
  _(addmm,                 "aten::addmm",               "TTTss",    1, TN_OPC_MATMUL) \
  _(baddbmm,               "aten::baddbmm",             "TTTss",    1, TN_OPC_MATMUL) \
  /* appended later: ids are part of the graph encoding, so new ops go last */ \
  _(bitwise_and_Tensor,    "aten::bitwise_and.Tensor",  "TT",       1, TN_OPC_POINTWISE) \
  _(bitwise_or_Tensor,     "aten::bitwise_or.Tensor",   "TT",       1, TN_OPC_POINTWISE) \
  _(bitwise_xor_Tensor,    "aten::bitwise_xor.Tensor",  "TT",       1, TN_OPC_POINTWISE) \
  _(bitwise_not,           "aten::bitwise_not",         "T",        1, TN_OPC_POINTWISE) \
  _(bitwise_and_Scalar,    "aten::bitwise_and.Scalar",  "Ts",       1, TN_OPC_POINTWISE) \
  _(bitwise_or_Scalar,     "aten::bitwise_or.Scalar",   "Ts",       1, TN_OPC_POINTWISE) \
  _(bitwise_xor_Scalar,    "aten::bitwise_xor.Scalar",  "Ts",       1, TN_OPC_POINTWISE) \
  _(reciprocal,            "aten::reciprocal",          "T",        1, TN_OPC_POINTWISE) \
  _(floor,                 "aten::floor",               "T",        1, TN_OPC_POINTWISE) \
  _(ceil,                  "aten::ceil",                "T",        1, TN_OPC_POINTWISE) \
  _(trunc,                 "aten::trunc",               "T",        1, TN_OPC_POINTWISE) \
  _(round,                 "aten::round",               "T",        1, TN_OPC_POINTWISE) \
  _(sign,                  "aten::sign",                "T",        1, TN_OPC_POINTWISE) \
  /* known by id so that passes name it, not lowered: PyTorch (MKL or oneDNN) runs it */ \
  _(linear,                "aten::linear",              "TTt",      1, TN_OPC_FALLBACK)

typedef enum tn_op {
#define TN_OP_ENUM(id, name, sig, nout, cls) TN_OP_##id,
  TN_OP_DEF(TN_OP_ENUM)
#undef TN_OP_ENUM
  TN_OP__COUNT
} tn_op;

/* Number of ops in the table (TN_OP__COUNT). */
int tn_op_count(void);

/* Op id of a qualified name ("aten::add.Tensor"), or -1. */
int tn_op_find(const char *name);

/* Static metadata of op (must be < TN_OP__COUNT). */
const char *tn_op_name(int op);
const char *tn_op_signature(int op);
int tn_op_outputs(int op);
int tn_op_class(int op);

#endif /* TN_GRAPH_OPS_H */
