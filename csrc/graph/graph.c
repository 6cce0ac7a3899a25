/*
** Graph IR: storage, the validating builder and accessors (see graph.h).
** Encoding, decoding, keys and dumps live in encode.c.
*/
#include "graph_internal.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Tables ------------------------------------------------------------- */

typedef struct tn_op_info {
  const char *oi_name;
  const char *oi_sig;
  int oi_nout;
  int oi_class;
} tn_op_info;

static const tn_op_info op_table[TN_OP__COUNT] = {
#define TN_OP_ROW(id, name, sig, nout, cls) {name, sig, nout, cls},
  TN_OP_DEF(TN_OP_ROW)
#undef TN_OP_ROW
};

int tn_op_count(void) { return TN_OP__COUNT; }

int tn_op_find(const char *name)
{
  for (int i = 0; i < TN_OP__COUNT; i++)
    if (strcmp(op_table[i].oi_name, name) == 0)
      return i;
  return -1;
}

const char *tn_op_name(int op) { return op_table[op].oi_name; }
const char *tn_op_signature(int op) { return op_table[op].oi_sig; }
int tn_op_outputs(int op) { return op_table[op].oi_nout; }
int tn_op_class(int op) { return op_table[op].oi_class; }

const char *tn_dtype_name(int num)
{
  switch (num) {
#define TN_DTYPE_CASE(id, n, name) case n: return name;
  TN_DTYPE_DEF(TN_DTYPE_CASE)
#undef TN_DTYPE_CASE
  default: return NULL;
  }
}

/* -- Lifetime ----------------------------------------------------------- */

static int graph_on_owner(const tn_graph *g)
{
  return pthread_equal(g->gr_owner, pthread_self());
}

static uint64_t graph_abandoned;

uint64_t tn_graph_abandoned(void)
{
  return __atomic_load_n(&graph_abandoned, __ATOMIC_RELAXED);
}

int tn_graph_new(tn_graph **out)
{
  int rc = TN_OK;
  tn_graph *g = calloc(1, sizeof *g);

  *out = NULL;
  if (!g) {
    rc = TN_ENOMEM;
    goto done;
  }
  g->gr_heap = mi_heap_new();
  if (!g->gr_heap) {
    rc = TN_ENOMEM;
    goto done;
  }
  g->gr_owner = pthread_self();
  *out = g;
  g = NULL;
done:
  free(g);
  return rc;
}

void tn_graph_free(tn_graph *g)
{
  if (!g)
    return;
  /* A mimalloc heap belongs to its thread's state: destroying it elsewhere
  ** would race with that thread. Abandon it instead (counted). */
  if (graph_on_owner(g))
    mi_heap_destroy(g->gr_heap);
  else
    __atomic_add_fetch(&graph_abandoned, 1, __ATOMIC_RELAXED);
  free(g);
}

int tn_graph_reset(tn_graph *g)
{
  if (!graph_on_owner(g))
    return TN_ETHREAD;
  mi_heap_t *fresh = mi_heap_new();
  if (!fresh)
    return TN_ENOMEM;
  mi_heap_destroy(g->gr_heap);
  memset(g, 0, sizeof *g);
  g->gr_heap = fresh;
  g->gr_owner = pthread_self();
  return TN_OK;
}

const char *tn_graph_errmsg(const tn_graph *g)
{
  return g->gr_err;
}

/* Records the first error of g (poisoning it) and returns rc. */
int tn_graph_fail(tn_graph *g, int rc, const char *fmt, ...)
{
  if (g->gr_rc == TN_OK) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->gr_err, sizeof g->gr_err, fmt, ap);
    va_end(ap);
    g->gr_rc = rc;
  }
  return rc;
}

/* Entry check of every mutating call: right thread, not poisoned. Also
** drops the cached encoding and dump, which the mutation invalidates. */
static int graph_enter(tn_graph *g)
{
  if (!graph_on_owner(g))
    return TN_ETHREAD;
  if (g->gr_rc != TN_OK)
    return TN_EPOISONED;
  g->gr_enc_valid = 0;
  mi_free(g->gr_dump);
  g->gr_dump = NULL;
  return TN_OK;
}

int tn_graph_enter_read(tn_graph *g)
{
  if (!graph_on_owner(g))
    return TN_ETHREAD;
  if (g->gr_rc != TN_OK)
    return TN_EPOISONED;
  return TN_OK;
}

/* -- Heap helpers -------------------------------------------------------- */

void *tn_graph_alloc(tn_graph *g, size_t n)
{
  return mi_heap_malloc(g->gr_heap, n ? n : 1);
}

/* Grows *arr (elements of size elem, *cap of them) to hold need. */
static int graph_reserve(tn_graph *g, void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
  if (need <= *cap)
    return TN_OK;
  uint32_t ncap = *cap ? *cap : 16;
  while (ncap < need)
    ncap *= 2;
  void *p = mi_heap_reallocn(g->gr_heap, *arr, ncap, elem);
  if (!p)
    return TN_ENOMEM;
  *arr = p;
  *cap = ncap;
  return TN_OK;
}

static char *graph_strdup(tn_graph *g, const char *s, size_t len)
{
  char *p = tn_graph_alloc(g, len + 1);
  if (p) {
    memcpy(p, s, len);
    p[len] = 0;
  }
  return p;
}

/* -- Validation helpers --------------------------------------------------- */

static int sint_valid(const tn_graph *g, tn_sint v, int allow_negative, int allow_scaled)
{
  if (v.si_sym >= 0)
    return (uint32_t)v.si_sym < g->gr_nsyms && (v.si_val == 0 || (allow_scaled && v.si_val >= 2));
  return v.si_sym == -1 && (allow_negative || v.si_val >= 0);
}

/* Non-zero when a and b are provably different sizes. Distinct symbols may
** still be equal at run time, so only concrete values can conflict. */
static int sint_conflict(tn_sint a, tn_sint b)
{
  return a.si_sym < 0 && b.si_sym < 0 && a.si_val != b.si_val;
}

