/*
** C code generation for fused kernel programs (see codegen.h).
*/
#include "codegen.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "runtime.h"
#include "runtime_ops.h"

typedef struct cg_buf {
  char *cb_text;
  size_t cb_len, cb_cap;
  int cb_rc;
} cg_buf;

static void out(cg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(cg_buf *b, const char *fmt, ...)
{
  va_list ap;
  if (b->cb_rc != TN_OK)
    return;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(b->cb_text + b->cb_len, b->cb_cap - b->cb_len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < b->cb_cap - b->cb_len) {
      b->cb_len += (size_t)n;
      return;
    }
    size_t cap = b->cb_cap * 2 + (size_t)(n > 0 ? n : 0);
    char *t = realloc(b->cb_text, cap);
    if (!t) {
      b->cb_rc = TN_ENOMEM;
      return;
    }
    b->cb_text = t;
    b->cb_cap = cap;
  }
}

/* -- Types ------------------------------------------------------------------
** Operands are tensors of any dtype we compute; buffers are blocks of its
** compute type: float (float32, float16, bfloat16), double (float64), i64
** (integers) or unsigned char (bool). */

typedef struct cg_dtype {
  int cd_dtype;
  const char *cd_elem;  /* C type of a tensor element */
  const char *cd_io;    /* suffix of the runtime's loads and stores */
  const char *cd_ctype; /* C type of a block element */
  const char *cd_fn;    /* suffix of the runtime's ops on those blocks */
  int cd_size;          /* bytes per tensor element */
} cg_dtype;

static const cg_dtype cg_dtypes[] = {
  {TN_DTYPE_FLOAT32, "float", "f32", "float", "f32", 4},
  {TN_DTYPE_FLOAT16, "unsigned short", "f16", "float", "f32", 2},
  {TN_DTYPE_BFLOAT16, "unsigned short", "bf16", "float", "f32", 2},
  {TN_DTYPE_FLOAT64, "double", "f64", "double", "f64", 8},
  {TN_DTYPE_INT64, "i64", "i64", "i64", "i64", 8},
  {TN_DTYPE_INT32, "int", "i32", "i64", "i64", 4},
  {TN_DTYPE_INT16, "short", "i16", "i64", "i64", 2},
  {TN_DTYPE_INT8, "signed char", "i8", "i64", "i64", 1},
  {TN_DTYPE_UINT8, "unsigned char", "u8", "i64", "i64", 1},
  {TN_DTYPE_BOOL, "unsigned char", "b8", "unsigned char", "b8", 1},
};

/* The entry of dtype dt (fusion makes groups of these dtypes only). */
static const cg_dtype *cg_type(int dt)
{
  for (size_t i = 0; i < sizeof cg_dtypes / sizeof cg_dtypes[0]; i++)
    if (cg_dtypes[i].cd_dtype == dt)
      return &cg_dtypes[i];
  return &cg_dtypes[0];
}

/* Of operand k and of buffer v. */
static const cg_dtype *cg_otype(const tn_fgroup *grp, uint32_t k)
{
  return cg_type(grp->fg_odtypes[k]);
}

static const cg_dtype *cg_btype(const tn_fgroup *grp, int32_t v)
{
  return cg_type(grp->fg_bdtypes[v]);
}

/* Whether operand k is read and written in place: its elements are its
** blocks' type (float32, float64, int64, bool). */
static int cg_native(const tn_fgroup *grp, uint32_t k)
{
  const cg_dtype *t = cg_otype(grp, k);
  return strcmp(t->cd_elem, t->cd_ctype) == 0;
}

/* Whether input operand k is an output's donor (tn_fgroup.fg_donor): the
** output may be written into its buffer, so its loads copy, never alias. */
static int cg_donor(const tn_fgroup *grp, uint32_t k)
{
  for (uint32_t o = 0; grp->fg_donor && o < grp->fg_noutputs; o++)
    if (grp->fg_donor[o] == (int32_t)k)
      return 1;
  return 0;
}

/* Whether load fi reads an element gather's table (aten.gather): each
** element from the place its index picks, not whole rows. */
static int cg_element_gather(const tn_fgroup *grp, const tn_finst *fi)
{
  return fi->fi_kind == TN_FI_LOAD && fi->fi_b >= 0 && grp->fg_gather_dim && grp->fg_gather_dim[fi->fi_a] >= 0;
}

/* Operand k's pointer, typed: "((float *)p[3])". */
static const char *cg_opnd(const tn_fgroup *grp, uint32_t k, char *tmp)
{
  snprintf(tmp, 48, "((%s *)p[%u])", cg_otype(grp, k)->cd_elem, k);
  return tmp;
}

/* A constant of a block of type t as a C expression (non-finite values
** through their bits: a literal cannot spell them). */
static const char *cg_lit(const cg_dtype *t, double v, char *tmp)
{
  if (isfinite(v)) {
    snprintf(tmp, 64, "(%s)%a", t->cd_ctype, v);
  } else {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    snprintf(tmp, 64, "(%s)tn_bits(0x%llxULL)", t->cd_ctype, (unsigned long long)u);
  }
  return tmp;
}

/* Declares the operands' pointers (char *p[]) and element sizes (isz[]). */
static void cg_operands(cg_buf *b, const tn_fgroup *grp)
{
  uint32_t nops = grp->fg_ninputs + grp->fg_noutputs;
  out(b, "  char *p[%u];\n  i64 isz[%u] = {", nops, nops);
  for (uint32_t k = 0; k < nops; k++)
    out(b, "%s%d", k ? ", " : "", cg_otype(grp, k)->cd_size);
  out(b, "};\n");
}

static const char *cg_signature =
  "void tn_kernel(i64 rank, const i64 *sizes, void **ptrs, const i64 *st, i64 cols, const i64 *cst)\n{\n";

/* Whether instruction kind k computes a buffer from others (and may then
** write it straight into an output). */
static int cg_computes(int k)
{
  return k == TN_FI_UNARY || k == TN_FI_BINARY || k == TN_FI_COMPARE || k == TN_FI_WHERE || k == TN_FI_CAST;
}

/* The instruction that defines each buffer (buffers are assigned once). */
static const tn_finst **cg_defs(const tn_fgroup *grp)
{
  const tn_finst **def = calloc(grp->fg_nbufs + 1, sizeof *def);
  if (!def)
    return NULL;
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (fi->fi_kind == TN_FI_LOAD || fi->fi_kind == TN_FI_CONST || fi->fi_kind == TN_FI_SPLAT ||
        cg_computes(fi->fi_kind))
      def[fi->fi_dst] = fi;
  }
  return def;
}

/* Whether buffer v is read as a scalar (a constant or a splat row scalar)
** by binary instructions that take it second. */
static int cg_scalar_buf(const tn_finst *const *def, int32_t v)
{
  return def[v] && (def[v]->fi_kind == TN_FI_CONST || def[v]->fi_kind == TN_FI_SPLAT);
}

/* The output operand (index among all operands) that buffer v is stored
** to, when the op that computes v may write it there in place: the
** output's elements are v's block type. Else -1. */
static int cg_store_of(const tn_fgroup *grp, const tn_finst *const *def, int32_t v)
{
  if (!def[v] || !cg_computes(def[v]->fi_kind))
    return -1;
  for (uint32_t i = 0; i < grp->fg_nprog; i++)
    if (grp->fg_prog[i].fi_kind == TN_FI_STORE && grp->fg_prog[i].fi_a == v) {
      uint32_t k = grp->fg_ninputs + (uint32_t)grp->fg_prog[i].fi_dst;
      return cg_native(grp, k) ? (int)k : -1;
    }
  return -1;
}

/* A buffer as an expression: loaded operands are pointers (L), which point
** into the tensor itself where a native operand has unit stride; stored
** ones too (S), pointing into the output where it has unit stride. */
static const char *cg_ref(const tn_fgroup *grp, const tn_finst *const *def, int32_t v, char *tmp)
{
  char c = def[v] && def[v]->fi_kind == TN_FI_LOAD ? 'L' : cg_store_of(grp, def, v) >= 0 ? 'S' : 'b';
  snprintf(tmp, 24, "%c%d", c, v);
  return tmp;
}

/* Before the op computing a stored buffer: where it writes (cond: the
** output has unit stride, a format taking the operand index (twice, once
** or not at all); at: the output's place then). */
static void cg_dst(cg_buf *b, const tn_fgroup *grp, const tn_finst *const *def, int32_t v, const char *ind,
                   const char *cond, const char *at)
{
  char t[48];
  int k = cg_store_of(grp, def, v);
  if (k >= 0) {
    out(b, "%sS%d = ", ind, v);
    out(b, cond, k, k);
    out(b, " ? %s%s : b%d;\n", cg_opnd(grp, (uint32_t)k, t), at, v);
  }
}

static int cg_second_only(const tn_fgroup *grp, int32_t v);

/* Whether buffer v, loaded from a pointwise kernel's native operand, is
** read only as the second operand of binary ops and comparisons: where the
** operand's innermost stride is 0 (a value per outer position: a bias per
** channel, a row's scalar) they take it as a scalar and the block is never
** filled. */
static int cg_row_scalar(const tn_fgroup *grp, const tn_finst *const *def, int32_t v)
{
  if (!def[v] || def[v]->fi_kind != TN_FI_LOAD || def[v]->fi_b >= 0 || !cg_native(grp, (uint32_t)def[v]->fi_a) ||
      grp->fg_reduce_dims > 0 || cg_donor(grp, (uint32_t)def[v]->fi_a))
    return 0;
  int any = 0;
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    int second = (fi->fi_kind == TN_FI_BINARY || fi->fi_kind == TN_FI_COMPARE) && fi->fi_b == v;
    int other = (fi->fi_kind == TN_FI_UNARY || fi->fi_kind == TN_FI_BINARY || fi->fi_kind == TN_FI_COMPARE ||
                 fi->fi_kind == TN_FI_CAST || fi->fi_kind == TN_FI_STORE || fi->fi_kind == TN_FI_REDUCE) &&
                fi->fi_a == v;
    if (other || (fi->fi_kind == TN_FI_WHERE && (fi->fi_a == v || fi->fi_b == v || fi->fi_c == v)))
      return 0;
    any |= second;
  }
  return any;
}