static int sint_is_one(tn_sint v)
{
  return v.si_sym < 0 && v.si_val == 1;
}

static void sint_format(tn_sint v, char *buf, size_t len)
{
  if (v.si_sym >= 0 && v.si_val)
    snprintf(buf, len, "%" PRId64 "*s%d", v.si_val, v.si_sym);
  else if (v.si_sym >= 0)
    snprintf(buf, len, "s%d", v.si_sym);
  else
    snprintf(buf, len, "%" PRId64, v.si_val);
}

/* Checks meta; on error writes what is wrong into msg. */
static int meta_check(const tn_graph *g, const tn_meta *m, char *msg, size_t len)
{
  char b[32];
  if (!tn_dtype_name(m->me_dtype)) {
    snprintf(msg, len, "unknown dtype %d", m->me_dtype);
    return TN_EINVAL;
  }
  if (m->me_rank < 0 || m->me_rank > TN_MAX_RANK) {
    snprintf(msg, len, "rank %d outside [0, %d]", m->me_rank, TN_MAX_RANK);
    return TN_EINVAL;
  }
  if (m->me_rank > 0 && (!m->me_sizes || !m->me_strides)) {
    snprintf(msg, len, "rank %d without sizes or strides", m->me_rank);
    return TN_EINVAL;
  }
  for (int d = 0; d < m->me_rank; d++) {
    if (!sint_valid(g, m->me_sizes[d], 0, 0)) {
      sint_format(m->me_sizes[d], b, sizeof b);
      snprintf(msg, len, "size[%d] %s is negative or an undeclared symbol", d, b);
      return TN_EINVAL;
    }
    if (!sint_valid(g, m->me_strides[d], 0, 1)) {
      sint_format(m->me_strides[d], b, sizeof b);
      snprintf(msg, len, "stride[%d] %s is negative or an undeclared symbol", d, b);
      return TN_EINVAL;
    }
  }
  return TN_OK;
}

static int meta_copy(tn_graph *g, tn_meta *dst, const tn_meta *src)
{
  tn_sint *sz = NULL, *st = NULL;
  if (src->me_rank > 0) {
    size_t n = (size_t)src->me_rank * sizeof(tn_sint);
    sz = tn_graph_alloc(g, n);
    st = tn_graph_alloc(g, n);
    if (!sz || !st)
      return TN_ENOMEM;
    memcpy(sz, src->me_sizes, n);
    memcpy(st, src->me_strides, n);
  }
  dst->me_dtype = src->me_dtype;
  dst->me_rank = src->me_rank;
  dst->me_sizes = sz;
  dst->me_strides = st;
  return TN_OK;
}