/* A computing instruction over a block (n elements, row scalars r<k>) or,
** with tile, over a tile of tn rows of cols (row scalars R<k>[], and a
** weight row G-flagged as broadcast over the tile). ind indents; a result
** stored in place goes to the output when cond (on the output's operand
** index) holds, at p[k]<at>. */
static void cg_arith(cg_buf *b, const tn_fgroup *grp, const tn_finst *const *def, const tn_finst *fi, int tile,
                     const char *ind, const char *cond, const char *at)
{
  const char *n = tile ? "tn * cols" : "n";
  const cg_dtype *dt = cg_btype(grp, fi->fi_dst), *at_ = cg_btype(grp, fi->fi_a);
  char t1[24], t2[24], t3[24], t4[24], lit[64];
  const tn_finst *bdef = fi->fi_b >= 0 ? def[fi->fi_b] : NULL;
  cg_dst(b, grp, def, fi->fi_dst, ind, cond, at);
  cg_ref(grp, def, fi->fi_dst, t3);
  cg_ref(grp, def, fi->fi_a, t1);
  switch (fi->fi_kind) {
  case TN_FI_UNARY:
    out(b, "%stn_rt_unary_%s(%d, %s, %s, %s);\n", ind, dt->cd_fn, fi->fi_op, t3, t1, n);
    return;
  case TN_FI_CAST:
    out(b, "%stn_rt_cast(%d, %d, %s, %s, %s);\n", ind, dt->cd_dtype, at_->cd_dtype, t3, t1, n);
    return;
  case TN_FI_WHERE:
    out(b, "%stn_rt_where_%s(%s, %s, %s, %s, %s);\n", ind, dt->cd_fn, t3, t1, cg_ref(grp, def, fi->fi_b, t2),
        cg_ref(grp, def, fi->fi_c, t4), n);
    return;
  case TN_FI_COMPARE:
    if (bdef && bdef->fi_kind == TN_FI_CONST) {
      out(b, "%stn_rt_compare_s_%s(%d, %s, %s, %s, %s);\n", ind, at_->cd_fn, fi->fi_op, t3, t1,
          cg_lit(at_, bdef->fi_value, lit), n);
      return;
    }
    if (!tile && cond[0] == 's' && cg_row_scalar(grp, def, fi->fi_b))
      out(b, "%sif (s[%d] == 0) tn_rt_compare_s_%s(%d, %s, %s, *(%s *)p[%d], %s); else ", ind, bdef->fi_a,
          at_->cd_fn, fi->fi_op, t3, t1, at_->cd_ctype, bdef->fi_a, n);
    out(b, "%stn_rt_compare_%s(%d, %s, %s, %s, %s);\n", ind, at_->cd_fn, fi->fi_op, t3, t1,
        cg_ref(grp, def, fi->fi_b, t2), n);
    return;
  default:
    break;
  }
  cg_ref(grp, def, fi->fi_b, t2);
  if (!tile && cond[0] == 's' && cg_row_scalar(grp, def, fi->fi_b))
    out(b, "%sif (s[%d] == 0) tn_rt_binary_s_%s(%d, %s, %s, *(%s *)p[%d], %s); else\n", ind, bdef->fi_a, dt->cd_fn,
        fi->fi_op, t3, t1, dt->cd_ctype, bdef->fi_a, n);
  if (cg_scalar_buf(def, fi->fi_b) && bdef->fi_kind == TN_FI_CONST)
    out(b, "%stn_rt_binary_s_%s(%d, %s, %s, %s, %s);\n", ind, dt->cd_fn, fi->fi_op, t3, t1,
        cg_lit(dt, bdef->fi_value, lit), n);
  else if (cg_scalar_buf(def, fi->fi_b) && tile)
    out(b, "%stn_rt_binary_rs_f32(%d, %s, %s, R%d, tn, cols);\n", ind, fi->fi_op, t3, t1, bdef->fi_a);
  else if (cg_scalar_buf(def, fi->fi_b))
    out(b, "%stn_rt_binary_s_f32(%d, %s, %s, r%d, n);\n", ind, fi->fi_op, t3, t1, bdef->fi_a);
  else if (tile && grp->fg_dtype == TN_DTYPE_FLOAT32 && bdef && bdef->fi_kind == TN_FI_LOAD &&
           cg_second_only(grp, fi->fi_b))
    out(b, "%sif (G%d) tn_rt_binary_rb_f32(%d, %s, %s, %s, tn, cols);\n%selse tn_rt_binary_f32(%d, %s, %s, %s, %s);\n",
        ind, fi->fi_b, fi->fi_op, t3, t1, t2, ind, fi->fi_op, t3, t1, t2, n);
  else
    out(b, "%stn_rt_binary_%s(%d, %s, %s, %s, %s);\n", ind, dt->cd_fn, fi->fi_op, t3, t1, t2, n);
}

/* The statement of one in-block instruction (stv: the array of innermost
** strides); other kinds emit nothing. */
static void cg_block_inst(cg_buf *b, const tn_fgroup *grp, const tn_finst *const *def, const tn_finst *fi,
                          const char *stv)
{
  uint32_t k = grp->fg_ninputs + (uint32_t)fi->fi_dst;
  char t1[24], t3[24], o[48];
  switch (fi->fi_kind) {
  case TN_FI_LOAD:
    cg_opnd(grp, (uint32_t)fi->fi_a, o);
    if (cg_element_gather(grp, fi)) { /* each element from the place its index picks (then converted) */
      int native = cg_native(grp, (uint32_t)fi->fi_a);
      if (native)
        snprintf(t1, sizeof t1, "b%d", fi->fi_dst);
      out(b, "      tn_rt_gather(%s, p[%d] + j * %s[%d] * isz[%d], %s[%d] * isz[%d], p[%d] + j * %s[%d] * isz[%d], "
          "%s[%d] * isz[%d], isz[%d], cst[%d] * isz[%d], isz[%d], n);\n", native ? t1 : "gt", fi->fi_a, stv, fi->fi_a,
          fi->fi_a, stv, fi->fi_a, fi->fi_a, fi->fi_b, stv, fi->fi_b, fi->fi_b, stv, fi->fi_b, fi->fi_b, fi->fi_b,
          fi->fi_a, fi->fi_a, fi->fi_a);
      if (!native)
        out(b, "      tn_rt_load_%s(b%d, (%s *)gt, 1, n);\n", cg_otype(grp, (uint32_t)fi->fi_a)->cd_io, fi->fi_dst,
            cg_otype(grp, (uint32_t)fi->fi_a)->cd_elem);
      out(b, "      L%d = b%d;\n", fi->fi_dst, fi->fi_dst);
      break;
    }
    if (cg_native(grp, (uint32_t)fi->fi_a) && !cg_donor(grp, (uint32_t)fi->fi_a))
      out(b, "      if (%s[%d] == 1) L%d = %s + j; else ", stv, fi->fi_a, fi->fi_dst, o);
    if (stv[0] == 's' && cg_row_scalar(grp, def, fi->fi_dst)) /* its readers take *p as a scalar */
      out(b, "if (%s[%d] != 0) ", stv, fi->fi_a);
    out(b, "      { tn_rt_load_%s(b%d, %s + j * %s[%d], %s[%d], n); L%d = b%d; }\n",
        cg_otype(grp, (uint32_t)fi->fi_a)->cd_io, fi->fi_dst, o, stv, fi->fi_a, stv, fi->fi_a, fi->fi_dst,
        fi->fi_dst);
    break;
  case TN_FI_UNARY: case TN_FI_BINARY: case TN_FI_COMPARE: case TN_FI_WHERE: case TN_FI_CAST:
    cg_arith(b, grp, def, fi, 0, "      ", stv[0] == 's' ? "s[%d] == 1" : "cst[%d] == 1", " + j");
    break;
  case TN_FI_REDUCE:
    out(b, "      a%d = tn_rt_combine(%d, a%d, tn_rt_reduce_f32(%d, %s, n));\n", fi->fi_dst, fi->fi_op, fi->fi_dst,
        fi->fi_op, cg_ref(grp, def, fi->fi_a, t3));
    break;
  case TN_FI_STORE:
    cg_opnd(grp, k, o);
    if (cg_store_of(grp, def, fi->fi_a) == (int)k)
      out(b, "      if (S%d != %s + j) ", fi->fi_a, o);
    out(b, "      tn_rt_store_%s(%s + j * %s[%u], %s[%u], %s, n);\n", cg_otype(grp, k)->cd_io, o, stv, k, stv, k,
        cg_ref(grp, def, fi->fi_a, t1));
    break;
  default:
    break;
  }
}

/* The statement of one instruction over a tile: tr rows of `inner`
** elements along the iteration space's last two dims, operand k's rows
** rs[k] elements apart, its elements s[k] apart; ts[k] is 1 where they
** are one contiguous run (read and written in place), else 2. */
static void cg_tile_inst(cg_buf *b, const tn_fgroup *grp, const tn_finst *const *def, const tn_finst *fi)
{
  int io = fi->fi_kind == TN_FI_LOAD || fi->fi_kind == TN_FI_STORE;
  uint32_t k = fi->fi_kind == TN_FI_STORE ? grp->fg_ninputs + (uint32_t)fi->fi_dst : (uint32_t)fi->fi_a;
  const cg_dtype *ot = io ? cg_otype(grp, k) : NULL;
  char t1[24], o[48];
  if (io)
    cg_opnd(grp, k, o);
  switch (fi->fi_kind) {
  case TN_FI_LOAD:
    if (cg_native(grp, k) && !cg_donor(grp, k))
      out(b, "        if (ts[%u] == 1) L%d = %s; else\n", k, fi->fi_dst, o);
    out(b, "        { tn_rt_load2d_%s(b%d, %s, rs[%u], s[%u], tr, inner); L%d = b%d; }\n", ot->cd_io, fi->fi_dst, o, k, k,
        fi->fi_dst, fi->fi_dst);
    break;
  case TN_FI_UNARY: case TN_FI_BINARY: case TN_FI_COMPARE: case TN_FI_WHERE: case TN_FI_CAST:
    cg_arith(b, grp, def, fi, 0, "        ", "ts[%d] == 1", "");
    break;
  case TN_FI_STORE:
    if (cg_store_of(grp, def, fi->fi_a) == (int)k)
      out(b, "        if (S%d != %s) ", fi->fi_a, o);
    out(b, "        tn_rt_store2d_%s(%s, rs[%u], s[%u], %s, tr, inner);\n", ot->cd_io, o, k, k, cg_ref(grp, def, fi->fi_a, t1));
    break;
  default:
    break;
  }
}

/* Whether a pointwise kernel may run over tiles of rows (cg_tile_inst):
** no gathers, whose rows are picked per outer position. */
static int cg_tileable(const tn_fgroup *grp)
{
  for (uint32_t i = 0; i < grp->fg_nprog; i++)
    if (grp->fg_prog[i].fi_kind == TN_FI_LOAD && grp->fg_prog[i].fi_b >= 0)
      return 0;
  return 1;
}

/* Declares the block buffers (and the pointers of loaded ones). */
static void cg_buffers(cg_buf *b, const tn_fgroup *grp, const tn_finst *const *def)
{
  for (uint32_t k = 0; k < grp->fg_nbufs; k++) {
    const char *ct = cg_btype(grp, (int32_t)k)->cd_ctype;
    out(b, "  %s b%u[%d];\n", ct, k, TN_RT_BLOCK);
    if (def[k] && def[k]->fi_kind == TN_FI_LOAD)
      out(b, "  %s *L%u;\n", ct, k);
    if (cg_store_of(grp, def, (int32_t)k) >= 0)
      out(b, "  %s *S%u;\n", ct, k);
  }
}

/* Fills the constant buffers (once per launch; most are read as literals). */
static void cg_consts(cg_buf *b, const tn_fgroup *grp)
{
  char lit[64];
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    const cg_dtype *t = fi->fi_kind == TN_FI_CONST ? cg_btype(grp, fi->fi_dst) : NULL;
    if (t)
      out(b, "  tn_rt_fill_%s(b%d, %s, %d);\n", t->cd_fn, fi->fi_dst, cg_lit(t, fi->fi_value, lit), TN_RT_BLOCK);
  }
}

/* Sets p[k] to operand k's place at this outer position, q[k] (the
** odometer's), moved for gathers of rows to the row their index picks. */
static void cg_places(cg_buf *b, const tn_fgroup *grp, const char *ind)
{
  out(b, "%sfor (k = 0; k < %u; k++) p[k] = q[k];\n", ind, grp->fg_ninputs + grp->fg_noutputs);
  for (uint32_t i = 0; i < grp->fg_nprog; i++) { /* gathers: the row the index picks */
    const tn_finst *fi = &grp->fg_prog[i];
    if (fi->fi_kind == TN_FI_LOAD && fi->fi_b >= 0 && !cg_element_gather(grp, fi))
      out(b, "%sp[%d] += (i64)*(%s *)p[%d] * cst[%d] * isz[%d];\n", ind, fi->fi_a,
          cg_otype(grp, (uint32_t)fi->fi_b)->cd_elem, fi->fi_b, fi->fi_a, fi->fi_a);
  }
}

/* The odometer over dims rank - from down to 0: moves the places q[] of
** the nops operands by the strides, instead of recomputing them. */
static void cg_odometer(cg_buf *b, uint32_t nops, int from, const char *ind)
{
  out(b, "%sfor (d = rank - %d; d >= 0; d--) {\n", ind, from);
  out(b, "%s  for (k = 0; k < %u; k++) q[k] += st[k * rank + d] * isz[k];\n", ind, nops);
  out(b, "%s  if (++idx[d] < sizes[d]) break;\n", ind);
  out(b, "%s  for (k = 0; k < %u; k++) q[k] -= st[k * rank + d] * isz[k] * sizes[d];\n", ind, nops);
  out(b, "%s  idx[d] = 0;\n%s}\n", ind, ind);
}

static void cg_pointwise(cg_buf *b, const tn_fgroup *grp)
{
  uint32_t nops = grp->fg_ninputs + grp->fg_noutputs;
  const tn_finst **def = cg_defs(grp);
  if (!def) {
    b->cb_rc = TN_ENOMEM;
    return;
  }
  out(b, "%s", cg_signature);
  cg_buffers(b, grp, def);
  cg_operands(b, grp);
  out(b, "  char *q[%u];\n  i64 s[%u];\n  i64 idx[64];\n", nops, nops);
  for (uint32_t i = 0; i < grp->fg_nprog; i++)
    if (cg_element_gather(grp, &grp->fg_prog[i]) && !cg_native(grp, (uint32_t)grp->fg_prog[i].fi_a)) {
      /* gathered elements before their conversion */
      out(b, "  i64 gt[%d];\n", TN_RT_BLOCK);
      break;
    }
  out(b, "  i64 inner = rank ? sizes[rank - 1] : 1, outer = 1, d, k, o, j, n;\n");
  out(b, "  for (d = 0; d + 1 < rank; d++) { outer *= sizes[d]; idx[d] = 0; }\n");
  out(b, "  if (inner == 0 || outer == 0) return;\n");
  cg_consts(b, grp);
  out(b, "  for (k = 0; k < %u; k++) { s[k] = rank ? st[k * rank + rank - 1] : 0; q[k] = (char *)ptrs[k]; }\n",
      nops);
  if (cg_tileable(grp)) {
    /* short rows (128 elements at most): a block holds a tile of them, so each op runs once per tile,
    ** not once per row (rows of 64 at (8, 12, 128, 64): eager/ours 0.73 -> 0.98; from 256 on, the
    ** copies into the tile cost more than the calls they save) */
    out(b, "  if (rank >= 2 && inner * 8 <= %d) {\n", TN_RT_BLOCK);
    out(b, "    i64 rows = sizes[rank - 2], rmax = %d / inner, r0, tr, rs[%u], ts[%u];\n", TN_RT_BLOCK, nops, nops);
    out(b, "    outer /= rows;\n");
    out(b, "    for (k = 0; k < %u; k++) { rs[k] = st[k * rank + rank - 2]; ts[k] = s[k] == 1 && rs[k] == inner ? 1 : 2; }\n",
        nops);
    out(b, "    for (o = 0; o < outer; o++) {\n");
    out(b, "      for (r0 = 0; r0 < rows; r0 += tr) {\n");
    out(b, "        tr = rows - r0 < rmax ? rows - r0 : rmax;\n        n = tr * inner;\n");
    out(b, "        for (k = 0; k < %u; k++) p[k] = q[k] + r0 * rs[k] * isz[k];\n", nops);
    for (uint32_t i = 0; i < grp->fg_nprog; i++)
      cg_tile_inst(b, grp, def, &grp->fg_prog[i]);
    out(b, "      }\n");
    cg_odometer(b, nops, 3, "      ");
    out(b, "    }\n    return;\n  }\n");
  }
  out(b, "  for (o = 0; o < outer; o++) {\n");
  cg_places(b, grp, "    ");
  out(b, "    for (j = 0; j < inner; j += %d) {\n", TN_RT_BLOCK);
  out(b, "      n = inner - j < %d ? inner - j : %d;\n", TN_RT_BLOCK, TN_RT_BLOCK);
  for (uint32_t i = 0; i < grp->fg_nprog; i++)
    cg_block_inst(b, grp, def, &grp->fg_prog[i], "s");
  out(b, "    }\n");
  cg_odometer(b, nops, 2, "    ");
  out(b, "  }\n}\n");
  free(def);
}

/* -- Row kernels ----------------------------------------------------------- */

/* Levels: a buffer's level is the highest phase whose scalars it needs; a
** reduction of a level-L buffer runs in phase L and gives a level L+1
** scalar. */
typedef struct cg_rows {
  const tn_fgroup *cr_grp;
  int *cr_blv, *cr_slv;    /* level of each buffer / scalar */
  int *cr_inst_lv;         /* phase of each instruction (buffers: the level of its result) */
  uint8_t *cr_need;        /* per instruction, in the phase being emitted */
  uint8_t *cr_done;        /* scalar instructions and scalar stores already emitted */
  const tn_finst **cr_def;  /* defining instruction of each buffer */
  uint8_t *cr_have;         /* buffers computed by an earlier phase (single-block rows) */
} cg_rows;

static void cg_levels(cg_rows *r)
{
  const tn_fgroup *grp = r->cr_grp;
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    int lv = 0;
    switch (fi->fi_kind) {
    case TN_FI_UNARY: case TN_FI_CAST: lv = r->cr_blv[fi->fi_a]; r->cr_blv[fi->fi_dst] = lv; break;
    case TN_FI_BINARY:
      lv = r->cr_blv[fi->fi_a] > r->cr_blv[fi->fi_b] ? r->cr_blv[fi->fi_a] : r->cr_blv[fi->fi_b];
      r->cr_blv[fi->fi_dst] = lv;
      break;
    case TN_FI_LOAD: case TN_FI_CONST: r->cr_blv[fi->fi_dst] = 0; break;
    case TN_FI_SPLAT: lv = r->cr_slv[fi->fi_a]; r->cr_blv[fi->fi_dst] = lv; break;
    case TN_FI_REDUCE: lv = r->cr_blv[fi->fi_a]; r->cr_slv[fi->fi_dst] = lv + 1; break;
    case TN_FI_SCONST: case TN_FI_SCOLS: r->cr_slv[fi->fi_dst] = 0; break;
    case TN_FI_SUNARY: lv = r->cr_slv[fi->fi_a]; r->cr_slv[fi->fi_dst] = lv; break;
    case TN_FI_SBINARY:
      lv = r->cr_slv[fi->fi_a] > r->cr_slv[fi->fi_b] ? r->cr_slv[fi->fi_a] : r->cr_slv[fi->fi_b];
      r->cr_slv[fi->fi_dst] = lv;
      break;
    case TN_FI_STORE: lv = r->cr_blv[fi->fi_a]; break;
    case TN_FI_SSTORE: lv = r->cr_slv[fi->fi_a]; break;
    default: break;
    }
    r->cr_inst_lv[i] = lv;
  }
}

static const char *t2_unary_expr(int op);
static const char *t2_binary_expr(int op);

/* Emits the scalar instructions and per-row stores whose scalars exist
** once phase `avail` - 1 has ended; io is the stores' suffix, or NULL for
** tier 2 (expressions; its row kernels are float32). */
static void cg_scalars(cg_buf *b, cg_rows *r, int avail, const char *io)
{
  const tn_fgroup *grp = r->cr_grp;
  char o[48];
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (r->cr_done[i] || r->cr_inst_lv[i] > avail)
      continue;
    switch (fi->fi_kind) {
    case TN_FI_SCONST: out(b, "    r%d = (float)%a;\n", fi->fi_dst, fi->fi_value); break;
    case TN_FI_SCOLS: out(b, "    r%d = (float)cols;\n", fi->fi_dst); break;
    case TN_FI_SUNARY:
      if (!io)
        out(b, "    { float x = r%d; r%d = (%s); }\n", fi->fi_a, fi->fi_dst, t2_unary_expr(fi->fi_op));
      else
        out(b, "    tn_rt_unary_f32(%d, &r%d, &r%d, 1);\n", fi->fi_op, fi->fi_dst, fi->fi_a);
      break;
    case TN_FI_SBINARY:
      if (!io)
        out(b, "    { float x = r%d, y = r%d; r%d = (%s); }\n", fi->fi_a, fi->fi_b, fi->fi_dst,
            t2_binary_expr(fi->fi_op));
      else
        out(b, "    tn_rt_binary_f32(%d, &r%d, &r%d, &r%d, 1);\n", fi->fi_op, fi->fi_dst, fi->fi_a, fi->fi_b);
      break;
    case TN_FI_SSTORE:
      if (!io)
        out(b, "    *%s = r%d;\n", cg_opnd(grp, grp->fg_ninputs + (uint32_t)fi->fi_dst, o), fi->fi_a);
      else
        out(b, "    tn_rt_store_%s(%s, 0, &r%d, 1);\n", io, cg_opnd(grp, grp->fg_ninputs + (uint32_t)fi->fi_dst, o),
            fi->fi_a);
      break;
    default:
      continue;
    }
    r->cr_done[i] = 1;
  }
}