/* Well-formed UTF-8 (no overlongs, surrogates or code points past
** U+10FFFF) without NUL: names and strings must read back as text. */
static int utf8_valid(const unsigned char *s, uint32_t len)
{
  uint32_t i = 0;
  while (i < len) {
    unsigned char c = s[i];
    uint32_t n, cp;
    if (c == 0)
      return 0;
    if (c < 0x80) {
      i++;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf) { n = 1; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { n = 2; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { n = 3; cp = c & 0x07; }
    else return 0;
    if (len - i <= n)
      return 0;
    for (uint32_t k = 1; k <= n; k++) {
      if ((s[i + k] & 0xc0) != 0x80)
        return 0;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
      return 0;
    i += n + 1;
  }
  return 1;
}

static int string_valid(const char *s, uint32_t len)
{
  return s && len <= TN_MAX_STRING && utf8_valid((const unsigned char *)s, len);
}

/* -- Inputs --------------------------------------------------------------- */

int tn_graph_add_symbol(tn_graph *g, int32_t *out)
{
  int rc = graph_enter(g);
  if (rc != TN_OK)
    return rc;
  if (g->gr_nsyms >= INT32_MAX)
    return tn_graph_fail(g, TN_EINVAL, "too many symbols");
  *out = (int32_t)g->gr_nsyms++;
  return TN_OK;
}

static int input_same_role(const tn_value *v, const tn_input_desc *in, const char *name)
{
  if (v->va_kind != in->in_kind)
    return 0;
  switch (v->va_kind) {
  case TN_VALUE_ARG: return v->va_index == in->in_index && strcmp(v->va_name, name) == 0;
  case TN_VALUE_PARAM: return strcmp(v->va_name, name) == 0;
  default: return v->va_index == in->in_index;
  }
}

int tn_graph_add_input(tn_graph *g, const tn_input_desc *in, int32_t *out)
{
  char msg[TN_ERRMSG_LEN - 64];
  const char *name = in->in_name ? in->in_name : "";
  size_t nlen = strlen(name);
  uint32_t id = g->gr_nvalues;
  int rc = graph_enter(g);

  if (rc != TN_OK)
    return rc;
  if (g->gr_nnodes > 0)
    return tn_graph_fail(g, TN_EINVAL, "input %u: inputs must be added before the first node", id);
  switch (in->in_kind) {
  case TN_VALUE_ARG:
  case TN_VALUE_CONST:
    if (in->in_index < 0)
      return tn_graph_fail(g, TN_EINVAL, "input %u: negative index %d", id, in->in_index);
    if (in->in_kind == TN_VALUE_CONST && nlen)
      return tn_graph_fail(g, TN_EINVAL, "input %u: a constant has no name", id);
    break;
  case TN_VALUE_PARAM:
    if (nlen == 0)
      return tn_graph_fail(g, TN_EINVAL, "input %u: a parameter needs its qualified name", id);
    break;
  default:
    return tn_graph_fail(g, TN_EINVAL, "input %u: unknown kind %d", id, in->in_kind);
  }
  if (!string_valid(name, (uint32_t)(nlen > UINT32_MAX ? UINT32_MAX : nlen)))
    return tn_graph_fail(g, TN_EINVAL, "input %u: name longer than %d bytes or not UTF-8 text", id, TN_MAX_STRING);
  if (meta_check(g, &in->in_meta, msg, sizeof msg) != TN_OK)
    return tn_graph_fail(g, TN_EINVAL, "input %u: %s", id, msg);
  for (uint32_t i = 0; i < g->gr_nvalues; i++)
    if (input_same_role(&g->gr_values[i], in, name))
      return tn_graph_fail(g, TN_EINVAL, "input %u: same role as input %u", id, i);

  rc = graph_reserve(g, (void **)&g->gr_values, &g->gr_capvalues, id + 1, sizeof(tn_value));
  if (rc != TN_OK)
    return tn_graph_fail(g, rc, "input %u: out of memory", id);
  tn_value *v = &g->gr_values[id];
  memset(v, 0, sizeof *v);
  v->va_kind = in->in_kind;
  v->va_index = in->in_kind == TN_VALUE_PARAM ? 0 : in->in_index;
  v->va_node = -1;
  v->va_name = in->in_kind == TN_VALUE_CONST ? NULL : graph_strdup(g, name, nlen);
  if ((in->in_kind != TN_VALUE_CONST && !v->va_name) ||
      meta_copy(g, &v->va_meta, &in->in_meta) != TN_OK)
    return tn_graph_fail(g, TN_ENOMEM, "input %u: out of memory", id);
  g->gr_nvalues++;
  g->gr_ninputs++;
  *out = (int32_t)id;
  return TN_OK;
}

/* -- Nodes: argument checks ---------------------------------------------- */

int32_t tn_graph_node_input(const tn_node *n, uint32_t *arg, uint32_t *elem)
{
  while (*arg < n->no_nargs) {
    const tn_arg *a = &n->no_args[*arg];
    if (a->ar_tag == TN_ARG_TENSOR && *elem == 0) {
      (*elem)++;
      return a->u.ar_ref;
    }
    if (a->ar_tag == TN_ARG_TENSOR_LIST || a->ar_tag == TN_ARG_OPT_TENSOR_LIST) {
      while (*elem < a->ar_len) {
        int32_t v = a->u.ar_refs[(*elem)++];
        if (v >= 0)
          return v;
      }
    }
    (*arg)++;
    *elem = 0;
  }
  return -1;
}

static int sig_accepts(char c, int tag)
{
  int none = tag == TN_ARG_NONE;
  switch (c) {
  case 'T': return tag == TN_ARG_TENSOR;
  case 't': return tag == TN_ARG_TENSOR || none;
  case 'L': return tag == TN_ARG_TENSOR_LIST;
  case 'O': return tag == TN_ARG_OPT_TENSOR_LIST;
  case 's': return tag == TN_ARG_INT || tag == TN_ARG_FLOAT || tag == TN_ARG_BOOL || tag == TN_ARG_SYM;
  case 'S': return sig_accepts('s', tag) || none;
  case 'i': return tag == TN_ARG_INT;
  case 'I': return tag == TN_ARG_INT || none;
  case 'l': return tag == TN_ARG_INT_LIST;
  case 'M': return tag == TN_ARG_INT_LIST || none;
  case 'z': return tag == TN_ARG_INT || tag == TN_ARG_SYM;
  case 'Z': return tag == TN_ARG_INT || tag == TN_ARG_SYM || none;
  case 'y': return tag == TN_ARG_INT_LIST;
  case 'b': return tag == TN_ARG_BOOL;
  case 'B': return tag == TN_ARG_BOOL || none;
  case 'f': return tag == TN_ARG_FLOAT;
  case 'c': return tag == TN_ARG_STRING;
  case 'C': return tag == TN_ARG_STRING || none;
  case 'd': return tag == TN_ARG_DTYPE || none;
  case 'o': return tag == TN_ARG_LAYOUT || none;
  case 'v': return tag == TN_ARG_DEVICE || none;
  case 'm': return tag == TN_ARG_MEMFMT || none;
  default: return 0;
  }
}

static const char *const arg_tag_names[TN_ARG__COUNT] = {
  "None", "tensor", "tensor list", "int", "float", "bool", "symbol",
  "int list", "string", "dtype", "layout", "device", "memory format",
  "optional tensor list",
};

const char *tn_arg_tag_name(int tag)
{
  return tag >= 0 && tag < TN_ARG__COUNT ? arg_tag_names[tag] : "unknown";
}

/* Checks the content of one argument (independent of the op). */
static int arg_check(const tn_graph *g, const tn_arg *a, int allow_syms, char *msg, size_t len)
{
  switch (a->ar_tag) {
  case TN_ARG_NONE:
  case TN_ARG_INT:
  case TN_ARG_FLOAT:
    return TN_OK;
  case TN_ARG_TENSOR:
    if (a->u.ar_ref < 0 || (uint32_t)a->u.ar_ref >= g->gr_nvalues) {
      snprintf(msg, len, "refers to undefined value %d", a->u.ar_ref);
      return TN_EINVAL;
    }
    return TN_OK;
  case TN_ARG_TENSOR_LIST:
  case TN_ARG_OPT_TENSOR_LIST:
    if (a->ar_len > TN_MAX_LIST || (a->ar_len && !a->u.ar_refs)) {
      snprintf(msg, len, "bad tensor list of length %u", a->ar_len);
      return TN_EINVAL;
    }
    for (uint32_t i = 0; i < a->ar_len; i++)
      if ((a->u.ar_refs[i] < 0 && !(a->ar_tag == TN_ARG_OPT_TENSOR_LIST && a->u.ar_refs[i] == -1)) ||
          a->u.ar_refs[i] >= (int32_t)g->gr_nvalues) {
        snprintf(msg, len, "element %u refers to undefined value %d", i, a->u.ar_refs[i]);
        return TN_EINVAL;
      }
    return TN_OK;
  case TN_ARG_BOOL:
    if (a->u.ar_int != 0 && a->u.ar_int != 1) {
      snprintf(msg, len, "bool %" PRId64 " is not 0 or 1", a->u.ar_int);
      return TN_EINVAL;
    }
    return TN_OK;
  case TN_ARG_SYM:
    if (a->u.ar_ref < 0 || (uint32_t)a->u.ar_ref >= g->gr_nsyms) {
      snprintf(msg, len, "refers to undeclared symbol %d", a->u.ar_ref);
      return TN_EINVAL;
    }
    return TN_OK;
  case TN_ARG_INT_LIST:
    if (a->ar_len > TN_MAX_LIST || (a->ar_len && !a->u.ar_ints)) {
      snprintf(msg, len, "bad int list of length %u", a->ar_len);
      return TN_EINVAL;
    }
    for (uint32_t i = 0; i < a->ar_len; i++) {
      tn_sint v = a->u.ar_ints[i];
      if (!sint_valid(g, v, 1, 0) || (v.si_sym >= 0 && !allow_syms)) {
        snprintf(msg, len, "element %u is %s", i,
                 v.si_sym >= 0 && allow_syms ? "an undeclared symbol" : "not a plain int");
        return TN_EINVAL;
      }
    }
    return TN_OK;
  case TN_ARG_STRING:
  case TN_ARG_DEVICE:
    if (!string_valid(a->u.ar_str, a->ar_len)) {
      snprintf(msg, len, "string longer than %d bytes or not UTF-8 text without NUL", TN_MAX_STRING);
      return TN_EINVAL;
    }
    return TN_OK;
  case TN_ARG_DTYPE:
    if (!tn_dtype_name((int)a->u.ar_int) || a->u.ar_int != (int)a->u.ar_int) {
      snprintf(msg, len, "unknown dtype %" PRId64, a->u.ar_int);
      return TN_EINVAL;
    }
    return TN_OK;
  case TN_ARG_LAYOUT:
  case TN_ARG_MEMFMT:
    if (a->u.ar_int < 0 || a->u.ar_int > (a->ar_tag == TN_ARG_LAYOUT ? 15 : 3)) {
      snprintf(msg, len, "%s %" PRId64 " out of range", tn_arg_tag_name(a->ar_tag), a->u.ar_int);
      return TN_EINVAL;
    }
    return TN_OK;
  default:
    snprintf(msg, len, "unknown argument tag %d", a->ar_tag);
    return TN_EINVAL;
  }
}

/* -- Nodes: semantic checks by op class ---------------------------------- */

typedef struct node_ctx {
  const tn_graph *nc_g;
  int nc_op;
  const tn_arg *nc_args;
  uint32_t nc_nargs;
  const tn_meta *nc_outs;
  uint32_t nc_nout;
  char *nc_msg;
  size_t nc_len;
} node_ctx;

static int node_err(node_ctx *c, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->nc_msg, c->nc_len, fmt, ap);
  va_end(ap);
  return TN_EINVAL;
}

static const tn_meta *arg_meta(const node_ctx *c, uint32_t i)
{
  const tn_arg *a = &c->nc_args[i];
  return a->ar_tag == TN_ARG_TENSOR ? &c->nc_g->gr_values[a->u.ar_ref].va_meta : NULL;
}

/* Normalises dim for a tensor of rank (dims of a 0-dim tensor accept 0 and -1). */
static int dim_norm(int64_t dim, int rank, int extra, int *out)
{
  int64_t r = (rank > 0 ? rank : 1) + extra;
  if (dim < -r || dim >= r)
    return 0;
  *out = (int)(dim < 0 ? dim + r : dim);
  return 1;
}

static int check_same_shape(node_ctx *c, const tn_meta *in, const tn_meta *out, const char *what)
{
  if (in->me_rank != out->me_rank)
    return node_err(c, "output rank %d differs from %s rank %d", out->me_rank, what, in->me_rank);
  for (int d = 0; d < in->me_rank; d++)
    if (sint_conflict(in->me_sizes[d], out->me_sizes[d]))
      return node_err(c, "output size[%d] %" PRId64 " differs from %s size[%d] %" PRId64,
                      d, out->me_sizes[d].si_val, what, d, in->me_sizes[d].si_val);
  return TN_OK;
}

static int check_pointwise(node_ctx *c)
{
  const tn_meta *out = &c->nc_outs[0];
  int maxrank = 0;
  for (uint32_t i = 0; i < c->nc_nargs; i++) {
    const tn_meta *m = arg_meta(c, i);
    if (m && m->me_rank > maxrank)
      maxrank = m->me_rank;
  }
  if (out->me_rank != maxrank)
    return node_err(c, "output rank %d is not the broadcast rank %d", out->me_rank, maxrank);
  for (int k = 1; k <= maxrank; k++) {
    tn_sint want = TN_SINT(1);
    int have = 0;
    for (uint32_t i = 0; i < c->nc_nargs; i++) {
      const tn_meta *m = arg_meta(c, i);
      if (!m || m->me_rank < k)
        continue;
      tn_sint s = m->me_sizes[m->me_rank - k];
      if (sint_is_one(s))
        continue;
      if (have && sint_conflict(want, s))
        return node_err(c, "arg %u size[%d] %" PRId64 " does not broadcast with %" PRId64,
                        i, m->me_rank - k, s.si_val, want.si_val);
      if (!have || want.si_sym >= 0) {
        want = s;
        have = 1;
      }
    }
    if (sint_conflict(want, out->me_sizes[maxrank - k]))
      return node_err(c, "output size[%d] %" PRId64 " is not the broadcast size %" PRId64,
                      maxrank - k, out->me_sizes[maxrank - k].si_val, want.si_val);
  }
  switch (c->nc_op) {
  case TN_OP_eq_Tensor: case TN_OP_eq_Scalar: case TN_OP_ne_Tensor: case TN_OP_ne_Scalar:
  case TN_OP_lt_Tensor: case TN_OP_lt_Scalar: case TN_OP_le_Tensor: case TN_OP_le_Scalar:
  case TN_OP_gt_Tensor: case TN_OP_gt_Scalar: case TN_OP_ge_Tensor: case TN_OP_ge_Scalar:
  case TN_OP_logical_and: case TN_OP_logical_or: case TN_OP_logical_not:
    if (out->me_dtype != TN_DTYPE_BOOL)
      return node_err(c, "a comparison or logical op must produce bool, not %s",
                      tn_dtype_name(out->me_dtype));
    break;
  case TN_OP_to_copy:
    if (c->nc_args[1].ar_tag == TN_ARG_DTYPE && c->nc_args[1].u.ar_int != out->me_dtype)
      return node_err(c, "output dtype %s differs from the dtype argument %s",
                      tn_dtype_name(out->me_dtype), tn_dtype_name((int)c->nc_args[1].u.ar_int));
    break;
  default:
    break;
  }
  return TN_OK;
}

static int check_factory(node_ctx *c)
{
  const tn_meta *out = &c->nc_outs[0];
  int dt_arg = (int)strlen(tn_op_signature(c->nc_op)) - 4;
  const tn_arg *dt = &c->nc_args[dt_arg];
  if (dt->ar_tag == TN_ARG_DTYPE && dt->u.ar_int != out->me_dtype)
    return node_err(c, "output dtype %s differs from the dtype argument %s",
                    tn_dtype_name(out->me_dtype), tn_dtype_name((int)dt->u.ar_int));
  if (c->nc_op == TN_OP_full) {
    const tn_arg *size = &c->nc_args[0];
    if ((int)size->ar_len != out->me_rank)
      return node_err(c, "output rank %d differs from the size argument's length %u",
                      out->me_rank, size->ar_len);
    for (int d = 0; d < out->me_rank; d++)
      if (sint_conflict(size->u.ar_ints[d], out->me_sizes[d]))
        return node_err(c, "output size[%d] differs from the size argument", d);
  } else if (out->me_rank != (c->nc_op == TN_OP_scalar_tensor ? 0 : 1)) {
    return node_err(c, "output rank %d is wrong for this factory", out->me_rank);
  }
  return TN_OK;
}

static int check_dim_list(node_ctx *c, const tn_arg *a, int rank)
{
  uint64_t seen = 0;
  if (a->ar_tag != TN_ARG_INT_LIST)
    return TN_OK;
  for (uint32_t i = 0; i < a->ar_len; i++) {
    int d;
    if (!dim_norm(a->u.ar_ints[i].si_val, rank, 0, &d))
      return node_err(c, "dim %" PRId64 " out of range for rank %d", a->u.ar_ints[i].si_val, rank);
    if (seen & ((uint64_t)1 << d))
      return node_err(c, "dim %d appears twice", d);
    seen |= (uint64_t)1 << d;
  }
  return TN_OK;
}

static int check_reduce(node_ctx *c)
{
  const tn_meta *in = arg_meta(c, 0);
  const tn_arg *a1 = c->nc_nargs > 1 ? &c->nc_args[1] : NULL;
  int d;
  if (a1 && a1->ar_tag == TN_ARG_INT_LIST)
    return check_dim_list(c, a1, in->me_rank);
  if (a1 && a1->ar_tag == TN_ARG_INT && !dim_norm(a1->u.ar_int, in->me_rank, 0, &d))
    return node_err(c, "dim %" PRId64 " out of range for rank %d", a1->u.ar_int, in->me_rank);
  if ((c->nc_op == TN_OP_argmax || c->nc_op == TN_OP_argmin) &&
      c->nc_outs[0].me_dtype != TN_DTYPE_INT64)
    return node_err(c, "argmax/argmin must produce int64");
  return TN_OK;
}

static int check_norm(node_ctx *c)
{
  const tn_meta *in = arg_meta(c, 0);
  int d;
  if (c->nc_op != TN_OP_native_layer_norm) {
    if (!dim_norm(c->nc_args[1].u.ar_int, in->me_rank, 0, &d))
      return node_err(c, "dim %" PRId64 " out of range for rank %d", c->nc_args[1].u.ar_int, in->me_rank);
    return check_same_shape(c, in, &c->nc_outs[0], "input");
  }
  const tn_arg *ns = &c->nc_args[1];
  if ((int)ns->ar_len > in->me_rank || ns->ar_len == 0)
    return node_err(c, "normalized_shape of length %u does not fit input rank %d", ns->ar_len, in->me_rank);
  for (uint32_t i = 0; i < ns->ar_len; i++)
    if (sint_conflict(ns->u.ar_ints[i], in->me_sizes[in->me_rank - ns->ar_len + i]))
      return node_err(c, "normalized_shape[%u] differs from the input's trailing size", i);
  for (uint32_t i = 2; i <= 3; i++) {
    const tn_meta *w = arg_meta(c, i);
    if (w && w->me_rank != (int)ns->ar_len)
      return node_err(c, "arg %u has rank %d, normalized_shape has length %u", i, w->me_rank, ns->ar_len);
  }
  return check_same_shape(c, in, &c->nc_outs[0], "input");
}

static int64_t meta_numel(const tn_meta *m, int *concrete)
{
  int64_t n = 1;
  *concrete = 1;
  for (int d = 0; d < m->me_rank; d++) {
    if (m->me_sizes[d].si_sym >= 0) {
      *concrete = 0;
      return -1;
    }
    if (m->me_sizes[d].si_val != 0 && n > INT64_MAX / m->me_sizes[d].si_val) {
      *concrete = 0;
      return -1;
    }
    n *= m->me_sizes[d].si_val;
  }
  return n;
}

static int check_view(node_ctx *c)
{
  const tn_meta *out = &c->nc_outs[0];
  const tn_meta *in = arg_meta(c, 0);
  int d = 0, d2 = 0, cin, cout;

  if (c->nc_op == TN_OP_cat) {
    if (c->nc_args[0].ar_len == 0)
      return node_err(c, "cat of an empty list");
    in = &c->nc_g->gr_values[c->nc_args[0].u.ar_refs[0]].va_meta;
  }
  if (out->me_dtype != in->me_dtype && c->nc_op != TN_OP_cat) /* cat promotes its parts' dtypes */
    return node_err(c, "output dtype %s differs from the input's", tn_dtype_name(out->me_dtype));
  switch (c->nc_op) {
  case TN_OP_view: case TN_OP_unsafe_view: case TN_OP_reshape: {
    if ((int)c->nc_args[1].ar_len != out->me_rank)
      return node_err(c, "output rank %d differs from the shape argument's length %u",
                      out->me_rank, c->nc_args[1].ar_len);
    int64_t a = meta_numel(in, &cin), b = meta_numel(out, &cout);
    if (cin && cout && a != b)
      return node_err(c, "cannot view %" PRId64 " elements as %" PRId64, a, b);
    return TN_OK;
  }
  case TN_OP_permute: {
    const tn_arg *p = &c->nc_args[1];
    if ((int)p->ar_len != in->me_rank || out->me_rank != in->me_rank)
      return node_err(c, "permutation of length %u for rank %d", p->ar_len, in->me_rank);
    if (check_dim_list(c, p, in->me_rank) != TN_OK)
      return TN_EINVAL;
    for (int i = 0; i < in->me_rank; i++) {
      dim_norm(p->u.ar_ints[i].si_val, in->me_rank, 0, &d);
      if (sint_conflict(in->me_sizes[d], out->me_sizes[i]))
        return node_err(c, "output size[%d] is not input size[%d]", i, d);
    }
    return TN_OK;
  }
  case TN_OP_transpose_int:
    if (!dim_norm(c->nc_args[1].u.ar_int, in->me_rank, 0, &d) ||
        !dim_norm(c->nc_args[2].u.ar_int, in->me_rank, 0, &d2))
      return node_err(c, "transpose dims out of range for rank %d", in->me_rank);
    return out->me_rank == in->me_rank ? TN_OK : node_err(c, "transpose changes rank");
  case TN_OP_t:
    if (in->me_rank > 2)
      return node_err(c, "t expects a tensor of rank <= 2, got %d", in->me_rank);
    return out->me_rank == in->me_rank ? TN_OK : node_err(c, "t changes rank");
  case TN_OP_expand:
    if ((int)c->nc_args[1].ar_len < in->me_rank || (int)c->nc_args[1].ar_len != out->me_rank)
      return node_err(c, "expand to %u dims from rank %d into rank %d",
                      c->nc_args[1].ar_len, in->me_rank, out->me_rank);
    return TN_OK;
  case TN_OP_squeeze_dim:
  case TN_OP_select_int:
  case TN_OP_slice_Tensor:
    if (!dim_norm(c->nc_args[1].u.ar_int, in->me_rank, 0, &d))
      return node_err(c, "dim %" PRId64 " out of range for rank %d", c->nc_args[1].u.ar_int, in->me_rank);
    if (c->nc_op == TN_OP_select_int && (in->me_rank == 0 || out->me_rank != in->me_rank - 1))
      return node_err(c, "select must drop one dim");
    return TN_OK;
  case TN_OP_squeeze_dims:
    return check_dim_list(c, &c->nc_args[1], in->me_rank);
  case TN_OP_unsqueeze:
    if (!dim_norm(c->nc_args[1].u.ar_int, in->me_rank, 1, &d) || out->me_rank != in->me_rank + 1)
      return node_err(c, "unsqueeze dim %" PRId64 " invalid for rank %d", c->nc_args[1].u.ar_int, in->me_rank);
    return TN_OK;
  case TN_OP_cat: {
    if (!dim_norm(c->nc_args[1].u.ar_int, out->me_rank, 0, &d))
      return node_err(c, "dim %" PRId64 " out of range for rank %d", c->nc_args[1].u.ar_int, out->me_rank);
    return TN_OK;
  }
  case TN_OP_split_with_sizes:
    if (c->nc_args[1].ar_len != c->nc_nout)
      return node_err(c, "%u split sizes but %u outputs", c->nc_args[1].ar_len, c->nc_nout);
    if (!dim_norm(c->nc_args[2].u.ar_int, in->me_rank, 0, &d))
      return node_err(c, "dim %" PRId64 " out of range for rank %d", c->nc_args[2].u.ar_int, in->me_rank);
    return TN_OK;
  default:
    return TN_OK;
  }
}

static int check_index(node_ctx *c)
{
  const tn_meta *out = &c->nc_outs[0];
  const tn_meta *src = arg_meta(c, 0);
  int index_arg = c->nc_op == TN_OP_embedding ? 1 : 2;
  const tn_meta *idx = arg_meta(c, (uint32_t)index_arg);
  int d;
  if (idx->me_dtype != TN_DTYPE_INT64 && idx->me_dtype != TN_DTYPE_INT32)
    return node_err(c, "index tensor must be int64 or int32, not %s", tn_dtype_name(idx->me_dtype));
  if (out->me_dtype != src->me_dtype)
    return node_err(c, "output dtype %s differs from the source's %s",
                    tn_dtype_name(out->me_dtype), tn_dtype_name(src->me_dtype));
  if (c->nc_op == TN_OP_embedding) {
    if (src->me_rank != 2 || out->me_rank != idx->me_rank + 1)
      return node_err(c, "embedding needs a 2-d weight and an output of index rank + 1");
    return TN_OK;
  }
  if (!dim_norm(c->nc_args[1].u.ar_int, src->me_rank, 0, &d))
    return node_err(c, "dim %" PRId64 " out of range for rank %d", c->nc_args[1].u.ar_int, src->me_rank);
  if (c->nc_op == TN_OP_index_select && idx->me_rank > 1)
    return node_err(c, "index_select needs an index of rank <= 1");
  return TN_OK;
}

static int check_matmul(node_ctx *c)
{
  int batched = c->nc_op == TN_OP_bmm || c->nc_op == TN_OP_baddbmm;
  uint32_t first = (c->nc_op == TN_OP_mm || c->nc_op == TN_OP_bmm) ? 0 : 1;
  const tn_meta *a = arg_meta(c, first), *b = arg_meta(c, first + 1);
  const tn_meta *out = &c->nc_outs[0];
  int r = batched ? 3 : 2;

  if (a->me_rank != r || b->me_rank != r || out->me_rank != r)
    return node_err(c, "%s needs rank-%d operands and output, got %d, %d and %d",
                    tn_op_name(c->nc_op), r, a->me_rank, b->me_rank, out->me_rank);
  if (a->me_dtype != b->me_dtype || out->me_dtype != a->me_dtype)
    return node_err(c, "operand dtypes %s and %s, output %s must agree", tn_dtype_name(a->me_dtype),
                    tn_dtype_name(b->me_dtype), tn_dtype_name(out->me_dtype));
  if (sint_conflict(a->me_sizes[r - 1], b->me_sizes[r - 2]))
    return node_err(c, "inner sizes differ: %" PRId64 " and %" PRId64,
                    a->me_sizes[r - 1].si_val, b->me_sizes[r - 2].si_val);
  if (batched && sint_conflict(a->me_sizes[0], b->me_sizes[0]))
    return node_err(c, "batch sizes differ");
  if (sint_conflict(out->me_sizes[r - 2], a->me_sizes[r - 2]) ||
      sint_conflict(out->me_sizes[r - 1], b->me_sizes[r - 1]))
    return node_err(c, "output sizes do not match the operands");
  if (first == 1 && arg_meta(c, 0)->me_rank > r)
    return node_err(c, "the added tensor has rank %d > %d", arg_meta(c, 0)->me_rank, r);
  return TN_OK;
}

static int node_check(node_ctx *c)
{
  const char *sig = tn_op_signature(c->nc_op);
  int nout = tn_op_outputs(c->nc_op);
  char amsg[200];

  if (c->nc_op != TN_OP_fallback && c->nc_nout == 0)
    return node_err(c, "must produce at least one output");
  if (c->nc_op != TN_OP_fallback && c->nc_nargs != strlen(sig))
    return node_err(c, "expects %zu arguments, got %u", strlen(sig), c->nc_nargs);
  if (c->nc_nargs > TN_MAX_ARGS)
    return node_err(c, "%u arguments exceed the limit %d", c->nc_nargs, TN_MAX_ARGS);
  if (nout >= 0 ? c->nc_nout != (uint32_t)nout : c->nc_nout > TN_MAX_OUTPUTS)
    return node_err(c, "produces %u outputs, expected %d", c->nc_nout, nout);
  for (uint32_t i = 0; i < c->nc_nargs; i++) {
    const tn_arg *a = &c->nc_args[i];
    if (c->nc_op != TN_OP_fallback && !sig_accepts(sig[i], a->ar_tag))
      return node_err(c, "arg %u: a %s is not accepted here (signature '%c')",
                      i, tn_arg_tag_name(a->ar_tag), sig[i]);
    int syms = c->nc_op == TN_OP_fallback || sig[i] == 'y';
    if (arg_check(c->nc_g, a, syms, amsg, sizeof amsg) != TN_OK)
      return node_err(c, "arg %u: %s", i, amsg);
  }
  for (uint32_t k = 0; k < c->nc_nout; k++)
    if (meta_check(c->nc_g, &c->nc_outs[k], amsg, sizeof amsg) != TN_OK)
      return node_err(c, "output %u: %s", k, amsg);
  switch (tn_op_class(c->nc_op)) {
  case TN_OPC_POINTWISE: return check_pointwise(c);
  case TN_OPC_FACTORY: return check_factory(c);
  case TN_OPC_REDUCE: return check_reduce(c);
  case TN_OPC_NORM: return check_norm(c);
  case TN_OPC_VIEW: return check_view(c);
  case TN_OPC_INDEX: return check_index(c);
  case TN_OPC_MATMUL: return check_matmul(c);
  default: return TN_OK;
  }
}

/* Deep-copies args into g's heap. */
static int args_copy(tn_graph *g, const tn_arg *src, uint32_t n, tn_arg **out)
{
  tn_arg *dst = tn_graph_alloc(g, (size_t)n * sizeof *dst);
  if (!dst)
    return TN_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    dst[i] = src[i];
    switch (src[i].ar_tag) {
    case TN_ARG_TENSOR_LIST:
    case TN_ARG_OPT_TENSOR_LIST: {
      int32_t *r = tn_graph_alloc(g, (size_t)src[i].ar_len * sizeof *r);
      if (!r)
        return TN_ENOMEM;
      memcpy(r, src[i].u.ar_refs, (size_t)src[i].ar_len * sizeof *r);
      dst[i].u.ar_refs = r;
      break;
    }
    case TN_ARG_INT_LIST: {
      tn_sint *v = tn_graph_alloc(g, (size_t)src[i].ar_len * sizeof *v);
      if (!v)
        return TN_ENOMEM;
      memcpy(v, src[i].u.ar_ints, (size_t)src[i].ar_len * sizeof *v);
      dst[i].u.ar_ints = v;
      break;
    }
    case TN_ARG_STRING:
    case TN_ARG_DEVICE:
      if (!(dst[i].u.ar_str = graph_strdup(g, src[i].u.ar_str, src[i].ar_len)))
        return TN_ENOMEM;
      break;
    default:
      break;
    }
  }
  *out = dst;
  return TN_OK;
}

int tn_graph_check_node(const tn_graph *g, int op, const tn_arg *args, uint32_t nargs,
                        const tn_meta *outs, uint32_t nout, char *msg, size_t len)
{
  assert(msg && len);
  if (op < 0 || op >= TN_OP__COUNT || op == TN_OP_fallback) {
    snprintf(msg, len, "not an op of the table");
    return TN_EINVAL;
  }
  if ((nargs && !args) || (nout && !outs)) {
    snprintf(msg, len, "NULL argument or output arrays");
    return TN_EINVAL;
  }
  node_ctx c = {g, op, args, nargs, outs, nout, msg, len};
  return node_check(&c);
}

int tn_graph_add_node(tn_graph *g, int op, const char *target,
                      const tn_arg *args, uint32_t nargs,
                      const tn_meta *outs, uint32_t nout, int32_t *out_values)
{
  char msg[TN_ERRMSG_LEN - 96];
  uint32_t id = g->gr_nnodes;
  int rc = graph_enter(g);

  if (rc != TN_OK)
    return rc;
  if (op < 0 || op >= TN_OP__COUNT)
    return tn_graph_fail(g, TN_EINVAL, "node %u: unknown op %d", id, op);
  const char *label = op == TN_OP_fallback && target ? target : tn_op_name(op);
  if (op == TN_OP_fallback) {
    size_t tl = target ? strlen(target) : 0;
    if (!target || !strstr(target, "::") || tl > 256 || !string_valid(target, (uint32_t)tl))
      return tn_graph_fail(g, TN_EINVAL, "node %u (fallback): target must be a qualified op name", id);
  } else if (target) {
    return tn_graph_fail(g, TN_EINVAL, "node %u (%s): only fallback nodes take a target", id, label);
  }
  if ((nargs && !args) || (nout && (!outs || !out_values)))
    return tn_graph_fail(g, TN_EINVAL, "node %u (%s): NULL argument or output arrays", id, label);
  node_ctx c = {g, op, args, nargs, outs, nout, msg, sizeof msg};
  if (node_check(&c) != TN_OK)
    return tn_graph_fail(g, TN_EINVAL, "node %u (%s): %s", id, label, msg);
  if ((uint64_t)g->gr_nvalues + nout > INT32_MAX || id >= INT32_MAX)
    return tn_graph_fail(g, TN_EINVAL, "node %u (%s): graph too large", id, label);

  rc = graph_reserve(g, (void **)&g->gr_nodes, &g->gr_capnodes, id + 1, sizeof(tn_node));
  if (rc == TN_OK)
    rc = graph_reserve(g, (void **)&g->gr_values, &g->gr_capvalues, g->gr_nvalues + nout,
                       sizeof(tn_value));
  tn_node *n = rc == TN_OK ? &g->gr_nodes[id] : NULL;
  tn_arg *acopy = NULL;
  int32_t *ov = NULL;
  if (rc == TN_OK)
    rc = args_copy(g, args, nargs, &acopy);
  if (rc == TN_OK && !(ov = tn_graph_alloc(g, (size_t)nout * sizeof *ov)))
    rc = TN_ENOMEM;
  if (rc == TN_OK && target && !(n->no_target = graph_strdup(g, target, strlen(target))))
    rc = TN_ENOMEM;
  for (uint32_t k = 0; rc == TN_OK && k < nout; k++) {
    tn_value *v = &g->gr_values[g->gr_nvalues + k];
    memset(v, 0, sizeof *v);
    v->va_kind = TN_VALUE_NODE;
    v->va_index = (int32_t)k;
    v->va_node = (int32_t)id;
    rc = meta_copy(g, &v->va_meta, &outs[k]);
    ov[k] = (int32_t)(g->gr_nvalues + k);
  }
  if (rc != TN_OK)
    return tn_graph_fail(g, rc, "node %u (%s): out of memory", id, label);
  n->no_op = op;
  if (!target)
    n->no_target = NULL;
  n->no_nargs = nargs;
  n->no_args = acopy;
  n->no_nout = nout;
  n->no_out = ov;
  memcpy(out_values, ov, (size_t)nout * sizeof *ov);
  g->gr_nvalues += nout;
  g->gr_nnodes++;
  return TN_OK;
}

int tn_graph_set_outputs(tn_graph *g, const int32_t *values, uint32_t n)
{
  int rc = graph_enter(g);
  if (rc != TN_OK)
    return rc;
  if (n > TN_MAX_LIST || (n && !values))
    return tn_graph_fail(g, TN_EINVAL, "outputs: bad list of length %u", n);
  for (uint32_t i = 0; i < n; i++)
    if (values[i] < 0 || (uint32_t)values[i] >= g->gr_nvalues)
      return tn_graph_fail(g, TN_EINVAL, "output %u refers to undefined value %d", i, values[i]);
  int32_t *o = tn_graph_alloc(g, (size_t)n * sizeof *o);
  if (!o)
    return tn_graph_fail(g, TN_ENOMEM, "outputs: out of memory");
  memcpy(o, values, (size_t)n * sizeof *o);
  g->gr_outputs = o;
  g->gr_noutputs = n;
  return TN_OK;
}

/* -- Accessors ------------------------------------------------------------ */

uint32_t tn_graph_num_symbols(const tn_graph *g) { return g->gr_nsyms; }
uint32_t tn_graph_num_inputs(const tn_graph *g) { return g->gr_ninputs; }
uint32_t tn_graph_num_values(const tn_graph *g) { return g->gr_nvalues; }
uint32_t tn_graph_num_nodes(const tn_graph *g) { return g->gr_nnodes; }
uint32_t tn_graph_num_outputs(const tn_graph *g) { return g->gr_noutputs; }
const int32_t *tn_graph_outputs(const tn_graph *g) { return g->gr_outputs; }

const tn_value *tn_graph_value(const tn_graph *g, int32_t id)
{
  return id >= 0 && (uint32_t)id < g->gr_nvalues ? &g->gr_values[id] : NULL;
}

const tn_node *tn_graph_node(const tn_graph *g, int32_t id)
{
  return id >= 0 && (uint32_t)id < g->gr_nnodes ? &g->gr_nodes[id] : NULL;
}