/* Marks in cr_need the instructions of phase ph's pass over the row: the
** reductions and stores of level-ph buffers, with everything they need
** (with persist, not what earlier phases computed: cr_have). Returns
** whether there are any. */
static int cg_phase_need(cg_rows *r, int ph, int persist)
{
  const tn_fgroup *grp = r->cr_grp;
  uint32_t n = grp->fg_nprog;
  int any = 0;
  uint8_t *bufneed = r->cr_need + n; /* per buffer */
  memset(r->cr_need, 0, n + grp->fg_nbufs);
  for (uint32_t i = n; i-- > 0;) {
    const tn_finst *fi = &grp->fg_prog[i];
    int root = (fi->fi_kind == TN_FI_REDUCE || fi->fi_kind == TN_FI_STORE) && r->cr_blv[fi->fi_a] == ph;
    int producer = fi->fi_kind == TN_FI_LOAD || fi->fi_kind == TN_FI_UNARY || fi->fi_kind == TN_FI_BINARY ||
                   fi->fi_kind == TN_FI_SPLAT || fi->fi_kind == TN_FI_CONST || fi->fi_kind == TN_FI_CAST;
    if (!root && !(producer && bufneed[fi->fi_dst] && !(persist && r->cr_have[fi->fi_dst])))
      continue;
    r->cr_need[i] = 1;
    any = 1;
    if (fi->fi_kind != TN_FI_LOAD && fi->fi_kind != TN_FI_CONST && fi->fi_kind != TN_FI_SPLAT) {
      bufneed[fi->fi_a] = 1;
      if (fi->fi_kind == TN_FI_BINARY && !cg_scalar_buf(r->cr_def, fi->fi_b))
        bufneed[fi->fi_b] = 1;
    }
  }
  return any;
}

/* One pass over the row for phase ph: the reductions of level-ph buffers
** and the stores of level-ph buffers, with everything they need. With
** persist (rows of one block), buffers computed by earlier phases still
** hold their values and are not recomputed. */
static void cg_phase(cg_buf *b, cg_rows *r, int ph, int persist)
{
  const tn_fgroup *grp = r->cr_grp;
  uint32_t n = grp->fg_nprog;
  if (!cg_phase_need(r, ph, persist))
    return;
  for (uint32_t i = 0; i < n; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (!r->cr_need[i])
      continue;
    if (fi->fi_kind == TN_FI_REDUCE)
      out(b, "    a%d = tn_rt_reduce_f32(%d, 0, 0);\n", fi->fi_dst, fi->fi_op);
    else if (fi->fi_kind == TN_FI_SPLAT)
      out(b, "    tn_rt_fill_f32(b%d, r%d, cols < %d ? cols : %d);\n", fi->fi_dst, fi->fi_a, TN_RT_BLOCK,
          TN_RT_BLOCK);
  }
  out(b, "    for (j = 0; j < cols; j += %d) {\n", TN_RT_BLOCK);
  out(b, "      n = cols - j < %d ? cols - j : %d;\n", TN_RT_BLOCK, TN_RT_BLOCK);
  for (uint32_t i = 0; i < n; i++)
    if (r->cr_need[i])
      cg_block_inst(b, grp, r->cr_def, &grp->fg_prog[i], "cst");
  out(b, "    }\n");
  for (uint32_t i = 0; i < n; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (r->cr_need[i] && fi->fi_kind == TN_FI_REDUCE)
      out(b, fi->fi_op == TN_RT_R_MEAN ? "    r%d = (float)(a%d / (double)cols);\n" : "    r%d = (float)a%d;\n",
          fi->fi_dst, fi->fi_dst);
    else if (r->cr_need[i] && fi->fi_kind != TN_FI_STORE)
      r->cr_have[fi->fi_dst] = 1;
  }
}

/* Whether buffer v is read as a whole buffer (not as the scalar operand of
** a binary op). */
static int cg_read_whole(const tn_fgroup *grp, const tn_finst *const *def, int32_t v)
{
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    switch (fi->fi_kind) {
    case TN_FI_UNARY: case TN_FI_CAST: case TN_FI_REDUCE: case TN_FI_STORE:
      if (fi->fi_a == v)
        return 1;
      break;
    case TN_FI_BINARY:
      if (fi->fi_a == v || (fi->fi_b == v && !cg_scalar_buf(def, v)))
        return 1;
      break;
    default:
      break;
    }
  }
  return 0;
}

/* Whether buffer v is read only as the second operand of binary ops. */
static int cg_second_only(const tn_fgroup *grp, int32_t v)
{
  int any = 0;
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    int reads_a = (fi->fi_kind == TN_FI_UNARY || fi->fi_kind == TN_FI_BINARY || fi->fi_kind == TN_FI_REDUCE ||
                   fi->fi_kind == TN_FI_STORE || fi->fi_kind == TN_FI_CAST) && fi->fi_a == v;
    if (reads_a)
      return 0;
    any |= fi->fi_kind == TN_FI_BINARY && fi->fi_b == v;
  }
  return any;
}

/* Rows short enough that several fit in a block run as tiles of tn rows:
** every instruction runs once per tile, in program order (a row's values
** never leave the block), per-row scalars are arrays R<k>[tn]. */
static void cg_rows_tiles(cg_buf *b, cg_rows *r, const char *io)
{
  const tn_fgroup *grp = r->cr_grp;
  const tn_finst *const *def = r->cr_def;
  uint32_t nops = grp->fg_ninputs + grp->fg_noutputs;
  char t1[24], o[48];
  out(b, "  if (rank >= 1 && cols > 0 && cols * 2 <= %d) {\n", TN_RT_BLOCK);
  for (uint32_t k = 0; k < grp->fg_nbufs; k++)
    if (grp->fg_dtype == TN_DTYPE_FLOAT32 && def[k] && def[k]->fi_kind == TN_FI_LOAD && cg_second_only(grp, (int32_t)k))
      out(b, "    int G%u = 0;\n", k);
  out(b, "    i64 T = %d / cols, inner = sizes[rank - 1], t0, tn, rs[%u];\n", TN_RT_BLOCK, nops);
  out(b, "    if (T > %d) T = %d;\n", TN_RT_TILE_ROWS, TN_RT_TILE_ROWS);
  out(b, "    outer = 1;\n    for (d = 0; d + 1 < rank; d++) outer *= sizes[d];\n");
  out(b, "    for (k = 0; k < %u; k++) rs[k] = st[k * rank + rank - 1];\n", nops);
  out(b, "    for (o = 0; o < outer; o++) {\n");
  out(b, "      for (t0 = 0; t0 < inner; t0 += T) {\n");
  out(b, "        tn = inner - t0 < T ? inner - t0 : T;\n");
  out(b, "        for (k = 0; k < %u; k++) {\n", nops);
  out(b, "          i64 off = t0 * rs[k];\n");
  out(b, "          for (d = 0; d + 1 < rank; d++) off += idx[d] * st[k * rank + d];\n");
  out(b, "          p[k] = (char *)ptrs[k] + off * isz[k];\n        }\n");
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    uint32_t k = grp->fg_ninputs + (uint32_t)fi->fi_dst;
    if (fi->fi_kind == TN_FI_LOAD)
      cg_opnd(grp, (uint32_t)fi->fi_a, o);
    else if (fi->fi_kind == TN_FI_STORE || fi->fi_kind == TN_FI_SSTORE)
      cg_opnd(grp, k, o);
    switch (fi->fi_kind) {
    case TN_FI_LOAD:
      if (grp->fg_dtype == TN_DTYPE_FLOAT32 && cg_second_only(grp, fi->fi_dst)) {
        /* one row broadcast over the tile (a weight): read it in place */
        out(b, "        G%d = cst[%d] == 1 && rs[%d] == 0;\n", fi->fi_dst, fi->fi_a, fi->fi_a);
        out(b, "        if (G%d) L%d = %s; else\n", fi->fi_dst, fi->fi_dst, o);
      }
      if (grp->fg_dtype == TN_DTYPE_FLOAT32)
        out(b, "        if (cst[%d] == 1 && rs[%d] == cols) L%d = %s; else\n", fi->fi_a, fi->fi_a, fi->fi_dst, o);
      out(b, "        { tn_rt_load2d_%s(b%d, %s, rs[%d], cst[%d], tn, cols); L%d = b%d; }\n", io, fi->fi_dst, o,
          fi->fi_a, fi->fi_a, fi->fi_dst, fi->fi_dst);
      break;
    case TN_FI_UNARY: case TN_FI_BINARY: case TN_FI_CAST: /* a cast rounds a float16/bfloat16 row result */
      cg_arith(b, grp, def, fi, 1, "        ", "cst[%d] == 1 && rs[%d] == cols", "");
      break;
    case TN_FI_SPLAT:
      if (cg_read_whole(grp, def, fi->fi_dst))
        out(b, "        tn_rt_splat_rows_f32(b%d, R%d, tn, cols);\n", fi->fi_dst, fi->fi_a);
      break;
    case TN_FI_REDUCE:
      out(b, "        tn_rt_reduce_rows_f32(%d, R%d, %s, tn, cols);\n", fi->fi_op, fi->fi_dst, cg_ref(grp, def, fi->fi_a, t1));
      break;
    case TN_FI_SCONST:
      out(b, "        tn_rt_fill_f32(R%d, (float)%a, tn);\n", fi->fi_dst, fi->fi_value);
      break;
    case TN_FI_SCOLS:
      out(b, "        tn_rt_fill_f32(R%d, (float)cols, tn);\n", fi->fi_dst);
      break;
    case TN_FI_SUNARY:
      out(b, "        tn_rt_unary_f32(%d, R%d, R%d, tn);\n", fi->fi_op, fi->fi_dst, fi->fi_a);
      break;
    case TN_FI_SBINARY:
      out(b, "        tn_rt_binary_f32(%d, R%d, R%d, R%d, tn);\n", fi->fi_op, fi->fi_dst, fi->fi_a, fi->fi_b);
      break;
    case TN_FI_STORE:
      if (cg_store_of(grp, def, fi->fi_a) == (int)k)
        out(b, "        if (S%d != %s)\n", fi->fi_a, o);
      out(b, "        tn_rt_store2d_%s(%s, rs[%u], cst[%u], %s, tn, cols);\n", io, o, k, k,
          cg_ref(grp, def, fi->fi_a, t1));
      break;
    case TN_FI_SSTORE:
      out(b, "        tn_rt_store_%s(%s, rs[%u], R%d, tn);\n", io, o, k, fi->fi_a);
      break;
    default:
      break;
    }
  }
  out(b, "      }\n");
  out(b, "      for (d = rank - 2; d >= 0; d--) { if (++idx[d] < sizes[d]) break; idx[d] = 0; }\n");
  out(b, "    }\n    return;\n  }\n");
}

/* A row kernel's counters: outer (rows), the odometer idx[] over the
** rows' dims, and the loop variables. */
static void cg_rows_counters(cg_buf *b)
{
  out(b, "  i64 idx[64];\n");
  out(b, "  i64 outer = 1, d, k, o, j, n;\n");
  out(b, "  for (d = 0; d < rank; d++) { outer *= sizes[d]; idx[d] = 0; }\n");
}

/* Opens the loop over rows: p[k] is each of the nops operands' place in
** row o. */
static void cg_row_places(cg_buf *b, uint32_t nops)
{
  out(b, "  for (o = 0; o < outer; o++) {\n");
  out(b, "    for (k = 0; k < %u; k++) {\n", nops);
  out(b, "      i64 off = 0;\n");
  out(b, "      for (d = 0; d < rank; d++) off += idx[d] * st[k * rank + d];\n");
  out(b, "      p[k] = (char *)ptrs[k] + off * isz[k];\n    }\n");
}

/* Closes the loop over rows (the odometer moves to the next) and the
** kernel (tier 2's returning 0: done). */
static void cg_row_next(cg_buf *b, int tier2)
{
  out(b, "    for (d = rank - 1; d >= 0; d--) { if (++idx[d] < sizes[d]) break; idx[d] = 0; }\n");
  out(b, "  }\n%s}\n", tier2 ? "  return 0;\n" : "");
}

/* Frees what cg_rows_open allocated (NULL pointers are fine). */
static void cg_rows_close(cg_rows *r)
{
  free(r->cr_blv);
  free(r->cr_slv);
  free(r->cr_inst_lv);
  free(r->cr_need);
  free(r->cr_done);
  free((void *)r->cr_def);
  free(r->cr_have);
  memset(r, 0, sizeof *r);
}

/* Fills r for grp (its levels computed) and returns the number of phases,
** or -1 when memory ran out (r is then closed already). */
static int cg_rows_open(const tn_fgroup *grp, cg_rows *r)
{
  uint32_t n = grp->fg_nprog;
  int phases = 0;
  *r = (cg_rows){grp, calloc(grp->fg_nbufs + 1, sizeof(int)), calloc(grp->fg_nscalars + 1, sizeof(int)),
                 calloc(n + 1, sizeof(int)), calloc(n + grp->fg_nbufs + 1, 1), calloc(n + 1, 1), cg_defs(grp),
                 calloc(grp->fg_nbufs + 1, 1)};
  if (!r->cr_blv || !r->cr_slv || !r->cr_inst_lv || !r->cr_need || !r->cr_done || !r->cr_def || !r->cr_have) {
    cg_rows_close(r);
    return -1;
  }
  cg_levels(r);
  for (uint32_t i = 0; i < n; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if ((fi->fi_kind == TN_FI_REDUCE || fi->fi_kind == TN_FI_STORE) && r->cr_blv[fi->fi_a] + 1 > phases)
      phases = r->cr_blv[fi->fi_a] + 1;
  }
  return phases;
}

static void cg_rows_body(cg_buf *b, const tn_fgroup *grp)
{
  uint32_t nops = grp->fg_ninputs + grp->fg_noutputs, n = grp->fg_nprog;
  const char *io = cg_type(grp->fg_dtype)->cd_io;
  int phases = 0;
  cg_rows r;
  phases = cg_rows_open(grp, &r);
  if (phases < 0) {
    b->cb_rc = TN_ENOMEM;
    goto done;
  }
  out(b, "%s", cg_signature);
  cg_buffers(b, grp, r.cr_def);
  for (uint32_t k = 0; k < grp->fg_nscalars; k++)
    out(b, "  float r%u = 0, R%u[%d]; double a%u = 0;\n", k, k, TN_RT_TILE_ROWS, k);
  cg_operands(b, grp);
  cg_rows_counters(b);
  cg_consts(b, grp);
  cg_rows_tiles(b, &r, io);
  cg_row_places(b, nops);
  for (int persist = 1; persist >= 0; persist--) {
    out(b, persist ? "    if (cols <= %d) {\n" : "    } else {\n", TN_RT_BLOCK);
    memset(r.cr_done, 0, n + 1);
    memset(r.cr_have, 0, grp->fg_nbufs + 1);
    for (int ph = 0; ph < phases; ph++) {
      cg_scalars(b, &r, ph, io);
      cg_phase(b, &r, ph, persist);
    }
    cg_scalars(b, &r, phases, io);
  }
  out(b, "    }\n");
  cg_row_next(b, 0);
done:
  cg_rows_close(&r);
}

/* The REDUCE of an argmax / argmin group's program, or NULL. */
static const tn_finst *cg_argreduce_of(const tn_fgroup *grp)
{
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (fi->fi_kind == TN_FI_REDUCE && (fi->fi_op == TN_RT_R_ARGMAX || fi->fi_op == TN_RT_R_ARGMIN))
      return fi;
  }
  return NULL;
}

/* An argmax / argmin kernel (program: LOAD, REDUCE, SSTORE of an int64
** index per row): per row, the blocks' first extremes folded by
** tn_rt_argreduce_*, read in place where the input is native and unit
** strided. */
static void cg_argreduce(cg_buf *b, const tn_fgroup *grp, const tn_finst *red)
{
  const tn_finst **def = cg_defs(grp);
  if (!def) {
    b->cb_rc = TN_ENOMEM;
    return;
  }
  const tn_finst *load = def[red->fi_a];
  const cg_dtype *t = cg_btype(grp, red->fi_a);
  uint32_t x = (uint32_t)load->fi_a, nops = grp->fg_ninputs + grp->fg_noutputs, res = grp->fg_ninputs;
  char o[48];
  out(b, "%s", cg_signature);
  out(b, "  %s b0[%d], best = 0, *L;\n  i64 at;\n", t->cd_ctype, TN_RT_BLOCK);
  cg_operands(b, grp);
  cg_rows_counters(b);
  cg_row_places(b, nops);
  out(b, "    at = -1;\n");
  out(b, "    for (j = 0; j < cols; j += %d) {\n", TN_RT_BLOCK);
  out(b, "      n = cols - j < %d ? cols - j : %d;\n", TN_RT_BLOCK, TN_RT_BLOCK);
  cg_opnd(grp, x, o);
  if (cg_native(grp, x))
    out(b, "      if (cst[%u] == 1) L = %s + j; else\n", x, o);
  out(b, "      { tn_rt_load_%s(b0, %s + j * cst[%u], cst[%u], n); L = b0; }\n", cg_otype(grp, x)->cd_io, o, x, x);
  out(b, "      tn_rt_argreduce_%s(%d, L, n, j, &best, &at);\n    }\n", t->cd_fn, red->fi_op);
  out(b, "    *(i64 *)p[%u] = at;\n", res);
  cg_row_next(b, 0);
  free(def);
}

int tn_codegen_kernel(const tn_fgroup *grp, char **src)
{
  cg_buf b = {malloc(4096), 0, 4096, TN_OK};

  *src = NULL;
  if (!b.cb_text)
    return TN_ENOMEM;
  b.cb_text[0] = 0;
  out(&b, "%s", tn_rt_prototypes());
  const tn_finst *arg = grp->fg_reduce_dims > 0 ? cg_argreduce_of(grp) : NULL;
  if (arg)
    cg_argreduce(&b, grp, arg);
  else if (grp->fg_reduce_dims > 0)
    cg_rows_body(&b, grp);
  else
    cg_pointwise(&b, grp);
  if (b.cb_rc != TN_OK) {
    free(b.cb_text);
    return b.cb_rc;
  }
  *src = b.cb_text;
  return TN_OK;
}

/* -- Tier 2 -------------------------------------------------------------------
** The same program as one fused loop per pass, for an optimising compiler:
** every value of an element lives in a variable of the loop, so a
** pointwise chain reads its inputs and writes its outputs once, and a row
** kernel makes one pass per phase with its reductions inside it (the
** loop's `omp simd reduction` clauses; sums in double as tier 1's), keeping
** what a later phase reads in a row buffer where the row fits (T2_KEEP).
** A pass goes over blocks of whole multiples of T2_LANES elements (`omp
** simd`, so math calls go to libmvec's vector versions), the last few of a
** row through copies padded to T2_LANES, so every element takes the vector
** path (a value gives the same result wherever it lies). Inputs broadcast
** along the pass (stride 0) are read from a block filled once per row;
** other strides are left to tier 1 (tn_kernel2 returns 1, and the caller
** runs tier 1's tn_kernel). Compile with -fno-trapping-math: without it
** the compiler will not turn the NaN-aware selects into vector blends. */

#define T2_LANES 16

static const char *t2_unary_expr(int op)
{
  switch (op) {
#define T2_UNARY(name, expr) case TN_RT_##name: return #expr;
  TN_RT_F32_UNARY_EXPR(T2_UNARY)
#undef T2_UNARY
  default: return NULL;
  }
}

static const char *t2_binary_expr(int op)
{
  switch (op) {
#define T2_BINARY(name, expr) case TN_RT_B_##name: return #expr;
  TN_RT_FLOAT_BINARY_EXPR(T2_BINARY)
#undef T2_BINARY
  default: return NULL;
  }
}

static const char *t2_compare_op(int op)
{
  switch (op) {
#define T2_COMPARE(name, cmp) case TN_RT_C_##name: return #cmp;
  TN_RT_COMPARE_OPS(T2_COMPARE)
#undef T2_COMPARE
  default: return NULL;
  }
}

/* The binary op that folds reduction op's values, or 0 (argmax, argmin). */
static int t2_fold_op(int op)
{
  switch (op) {
  case TN_RT_R_SUM: case TN_RT_R_MEAN: return TN_RT_B_ADD;
  case TN_RT_R_MAX: return TN_RT_B_MAXIMUM;
  case TN_RT_R_MIN: return TN_RT_B_MINIMUM;
  default: return 0;
  }
}

/* The prelude's function suffix of a float16/bfloat16 dtype, else NULL. */
static const char *t2_half(int dt)
{
  return dt == TN_DTYPE_FLOAT16 ? "f16" : dt == TN_DTYPE_BFLOAT16 ? "bf16" : NULL;
}

/* float32 and bool; bfloat16 in pointwise kernels (computed in float32 and
** rounded as tier 1 does: tn_rt_cast's rule, runtime_ops.h's
** TN_RT_HALF_CONVERSIONS). Not float16: tier 1 converts it with F16C, 8
** elements an instruction; GCC 12 vectorises no _Float16 cast, and the
** portable conversion vectorised took 6x as long. */
static int t2_type_ok(const tn_fgroup *grp, int dt)
{
  return dt == TN_DTYPE_FLOAT32 || dt == TN_DTYPE_BOOL || (grp->fg_reduce_dims == 0 && dt == TN_DTYPE_BFLOAT16);
}

/* The C operator of a binary op on bool values (0 or 1: and, or and xor
** are the logical ones, max and min are or and and; the runtime's
** tn_rt_binary_b8), or NULL. */
static const char *t2_bool_binary_op(int op)
{
  switch (op) {
  case TN_RT_B_LAND: case TN_RT_B_BAND: case TN_RT_B_MINIMUM: return "&";
  case TN_RT_B_LOR: case TN_RT_B_BOR: case TN_RT_B_MAXIMUM: return "|";
  case TN_RT_B_BXOR: return "^";
  default: return NULL;
  }
}

/* A pointwise instruction of eager's own math function (tn_rt_eager_fn:
** float32 exp, log, sin, cos, tanh, erf): tier 2 calls it on a block of
** values between two loops of the pass, as tier 1 does, so the op gives
** eager's bits at either tier (libmvec's inline versions differ in the
** last bit for about one value in 50). */
static int t2_eager_call(const tn_fgroup *grp, const tn_finst *fi)
{
  return grp->fg_reduce_dims == 0 && fi->fi_kind == TN_FI_UNARY && fi->fi_dst >= 0 &&
         grp->fg_bdtypes[fi->fi_dst] == TN_DTYPE_FLOAT32 && tn_rt_eager_fn(fi->fi_op) != NULL;
}

/* Most blocks of values (4 KiB each, on the stack) a pass of eager calls keeps. */
#define T2_ARRAYS 24

/* The loops of a pointwise pass with eager calls: instruction i runs in
** loop seg[i] (an eager call after that loop), and a value v that crosses
** from one loop to a later one, or that an eager call reads or makes, is
** kept in the block V<v> (arr[v]); made[v] is the loop that makes v (an
** eager call's value: the loop after which it is called), -1 for constants
** and splats, made again in every loop. Returns how many blocks (seg, arr,
** made NULL: only counts; arr and made have fg_nbufs entries, set here). */
static int t2_plan(const tn_fgroup *grp, int *seg, uint8_t *arr, int *made)
{
  uint32_t n = grp->fg_nprog, nb = grp->fg_nbufs;
  int *def = made ? made : calloc(nb + 1, sizeof *def), *own = seg ? seg : calloc(n + 1, sizeof *own), cur = 0,
      count = 0;
  uint8_t *keep = arr ? arr : calloc(nb + 1, 1);
  if (!def || !own || !keep) {
    count = T2_ARRAYS + 1; /* no memory: tier 1 */
    goto done;
  }
  memset(keep, 0, nb);
  for (uint32_t v = 0; v < nb; v++)
    def[v] = -1; /* a constant or splat, made in every loop */
  for (uint32_t i = 0; i < n; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    int32_t reads[3] = {fi->fi_kind == TN_FI_LOAD || fi->fi_kind == TN_FI_CONST || fi->fi_kind == TN_FI_SPLAT ? -1 : fi->fi_a,
                        fi->fi_kind == TN_FI_BINARY || fi->fi_kind == TN_FI_COMPARE || fi->fi_kind == TN_FI_WHERE ? fi->fi_b : -1,
                        fi->fi_kind == TN_FI_WHERE ? fi->fi_c : -1};
    own[i] = cur;
    for (int q = 0; q < 3; q++)
      if (reads[q] >= 0 && (uint32_t)reads[q] < nb && def[reads[q]] >= 0 && def[reads[q]] < cur)
        keep[reads[q]] = 1;
    if (t2_eager_call(grp, fi)) {
      keep[fi->fi_a] = keep[fi->fi_dst] = 1;
      def[fi->fi_dst] = cur++; /* made after loop cur: read from its block */
    } else if (fi->fi_kind != TN_FI_STORE && fi->fi_kind != TN_FI_CONST && fi->fi_kind != TN_FI_SPLAT &&
               fi->fi_dst >= 0 && (uint32_t)fi->fi_dst < nb) {
      def[fi->fi_dst] = cur;
    }
  }
  for (uint32_t v = 0; v < nb; v++)
    count += keep[v];
done:
  if (def != made)
    free(def);
  if (own != seg)
    free(own);
  if (keep != arr)
    free(keep);
  return count;
}

/* Whether tier 2 writes grp: float32 and bool values, no gathers, every
** op one of the tables' (runtime_ops.h). */
static int t2_supported(const tn_fgroup *grp)
{
  uint32_t nops = grp->fg_ninputs + grp->fg_noutputs;
  if (grp->fg_reduce_dims > 0 && grp->fg_dtype != TN_DTYPE_FLOAT32)
    return 0;
  for (uint32_t k = 0; k < nops; k++)
    if (!t2_type_ok(grp, grp->fg_odtypes[k]))
      return 0;
  for (uint32_t k = 0; k < grp->fg_ninputs; k++)
    if ((grp->fg_gather && grp->fg_gather[k] != -1) || (grp->fg_gather_dim && grp->fg_gather_dim[k] >= 0))
      return 0;
  for (uint32_t v = 0; v < grp->fg_nbufs; v++)
    if (!t2_type_ok(grp, grp->fg_bdtypes[v]))
      return 0;
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    int dt = fi->fi_kind != TN_FI_STORE && fi->fi_kind < TN_FI_REDUCE && fi->fi_dst >= 0
                 ? grp->fg_bdtypes[fi->fi_dst] : -1;  /* the dtype of the value it makes */
    int f32 = dt == TN_DTYPE_FLOAT32 || t2_half(dt); /* values in float32 */
    /* a bool op's operands are bool too (the lowering converts them first: fuse.c emit_node) */
    int b8 = dt == TN_DTYPE_BOOL;
    switch (fi->fi_kind) {
    case TN_FI_LOAD:
      if (fi->fi_b >= 0 || grp->fg_odtypes[fi->fi_a] != grp->fg_bdtypes[fi->fi_dst])
        return 0;
      break;
    case TN_FI_STORE:
      if (grp->fg_odtypes[grp->fg_ninputs + (uint32_t)fi->fi_dst] != grp->fg_bdtypes[fi->fi_a])
        return 0;
      break;
    case TN_FI_UNARY:
      if (b8 ? fi->fi_op != TN_RT_LNOT || grp->fg_bdtypes[fi->fi_a] != TN_DTYPE_BOOL
             : !f32 || !t2_unary_expr(fi->fi_op))
        return 0;
      break;
    case TN_FI_BINARY:
      if (b8 ? !t2_bool_binary_op(fi->fi_op) || grp->fg_bdtypes[fi->fi_a] != TN_DTYPE_BOOL ||
                   grp->fg_bdtypes[fi->fi_b] != TN_DTYPE_BOOL
             : !f32 || !t2_binary_expr(fi->fi_op))
        return 0;
      break;
    case TN_FI_SUNARY:
      if (!t2_unary_expr(fi->fi_op))
        return 0;
      break;
    case TN_FI_SBINARY:
      if (!t2_binary_expr(fi->fi_op))
        return 0;
      break;
    case TN_FI_COMPARE:
      if (!t2_compare_op(fi->fi_op))
        return 0;
      break;
    case TN_FI_REDUCE:
      if (!t2_fold_op(fi->fi_op))
        return 0;
      break;
    case TN_FI_CONST: case TN_FI_WHERE: case TN_FI_CAST: case TN_FI_SPLAT: case TN_FI_SCONST: case TN_FI_SCOLS:
    case TN_FI_SSTORE:
      break;
    default:
      return 0;
    }
  }
  /* eager's own math functions between the loops of a pass (t2_plan): at most T2_ARRAYS blocks of values */
  return grp->fg_reduce_dims > 0 || t2_plan(grp, NULL, NULL, NULL) <= T2_ARRAYS;
}

/* The C type of a buffer's values, and of an operand's elements. */
static const char *t2_ctype(int dt)
{
  return cg_type(dt)->cd_ctype;
}

static const char *t2_optype(int dt)
{
  return cg_type(dt)->cd_elem;
}

/* The statement of instruction fi in the lane loop: element i (lane l) of
** the pass, v<k> the values of buffer k, I<k> / O<k> operand k's elements,
** a<k> reduction k's accumulator (in double, as tier 1 sums; z<k>: a NaN seen by a max or min), r<k> the row scalars, m the elements the
** chunk really has. */
static void t2_inst(cg_buf *b, const tn_fgroup *grp, const tn_finst *fi)
{
  const char *ind = "        ";
  char lit[64];
  const char *ct = fi->fi_kind == TN_FI_STORE || fi->fi_kind == TN_FI_REDUCE ? NULL
                                                                             : t2_ctype(grp->fg_bdtypes[fi->fi_dst]);
  switch (fi->fi_kind) {
  case TN_FI_LOAD:
    if (t2_half(grp->fg_odtypes[fi->fi_a]))
      out(b, "%sfloat v%d = tn_rt_from_%s(I%d[i]);\n", ind, fi->fi_dst, t2_half(grp->fg_odtypes[fi->fi_a]), fi->fi_a);
    else
      out(b, "%s%s v%d = I%d[i];\n", ind, ct, fi->fi_dst, fi->fi_a);
    break;
  case TN_FI_CONST:
    out(b, "%s%s v%d = %s;\n", ind, ct, fi->fi_dst, cg_lit(cg_btype(grp, fi->fi_dst), fi->fi_value, lit));
    break;
  case TN_FI_UNARY: /* on bool: logical not */
    if (grp->fg_bdtypes[fi->fi_dst] == TN_DTYPE_BOOL)
      out(b, "%sunsigned char v%d = v%d ^ 1;\n", ind, fi->fi_dst, fi->fi_a);
    else
      out(b, "%sfloat v%d; { float x = v%d; v%d = (%s); }\n", ind, fi->fi_dst, fi->fi_a, fi->fi_dst,
          t2_unary_expr(fi->fi_op));
    break;
  case TN_FI_BINARY:
    if (grp->fg_bdtypes[fi->fi_dst] == TN_DTYPE_BOOL)
      out(b, "%sunsigned char v%d = v%d %s v%d;\n", ind, fi->fi_dst, fi->fi_a, t2_bool_binary_op(fi->fi_op),
          fi->fi_b);
    else
      out(b, "%sfloat v%d; { float x = v%d, y = v%d; v%d = (%s); }\n", ind, fi->fi_dst, fi->fi_a, fi->fi_b,
          fi->fi_dst, t2_binary_expr(fi->fi_op));
    break;
  case TN_FI_COMPARE:
    out(b, "%sunsigned char v%d = v%d %s v%d;\n", ind, fi->fi_dst, fi->fi_a, t2_compare_op(fi->fi_op), fi->fi_b);
    break;
  case TN_FI_WHERE:
    out(b, "%s%s v%d = v%d ? v%d : v%d;\n", ind, ct, fi->fi_dst, fi->fi_a, fi->fi_b, fi->fi_c);
    break;
  case TN_FI_CAST: { /* to bool is x != 0 (NaN is true); a float16/bfloat16 value is rounded from its dtype, then to
                     ** the target's (once where they are one), as tn_rt_cast */
    int to = grp->fg_bdtypes[fi->fi_dst], from = grp->fg_bdtypes[fi->fi_a];
    const char *hf = t2_half(from), *ht = t2_half(to);
    char x[48];
    if (hf && from != to)
      snprintf(x, sizeof x, "tn_rt_round_%s(v%d)", hf, fi->fi_a);
    else
      snprintf(x, sizeof x, "v%d", fi->fi_a);
    if (from == TN_DTYPE_BOOL && to == TN_DTYPE_BOOL)
      out(b, "%sunsigned char v%d = v%d;\n", ind, fi->fi_dst, fi->fi_a);
    else if (to == TN_DTYPE_BOOL)
      out(b, "%sunsigned char v%d = %s != 0.0f;\n", ind, fi->fi_dst, x);
    else if (ht)
      out(b, "%sfloat v%d = tn_rt_round_%s(%s);\n", ind, fi->fi_dst, ht, x);
    else
      out(b, "%sfloat v%d = (float)%s;\n", ind, fi->fi_dst, x);
    break;
  }
  case TN_FI_SPLAT:
    out(b, "%sfloat v%d = r%d;\n", ind, fi->fi_dst, fi->fi_a);
    break;
  case TN_FI_STORE:
    if (t2_half(grp->fg_bdtypes[fi->fi_a]))
      out(b, "%sO%u[i] = tn_rt_to_%s(v%d);\n", ind, grp->fg_ninputs + (uint32_t)fi->fi_dst,
          t2_half(grp->fg_bdtypes[fi->fi_a]), fi->fi_a);
    else
      out(b, "%sO%u[i] = v%d;\n", ind, grp->fg_ninputs + (uint32_t)fi->fi_dst, fi->fi_a);
    break;
  case TN_FI_REDUCE: /* a<k> under the loop's reduction clause; max and min note a NaN in z<k> instead */
    if (fi->fi_op == TN_RT_R_SUM || fi->fi_op == TN_RT_R_MEAN)
      out(b, "%sa%d += i < m ? (double)v%d : 0.0;\n", ind, fi->fi_dst, fi->fi_a);
    else
      out(b, "%s{ double y = i < m ? (double)v%d : a%d; z%d |= y != y; a%d = y %s a%d ? y : a%d; }\n", ind, fi->fi_a,
          fi->fi_dst, fi->fi_dst, fi->fi_dst, fi->fi_op == TN_RT_R_MAX ? ">" : "<", fi->fi_dst, fi->fi_dst);
    break;
  default:
    break;
  }
}

/* One pass over len elements (a C expression) of the operands at p[],
** their strides along it in the C array sv: the instructions need selects
** (NULL: all). Blocks of up to TN_RT_BLOCK elements, whole chunks of lanes;
** the last few through the padded copies T<k>. */
static void t2_pass(cg_buf *b, const tn_fgroup *grp, const char *len, const char *sv, const uint8_t *need,
                    const uint8_t *kload, const uint8_t *kstore, const int *seg, const uint8_t *arr,
                    const int *made)
{
  uint32_t nin = grp->fg_ninputs, nops = nin + grp->fg_noutputs;
  uint8_t used[TN_LAUNCH_MAX_OPERANDS] = {0};
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (need && !need[i])
      continue;
    if (fi->fi_kind == TN_FI_LOAD)
      used[fi->fi_a] = 1;
    else if (fi->fi_kind == TN_FI_STORE)
      used[nin + (uint32_t)fi->fi_dst] = 1;
  }
  out(b, "    for (j = 0; j < %s; j += m) {\n", len);
  out(b, "      m = %s - j < %d ? %s - j : %d;\n", len, TN_RT_BLOCK, len, TN_RT_BLOCK);
  out(b, "      if (m >= %d) m &= ~(i64)%d;\n", T2_LANES, T2_LANES - 1);
  out(b, "      n = m < %d ? %d : m;\n", T2_LANES, T2_LANES);
  for (uint32_t k = 0; k < nops; k++) {
    if (!used[k])
      continue;
    const char *ct = t2_optype(grp->fg_odtypes[k]);
    if (k < nin)
      out(b, "      I%u = %s[%u] == 0 ? B%u : m < %d ? T%u : (const %s *)p[%u] + j;\n", k, sv, k, k, T2_LANES, k, ct, k);
    else
      out(b, "      O%u = m < %d ? T%u : (%s *)p[%u] + j;\n", k, T2_LANES, k, ct, k);
  }
  out(b, "      if (m < %d) {\n", T2_LANES);
  for (uint32_t k = 0; k < nin; k++)
    if (used[k])
      out(b, "        if (%s[%u] != 0) for (l = 0; l < %d; l++) T%u[l] = l < m ? ((const %s *)p[%u])[j + l] : 0;\n", sv,
          k, T2_LANES, k, t2_optype(grp->fg_odtypes[k]), k);
  out(b, "      }\n");
  int loops = 1; /* seg (t2_plan): a loop after each eager call */
  for (uint32_t i = 0; seg && i < grp->fg_nprog; i++)
    if (t2_eager_call(grp, &grp->fg_prog[i]))
      loops = seg[i] + 2;
  for (int loop = 0; loop < loops; loop++) {
    out(b, "#pragma omp simd");
    for (uint32_t i = 0; i < grp->fg_nprog; i++) {
      const tn_finst *fi = &grp->fg_prog[i];
      if (fi->fi_kind != TN_FI_REDUCE || (need && !need[i]))
        continue;
      if (fi->fi_op == TN_RT_R_SUM || fi->fi_op == TN_RT_R_MEAN)
        out(b, " reduction(+:a%d)", fi->fi_dst);
      else
        out(b, " reduction(%s:a%d) reduction(|:z%d)", fi->fi_op == TN_RT_R_MAX ? "max" : "min", fi->fi_dst, fi->fi_dst);
    }
    out(b, "\n      for (i = 0; i < n; i++) {\n");
    for (uint32_t v = 0; kload && v < grp->fg_nbufs; v++)
      if (kload[v])
        out(b, "        float v%u = K%u[j + i];\n", v, v);
    for (uint32_t v = 0; seg && v < grp->fg_nbufs; v++) /* what an earlier loop or eager call made */
      if (arr[v] && made[v] >= 0 && made[v] < loop)
        out(b, "        %s v%u = V%u[i];\n", t2_ctype(grp->fg_bdtypes[v]), v, v);
    for (uint32_t i = 0; i < grp->fg_nprog; i++) { /* constants and splats: wherever read (the compiler drops the rest) */
      const tn_finst *fi = &grp->fg_prog[i];
      int anywhere = fi->fi_kind == TN_FI_CONST || fi->fi_kind == TN_FI_SPLAT;
      if (seg && !anywhere && (seg[i] != loop || t2_eager_call(grp, fi)))
        continue;
      if (!need || need[i] || anywhere) {
        t2_inst(b, grp, fi);
        if (kstore && cg_computes(fi->fi_kind) && kstore[fi->fi_dst])
          out(b, "        K%d[j + i] = v%d;\n", fi->fi_dst, fi->fi_dst);
        if (seg && fi->fi_kind != TN_FI_STORE && arr[fi->fi_dst])
          out(b, "        V%d[i] = v%d;\n", fi->fi_dst, fi->fi_dst);
      }
    }
    out(b, "      }\n");
    for (uint32_t i = 0; seg && i < grp->fg_nprog; i++) /* eager's function on the block the loop filled */
      if (seg[i] == loop && t2_eager_call(grp, &grp->fg_prog[i]))
        out(b, "      tn_t2_eager[%d]((int)n, V%d, V%d, %#llx);\n", grp->fg_prog[i].fi_op, grp->fg_prog[i].fi_a,
            grp->fg_prog[i].fi_dst, (unsigned long long)TN_RT_VM_MODE);
  }
  out(b, "      if (m < %d) {\n", T2_LANES);
  for (uint32_t k = nin; k < nops; k++)
    if (used[k])
      out(b, "        for (l = 0; l < m; l++) ((%s *)p[%u])[j + l] = T%u[l];\n", t2_optype(grp->fg_odtypes[k]), k, k);
  out(b, "      }\n    }\n");
}

/* The declarations every tier-2 kernel starts with. */
static void t2_start(cg_buf *b, const tn_fgroup *grp)
{
  uint32_t nin = grp->fg_ninputs, nops = nin + grp->fg_noutputs;
  out(b, "int tn_kernel2(i64 rank, const i64 *sizes, void **ptrs, const i64 *st, i64 cols, const i64 *cst)\n{\n");
  cg_operands(b, grp);
  for (uint32_t k = 0; k < nops; k++) {
    const char *ct = t2_optype(grp->fg_odtypes[k]);
    if (k < nin)
      out(b, "  %s B%u[%d], T%u[%d]; const %s *I%u;\n", ct, k, TN_RT_BLOCK, k, T2_LANES, ct, k);
    else
      out(b, "  %s T%u[%d], *O%u;\n", ct, k, T2_LANES, k);
  }
  out(b, "  i64 idx[64], d, k, o, j, m, n, i, l;\n");
  out(b, "  (void)cst;\n");
}

/* Returns 1 (tier 1 runs the call) unless the strides along the pass (sv:
** s or cst) are ones tier 2 takes: 0 or 1 for inputs, 1 for outputs
** stored along it (rows: per-row outputs are not). */
static void t2_checks(cg_buf *b, const tn_fgroup *grp, const char *sv)
{
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (fi->fi_kind == TN_FI_LOAD)
      out(b, "  if (%s[%d] != 0 && %s[%d] != 1) return 1;\n", sv, fi->fi_a, sv, fi->fi_a);
    else if (fi->fi_kind == TN_FI_STORE)
      out(b, "  if (%s[%u] != 1) return 1;\n", sv, grp->fg_ninputs + (uint32_t)fi->fi_dst);
  }
}

/* Fills the broadcast blocks B<k> of the inputs with stride 0 along a pass
** of len elements, from p[k]. */
static void t2_broadcasts(cg_buf *b, const tn_fgroup *grp, const char *len, const char *sv)
{
  for (uint32_t k = 0; k < grp->fg_ninputs; k++)
    out(b, "    if (%s[%u] == 0) for (l = 0; l < %d && l < %s; l++) B%u[l] = *(const %s *)p[%u];\n", sv, k,
        TN_RT_BLOCK, len, k, t2_optype(grp->fg_odtypes[k]), k);
}

static void t2_pointwise(cg_buf *b, const tn_fgroup *grp)
{
  uint32_t nops = grp->fg_ninputs + grp->fg_noutputs;
  int *seg = malloc((grp->fg_nprog + 1) * sizeof *seg), *made = malloc((grp->fg_nbufs + 1) * sizeof *made);
  uint8_t *arr = malloc(grp->fg_nbufs + 1);
  if (!seg || !arr || !made) {
    free(seg);
    free(arr);
    free(made);
    b->cb_rc = TN_ENOMEM;
    return;
  }
  int nkept = t2_plan(grp, seg, arr, made);
  if (nkept) /* eager's functions, set when the object is loaded (tn_tier2_load) */
    out(b, "typedef void (*tn_vm_fn)(int, const float *, float *, long long);\ntn_vm_fn tn_t2_eager[%d];\n", TN_RT_EAGER_OPS);
  t2_start(b, grp);
  for (uint32_t v = 0; nkept && v < grp->fg_nbufs; v++)
    if (arr[v])
      out(b, "  %s V%u[%d];\n", t2_ctype(grp->fg_bdtypes[v]), v, TN_RT_BLOCK);
  for (uint32_t i = 0; nkept && i < grp->fg_nprog; i++) /* none in this process: tier 1 runs the call */
    if (t2_eager_call(grp, &grp->fg_prog[i]))
      out(b, "  if (!tn_t2_eager[%d]) return 1;\n", grp->fg_prog[i].fi_op);
  out(b, "  char *q[%u];\n  i64 s[%u];\n", nops, nops);
  out(b, "  i64 inner = rank ? sizes[rank - 1] : 1, outer = 1;\n");
  out(b, "  for (d = 0; d + 1 < rank; d++) { outer *= sizes[d]; idx[d] = 0; }\n");
  out(b, "  for (k = 0; k < %u; k++) { s[k] = rank ? st[k * rank + rank - 1] : 1; q[k] = (char *)ptrs[k]; }\n", nops);
  t2_checks(b, grp, "s");
  out(b, "  if (inner == 0 || outer == 0) return 0;\n");
  /* short rows: tier 1's tiles of rows do better than a chunk per row */
  out(b, "  if (rank >= 2 && inner < %d) return 1;\n", T2_LANES);
  out(b, "  for (o = 0; o < outer; o++) {\n");
  out(b, "    for (k = 0; k < %u; k++) p[k] = q[k];\n", nops);
  t2_broadcasts(b, grp, "inner", "s");
  t2_pass(b, grp, "inner", "s", NULL, NULL, NULL, nkept ? seg : NULL, arr, made);
  free(seg);
  free(arr);
  free(made);
  cg_odometer(b, nops, 2, "    ");
  out(b, "  }\n  return 0;\n}\n");
}

/* Rows of at most T2_KEEP elements keep the values a later phase reads
** (K<k>, on the stack) instead of computing them again, for at most
** T2_KEEP_BUFS buffers. */
#define T2_KEEP 4096
#define T2_KEEP_BUFS 4

/* cg_phase_need for tier 2: with persist, what an earlier phase computed
** (an op's result, never a load, constant or splat) is not computed again
** but read back: kload marks those buffers of this phase (it is zeroed
** first). */
static int t2_phase_need(cg_rows *r, int ph, int persist, uint8_t *kload)
{
  const tn_fgroup *grp = r->cr_grp;
  uint32_t n = grp->fg_nprog;
  uint8_t *have = r->cr_have;
  int any;
  /* computed buffers an earlier phase made count as had; the rest are made again */
  uint8_t saved[TN_LAUNCH_MAX_OPERANDS * 4];
  uint32_t nb = grp->fg_nbufs < sizeof saved ? grp->fg_nbufs : (uint32_t)sizeof saved;
  memcpy(saved, have, nb);
  for (uint32_t v = 0; v < nb; v++)
    have[v] = persist && have[v] && r->cr_def[v] && cg_computes(r->cr_def[v]->fi_kind);
  any = cg_phase_need(r, ph, persist);
  memset(kload, 0, grp->fg_nbufs);
  for (uint32_t i = 0; persist && i < n; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (!r->cr_need[i])
      continue;
    int32_t reads[3] = {fi->fi_kind == TN_FI_LOAD || fi->fi_kind == TN_FI_CONST || fi->fi_kind == TN_FI_SPLAT ? -1 : fi->fi_a,
                        fi->fi_kind == TN_FI_BINARY || fi->fi_kind == TN_FI_COMPARE || fi->fi_kind == TN_FI_WHERE ? fi->fi_b : -1,
                        fi->fi_kind == TN_FI_WHERE ? fi->fi_c : -1};
    for (int q = 0; q < 3; q++)
      if (reads[q] >= 0 && (uint32_t)reads[q] < nb && have[reads[q]])
        kload[reads[q]] = 1;
  }
  memcpy(have, saved, nb);
  for (uint32_t i = 0; i < n; i++) /* what this phase made */
    if (r->cr_need[i] && cg_computes(grp->fg_prog[i].fi_kind))
      have[grp->fg_prog[i].fi_dst] = 1;
  return any;
}

/* Which buffers the rows that fit keep (kstore; declares their K<k>):
** those a later phase reads back. Returns whether any are kept (and few
** enough to keep); r's phase state is reset afterwards. */
static int t2_keep_plan(cg_rows *r, int phases, uint8_t *kstore)
{
  const tn_fgroup *grp = r->cr_grp;
  uint8_t *kload = calloc(grp->fg_nbufs + 1, 1);
  int count = 0;
  if (!kload)
    return 0;
  memset(r->cr_have, 0, grp->fg_nbufs + 1);
  for (int ph = 0; ph < phases; ph++) {
    t2_phase_need(r, ph, 1, kload);
    for (uint32_t v = 0; v < grp->fg_nbufs; v++)
      kstore[v] |= kload[v];
  }
  memset(r->cr_have, 0, grp->fg_nbufs + 1);
  for (uint32_t v = 0; v < grp->fg_nbufs; v++)
    count += kstore[v];
  free(kload);
  if (count > T2_KEEP_BUFS || grp->fg_nbufs > TN_LAUNCH_MAX_OPERANDS * 4)
    memset(kstore, 0, grp->fg_nbufs);
  return count > 0 && count <= T2_KEEP_BUFS && grp->fg_nbufs <= TN_LAUNCH_MAX_OPERANDS * 4;
}

static void t2_rows(cg_buf *b, const tn_fgroup *grp)
{
  uint32_t nops = grp->fg_ninputs + grp->fg_noutputs, n = grp->fg_nprog;
  int phases = 0;
  uint8_t *kload = NULL, *kstore = NULL;
  cg_rows r;
  phases = cg_rows_open(grp, &r);
  if (phases < 0) {
    b->cb_rc = TN_ENOMEM;
    goto done;
  }
  kload = calloc(grp->fg_nbufs + 1, 1);
  kstore = calloc(grp->fg_nbufs + 1, 1);
  if (!kload || !kstore) {
    b->cb_rc = TN_ENOMEM;
    goto done;
  }
  t2_start(b, grp);
  for (uint32_t k = 0; k < grp->fg_nscalars; k++)
    out(b, "  float r%u = 0; double a%u = 0; int z%u = 0;\n", k, k, k);
  out(b, "  i64 outer = 1;\n");
  t2_checks(b, grp, "cst");
  out(b, "  for (d = 0; d < rank; d++) { outer *= sizes[d]; idx[d] = 0; }\n");
  /* short rows: tier 1's tiles of rows */
  out(b, "  if (cols < %d) return 1;\n", T2_LANES);
  cg_row_places(b, nops);
  t2_broadcasts(b, grp, "cols", "cst");
  int keep = t2_keep_plan(&r, phases, kstore);
  for (uint32_t v = 0; v < grp->fg_nbufs; v++)
    if (kstore[v])
      out(b, "    float K%u[%d];\n", v, T2_KEEP + T2_LANES);
  for (int persist = keep; persist >= 0; persist--) {
    if (keep)
      out(b, persist ? "    if (cols <= %d) {\n" : "    } else {\n", T2_KEEP);
    memset(r.cr_done, 0, n + 1);
    memset(r.cr_have, 0, grp->fg_nbufs + 1);
    for (int ph = 0; ph < phases; ph++) {
      cg_scalars(b, &r, ph, NULL);
      if (!t2_phase_need(&r, ph, persist, kload))
        continue;
      for (uint32_t i = 0; i < n; i++) {
        const tn_finst *fi = &grp->fg_prog[i];
        if (r.cr_need[i] && fi->fi_kind == TN_FI_REDUCE)
          out(b, "    a%d = %s; z%d = 0;\n", fi->fi_dst,
              fi->fi_op == TN_RT_R_MAX ? "-__builtin_inf()" : fi->fi_op == TN_RT_R_MIN ? "__builtin_inf()" : "0.0",
              fi->fi_dst);
      }
      t2_pass(b, grp, "cols", "cst", r.cr_need, persist ? kload : NULL, persist ? kstore : NULL, NULL, NULL, NULL);
      for (uint32_t i = 0; i < n; i++) {
        const tn_finst *fi = &grp->fg_prog[i];
        if (!r.cr_need[i] || fi->fi_kind != TN_FI_REDUCE)
          continue;
        if (fi->fi_op == TN_RT_R_MAX || fi->fi_op == TN_RT_R_MIN)
          out(b, "    r%d = z%d ? __builtin_nanf(\"\") : (float)a%d;\n", fi->fi_dst, fi->fi_dst, fi->fi_dst);
        else
          out(b, fi->fi_op == TN_RT_R_MEAN ? "    r%d = (float)(a%d / (double)cols);\n" : "    r%d = (float)a%d;\n",
              fi->fi_dst, fi->fi_dst);
      }
    }
    cg_scalars(b, &r, phases, NULL);
  }
  if (keep)
    out(b, "    }\n");
  cg_row_next(b, 1);
done:
  free(kload);
  free(kstore);
  cg_rows_close(&r);
}

/* The prototypes tier-2 code calls (no system header): the math functions
** of runtime_ops.h's expressions, those libmvec has as OpenMP SIMD
** functions. */
static const char t2_prelude[] =
  "typedef long long i64;\n"
  "static double tn_bits(unsigned long long u) { double d; __builtin_memcpy(&d, &u, 8); return d; }\n"
  "#define TN_RT_POW(x, y) powf(x, y)\n"
  "#pragma omp declare simd notinbranch\nfloat expf(float);\n"
  "#pragma omp declare simd notinbranch\nfloat logf(float);\n"
  "#pragma omp declare simd notinbranch\nfloat log1pf(float);\n"
  "#pragma omp declare simd notinbranch\nfloat expm1f(float);\n"
  "#pragma omp declare simd notinbranch\nfloat tanhf(float);\n"
  "#pragma omp declare simd notinbranch\nfloat erff(float);\n"
  "#pragma omp declare simd notinbranch\nfloat sinf(float);\n"
  "#pragma omp declare simd notinbranch\nfloat cosf(float);\n"
  "#pragma omp declare simd notinbranch\nfloat powf(float, float);\n"
  "float fabsf(float);\nfloat sqrtf(float);\nfloat floorf(float);\nfloat ceilf(float);\nfloat truncf(float);\n"
  "float rintf(float);\n"
  TN_RT_TEXT(TN_RT_HALF_CONVERSIONS) "\n";

int tn_codegen_tier2(const tn_fgroup *grp, char **src)
{
  *src = NULL;
  if (!t2_supported(grp) || (grp->fg_reduce_dims > 0 && cg_argreduce_of(grp)))
    return TN_OK;
  cg_buf b = {malloc(4096), 0, 4096, TN_OK};
  if (!b.cb_text)
    return TN_ENOMEM;
  b.cb_text[0] = 0;
  out(&b, "%s", t2_prelude);
  if (grp->fg_reduce_dims > 0)
    t2_rows(&b, grp);
  else
    t2_pointwise(&b, grp);
  if (b.cb_rc != TN_OK) {
    free(b.cb_text);
    return b.cb_rc;
  }
  *src = b.cb_text;
  return TN_OK;
}
