/*
** Graph IR: the canonical binary encoding, its validating decoder, the graph
** key and the text dump (see graph.h).
**
** Encoding (all integers little-endian):
**   "TNGR" u32 version u32 nsyms u32 ninputs u32 nnodes u32 noutputs
**   input*:  u8 kind; ARG: i32 position, str path; PARAM: str name;
**            CONST: i32 number; then meta
**   node*:   u16 op; [fallback: str target]; u16 nargs; arg*; u16 nout; meta*
**   output*: u32 value
**   meta:    u8 dtype u8 rank sint[rank] sizes sint[rank] strides
**   sint:    u8 0 i64 value | u8 1 u32 symbol
**   str:     u32 length, bytes (no NUL)
**   arg:     u8 tag; NONE: -; TENSOR: u32 value; TENSOR_LIST: u32 n, u32[n];
**            INT BOOL DTYPE LAYOUT MEMFMT: i64; FLOAT: u64 bits; SYM: u32;
**            INT_LIST: u32 n, sint[n]; STRING DEVICE: str
** Values are numbered inputs first (in canonical order), then node outputs
** in node order; symbols by first use.
*/
#include "graph_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

static const uint8_t graph_magic[4] = {'T', 'N', 'G', 'R'};
#define HEADER_LEN 24
#define HEADER_NSYMS_AT 8

/* -- Growable output buffer in the graph's heap ---------------------------- */

typedef struct tn_buf {
  tn_graph *bu_g;
  uint8_t *bu_data;
  size_t bu_len, bu_cap;
  int bu_rc;
} tn_buf;

static void buf_put(tn_buf *b, const void *p, size_t n)
{
  if (b->bu_rc != TN_OK)
    return;
  if (b->bu_len + n > b->bu_cap) {
    size_t cap = b->bu_cap ? b->bu_cap : 256;
    while (cap < b->bu_len + n)
      cap *= 2;
    uint8_t *d = mi_heap_realloc(b->bu_g->gr_heap, b->bu_data, cap);
    if (!d) {
      b->bu_rc = TN_ENOMEM;
      return;
    }
    b->bu_data = d;
    b->bu_cap = cap;
  }
  memcpy(b->bu_data + b->bu_len, p, n);
  b->bu_len += n;
}

static void buf_le(tn_buf *b, uint64_t v, int n)
{
  uint8_t t[8];
  for (int i = 0; i < n; i++)
    t[i] = (uint8_t)(v >> (8 * i));
  buf_put(b, t, (size_t)n);
}

static void buf_str(tn_buf *b, const char *s, size_t n)
{
  buf_le(b, n, 4);
  buf_put(b, s, n);
}

static void buf_printf(tn_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(tn_buf *b, const char *fmt, ...)
{
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0)
    buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* -- Canonical order ------------------------------------------------------- */

static int input_cmp(const tn_value *a, const tn_value *b)
{
  if (a->va_kind != b->va_kind)
    return a->va_kind < b->va_kind ? -1 : 1;
  if (a->va_kind != TN_VALUE_PARAM && a->va_index != b->va_index)
    return a->va_index < b->va_index ? -1 : 1;
  if (a->va_kind == TN_VALUE_CONST)
    return 0;
  return strcmp(a->va_name, b->va_name);
}

/* Stable bottom-up merge sort of input ids by role. */
static void inputs_sort(const tn_graph *g, int32_t *ids, int32_t *tmp, uint32_t n)
{
  for (uint32_t w = 1; w < n; w *= 2) {
    for (uint32_t lo = 0; lo < n; lo += 2 * w) {
      uint32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      uint32_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi)
        tmp[k++] = input_cmp(&g->gr_values[ids[j]], &g->gr_values[ids[i]]) < 0 ? ids[j++] : ids[i++];
      while (i < mid)
        tmp[k++] = ids[i++];
      while (j < hi)
        tmp[k++] = ids[j++];
    }
    memcpy(ids, tmp, (size_t)n * sizeof *ids);
  }
}

/* The k-th tensor input of node n (across tensor args and list elements),
** or -1 when n has fewer. */

typedef struct walk_frame {
  int32_t wf_node;
  uint32_t wf_arg, wf_elem;
} walk_frame;

/* Post-order DFS from node root; appends finished nodes to order. */
static void walk_from(const tn_graph *g, int32_t root, uint8_t *seen, walk_frame *stack,
                      int32_t *order, uint32_t *norder)
{
  uint32_t sp = 0;
  if (seen[root])
    return;
  seen[root] = 1;
  stack[sp++] = (walk_frame){root, 0, 0};
  while (sp) {
    walk_frame *f = &stack[sp - 1];
    int32_t v = tn_graph_node_input(&g->gr_nodes[f->wf_node], &f->wf_arg, &f->wf_elem);
    if (v < 0) {
      order[(*norder)++] = f->wf_node;
      sp--;
      continue;
    }
    int32_t p = g->gr_values[v].va_node;
    if (p >= 0 && !seen[p]) {
      seen[p] = 1;
      stack[sp++] = (walk_frame){p, 0, 0};
    }
  }
}

/* -- Encoder --------------------------------------------------------------- */

typedef struct enc_state {
  tn_buf *es_buf;
  int32_t *es_vmap;   /* value id -> canonical id */
  int32_t *es_smap;   /* symbol id -> canonical id or -1 */
  uint32_t es_nsyms;  /* canonical symbols assigned so far */
} enc_state;

static void enc_sint(enc_state *e, tn_sint v)
{
  if (v.si_sym < 0) {
    buf_le(e->es_buf, 0, 1);
    buf_le(e->es_buf, (uint64_t)v.si_val, 8);
    return;
  }
  if (e->es_smap[v.si_sym] < 0)
    e->es_smap[v.si_sym] = (int32_t)e->es_nsyms++;
  buf_le(e->es_buf, v.si_val ? 2 : 1, 1);
  buf_le(e->es_buf, (uint32_t)e->es_smap[v.si_sym], 4);
  if (v.si_val)
    buf_le(e->es_buf, (uint64_t)v.si_val, 8);
}

static void enc_meta(enc_state *e, const tn_meta *m)
{
  buf_le(e->es_buf, (uint64_t)m->me_dtype, 1);
  buf_le(e->es_buf, (uint64_t)m->me_rank, 1);
  for (int d = 0; d < m->me_rank; d++)
    enc_sint(e, m->me_sizes[d]);
  for (int d = 0; d < m->me_rank; d++)
    enc_sint(e, m->me_strides[d]);
}

static void enc_arg(enc_state *e, const tn_arg *a)
{
  tn_buf *b = e->es_buf;
  buf_le(b, (uint64_t)a->ar_tag, 1);
  switch (a->ar_tag) {
  case TN_ARG_TENSOR:
    buf_le(b, (uint32_t)e->es_vmap[a->u.ar_ref], 4);
    break;
  case TN_ARG_TENSOR_LIST:
  case TN_ARG_OPT_TENSOR_LIST:
    buf_le(b, a->ar_len, 4);
    for (uint32_t i = 0; i < a->ar_len; i++)  /* None (-1) as 0xffffffff */
      buf_le(b, a->u.ar_refs[i] < 0 ? UINT32_MAX : (uint32_t)e->es_vmap[a->u.ar_refs[i]], 4);
    break;
  case TN_ARG_INT: case TN_ARG_BOOL: case TN_ARG_DTYPE: case TN_ARG_LAYOUT: case TN_ARG_MEMFMT:
    buf_le(b, (uint64_t)a->u.ar_int, 8);
    break;
  case TN_ARG_FLOAT: {
    uint64_t bits;
    memcpy(&bits, &a->u.ar_float, 8);
    buf_le(b, bits, 8);
    break;
  }
  case TN_ARG_SYM:
    enc_sint(e, TN_SYM(a->u.ar_ref));
    break;
  case TN_ARG_INT_LIST:
    buf_le(b, a->ar_len, 4);
    for (uint32_t i = 0; i < a->ar_len; i++)
      enc_sint(e, a->u.ar_ints[i]);
    break;
  case TN_ARG_STRING: case TN_ARG_DEVICE:
    buf_str(b, a->u.ar_str, a->ar_len);
    break;
  default:
    break;
  }
}

int tn_graph_encode(tn_graph *g, const uint8_t **out, size_t *outlen)
{
  int rc = tn_graph_enter_read(g);
  tn_buf b = {g, NULL, 0, 0, TN_OK};
  int32_t *vmap = NULL, *smap = NULL, *inputs = NULL, *tmp = NULL, *order = NULL;
  uint8_t *seen = NULL;
  walk_frame *stack = NULL;

  if (rc != TN_OK)
    return rc;
  if (g->gr_enc_valid) {
    *out = g->gr_enc;
    *outlen = g->gr_enclen;
    return TN_OK;
  }
  vmap = tn_graph_alloc(g, (size_t)g->gr_nvalues * sizeof *vmap);
  smap = tn_graph_alloc(g, (size_t)g->gr_nsyms * sizeof *smap);
  inputs = tn_graph_alloc(g, (size_t)g->gr_ninputs * sizeof *inputs);
  tmp = tn_graph_alloc(g, (size_t)g->gr_ninputs * sizeof *tmp);
  order = tn_graph_alloc(g, (size_t)g->gr_nnodes * sizeof *order);
  seen = tn_graph_alloc(g, g->gr_nnodes);
  stack = tn_graph_alloc(g, (size_t)g->gr_nnodes * sizeof *stack);
  if (!vmap || !smap || !inputs || !tmp || !order || !seen || !stack) {
    rc = TN_ENOMEM;
    goto done;
  }

  /* Canonical numbering: inputs by role, nodes by the walk. */
  for (uint32_t i = 0; i < g->gr_ninputs; i++)
    inputs[i] = (int32_t)i;
  inputs_sort(g, inputs, tmp, g->gr_ninputs);
  for (uint32_t i = 0; i < g->gr_ninputs; i++)
    vmap[inputs[i]] = (int32_t)i;
  memset(seen, 0, g->gr_nnodes);
  uint32_t norder = 0;
  for (uint32_t i = 0; i < g->gr_noutputs; i++) {
    int32_t p = g->gr_values[g->gr_outputs[i]].va_node;
    if (p >= 0)
      walk_from(g, p, seen, stack, order, &norder);
  }
  for (uint32_t i = 0; i < g->gr_nnodes; i++)
    walk_from(g, (int32_t)i, seen, stack, order, &norder);
  int32_t next = (int32_t)g->gr_ninputs;
  for (uint32_t k = 0; k < norder; k++) {
    const tn_node *n = &g->gr_nodes[order[k]];
    for (uint32_t j = 0; j < n->no_nout; j++)
      vmap[n->no_out[j]] = next++;
  }
  for (uint32_t s = 0; s < g->gr_nsyms; s++)
    smap[s] = -1;

  enc_state e = {&b, vmap, smap, 0};
  buf_put(&b, graph_magic, 4);
  buf_le(&b, TN_GRAPH_FORMAT_VERSION, 4);
  buf_le(&b, 0, 4); /* nsyms, patched below */
  buf_le(&b, g->gr_ninputs, 4);
  buf_le(&b, g->gr_nnodes, 4);
  buf_le(&b, g->gr_noutputs, 4);
  for (uint32_t i = 0; i < g->gr_ninputs; i++) {
    const tn_value *v = &g->gr_values[inputs[i]];
    buf_le(&b, (uint64_t)v->va_kind, 1);
    if (v->va_kind != TN_VALUE_PARAM)
      buf_le(&b, (uint32_t)v->va_index, 4);
    if (v->va_kind != TN_VALUE_CONST)
      buf_str(&b, v->va_name, strlen(v->va_name));
    enc_meta(&e, &v->va_meta);
  }
  for (uint32_t k = 0; k < norder; k++) {
    const tn_node *n = &g->gr_nodes[order[k]];
    buf_le(&b, (uint64_t)n->no_op, 2);
    if (n->no_op == TN_OP_fallback)
      buf_str(&b, n->no_target, strlen(n->no_target));
    buf_le(&b, n->no_nargs, 2);
    for (uint32_t i = 0; i < n->no_nargs; i++)
      enc_arg(&e, &n->no_args[i]);
    buf_le(&b, n->no_nout, 2);
    for (uint32_t j = 0; j < n->no_nout; j++)
      enc_meta(&e, &g->gr_values[n->no_out[j]].va_meta);
  }
  for (uint32_t i = 0; i < g->gr_noutputs; i++)
    buf_le(&b, (uint32_t)vmap[g->gr_outputs[i]], 4);
  rc = b.bu_rc;
  if (rc != TN_OK)
    goto done;
  for (int i = 0; i < 4; i++)
    b.bu_data[HEADER_NSYMS_AT + i] = (uint8_t)(e.es_nsyms >> (8 * i));

  mi_free(g->gr_enc);
  mi_free(g->gr_canon_nodes);
  mi_free(g->gr_canon_values);
  g->gr_enc = b.bu_data;
  g->gr_enclen = b.bu_len;
  g->gr_canon_nodes = order;   /* canonical position -> node id */
  g->gr_canon_values = vmap;   /* value id -> canonical value id */
  g->gr_enc_valid = 1;
  b.bu_data = NULL;
  order = vmap = NULL;
  *out = g->gr_enc;
  *outlen = g->gr_enclen;
done:
  mi_free(b.bu_data);
  mi_free(vmap);
  mi_free(smap);
  mi_free(inputs);
  mi_free(tmp);
  mi_free(order);
  mi_free(seen);
  mi_free(stack);
  return rc;
}

int tn_graph_canonical(tn_graph *g, const int32_t **node_order, const int32_t **value_map)
{
  const uint8_t *enc;
  size_t len;
  int rc = tn_graph_encode(g, &enc, &len);
  if (rc == TN_OK) {
    *node_order = g->gr_canon_nodes;
    *value_map = g->gr_canon_values;
  }
  return rc;
}

/* -- Key ------------------------------------------------------------------- */

int tn_graph_key(tn_graph *g, const void *ctx, size_t ctxlen, uint8_t key[16])
{
  const uint8_t *enc;
  size_t enclen;
  int rc = tn_graph_encode(g, &enc, &enclen);
  if (rc != TN_OK)
    return rc;
  tn_buf b = {g, NULL, 0, 0, TN_OK};
  buf_le(&b, TN_GRAPH_FORMAT_VERSION, 4);
  buf_le(&b, enclen, 8);
  buf_put(&b, enc, enclen);
  if (ctxlen)
    buf_put(&b, ctx, ctxlen);
  if (b.bu_rc == TN_OK) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(b.bu_data, b.bu_len));
    memcpy(key, c.digest, 16);
  }
  mi_free(b.bu_data);
  return b.bu_rc;
}

/* -- Decoder --------------------------------------------------------------- */

typedef struct tn_rd {
  const uint8_t *rd_base, *rd_p, *rd_end;
  int rd_rc;
  char *rd_err;
  size_t rd_errlen;
} tn_rd;

static void rd_fail(tn_rd *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rd_fail(tn_rd *r, int rc, const char *fmt, ...)
{
  if (r->rd_rc != TN_OK)
    return;
  char what[TN_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(r->rd_err, r->rd_errlen, "offset %zu: %s", (size_t)(r->rd_p - r->rd_base), what);
  r->rd_rc = rc;
}

static uint64_t rd_le(tn_rd *r, int n)
{
  uint64_t v = 0;
  if (r->rd_rc != TN_OK)
    return 0;
  if (r->rd_end - r->rd_p < n) {
    rd_fail(r, TN_ETRUNC, "input ends inside a %d-byte field", n);
    return 0;
  }
  for (int i = 0; i < n; i++)
    v |= (uint64_t)r->rd_p[i] << (8 * i);
  r->rd_p += n;
  return v;
}

static size_t rd_left(const tn_rd *r)
{
  return (size_t)(r->rd_end - r->rd_p);
}

/* Reads a count whose elements need at least min_each bytes. */
static uint32_t rd_count(tn_rd *r, size_t min_each, uint32_t limit, const char *what)
{
  uint32_t n = (uint32_t)rd_le(r, 4);
  if (r->rd_rc == TN_OK && (n > limit || (size_t)n * min_each > rd_left(r)))
    rd_fail(r, n > limit ? TN_ECORRUPT : TN_ETRUNC, "%s count %u exceeds the input", what, n);
  return r->rd_rc == TN_OK ? n : 0;
}

/* Reads a str into buf (TN_MAX_STRING + 1 bytes), NUL-terminated. */
static uint32_t rd_str(tn_rd *r, char *buf)
{
  uint32_t n = rd_count(r, 1, TN_MAX_STRING, "string");
  if (r->rd_rc != TN_OK)
    return 0;
  memcpy(buf, r->rd_p, n);
  buf[n] = 0;
  if (memchr(buf, 0, n))
    rd_fail(r, TN_ECORRUPT, "string holds a NUL byte");
  r->rd_p += n;
  return n;
}

static tn_sint rd_sint(tn_rd *r)
{
  int tag = (int)rd_le(r, 1);
  if (tag == 0)
    return TN_SINT((int64_t)rd_le(r, 8));
  if (tag == 1 || tag == 2) {
    uint32_t s = (uint32_t)rd_le(r, 4);
    int64_t scale = tag == 2 ? (int64_t)rd_le(r, 8) : 0;
    if (s > INT32_MAX)
      rd_fail(r, TN_ECORRUPT, "symbol %u out of range", s);
    if (tag == 2 && scale < 2)
      rd_fail(r, TN_ECORRUPT, "symbol scale %" PRId64 " below 2", scale);
    return TN_SYM_SCALED(scale, (int32_t)(s & INT32_MAX));
  }
  rd_fail(r, TN_ECORRUPT, "bad integer tag %d", tag);
  return TN_SINT(0);
}

/* Reads a meta whose size arrays go into sizes/strides (TN_MAX_RANK each). */
static void rd_meta(tn_rd *r, tn_meta *m, tn_sint *sizes, tn_sint *strides)
{
  m->me_dtype = (int)rd_le(r, 1);
  m->me_rank = (int)rd_le(r, 1);
  m->me_sizes = sizes;
  m->me_strides = strides;
  if (r->rd_rc == TN_OK && m->me_rank > TN_MAX_RANK) {
    rd_fail(r, TN_ECORRUPT, "rank %d exceeds %d", m->me_rank, TN_MAX_RANK);
    return;
  }
  for (int d = 0; d < m->me_rank && r->rd_rc == TN_OK; d++)
    sizes[d] = rd_sint(r);
  for (int d = 0; d < m->me_rank && r->rd_rc == TN_OK; d++)
    strides[d] = rd_sint(r);
}

/* Scratch of one node: list payloads are allocated in the graph's heap and
** freed when the node is stored. */
typedef struct node_scratch {
  tn_arg ns_args[TN_MAX_ARGS];
  void *ns_lists[TN_MAX_ARGS];
  char ns_target[TN_MAX_STRING + 1];
} node_scratch;

static void rd_arg(tn_rd *r, tn_graph *g, node_scratch *s, uint32_t i)
{
  tn_arg *a = &s->ns_args[i];
  memset(a, 0, sizeof *a);
  a->ar_tag = (int)rd_le(r, 1);
  switch (a->ar_tag) {
  case TN_ARG_NONE:
    break;
  case TN_ARG_TENSOR:
    a->u.ar_ref = (int32_t)(rd_le(r, 4) & INT32_MAX);
    break;
  case TN_ARG_TENSOR_LIST:
  case TN_ARG_OPT_TENSOR_LIST: {  /* the builder rejects a None in a plain tensor list */
    a->ar_len = rd_count(r, 4, TN_MAX_LIST, "tensor list");
    int32_t *refs = tn_graph_alloc(g, (size_t)a->ar_len * sizeof *refs);
    if (!refs) {
      rd_fail(r, TN_ENOMEM, "out of memory");
      break;
    }
    s->ns_lists[i] = refs;
    for (uint32_t k = 0; k < a->ar_len; k++) {
      uint32_t v = (uint32_t)rd_le(r, 4);
      refs[k] = v > INT32_MAX ? -1 : (int32_t)v;
    }
    a->u.ar_refs = refs;
    break;
  }
  case TN_ARG_INT: case TN_ARG_BOOL: case TN_ARG_DTYPE: case TN_ARG_LAYOUT: case TN_ARG_MEMFMT:
    a->u.ar_int = (int64_t)rd_le(r, 8);
    break;
  case TN_ARG_FLOAT: {
    uint64_t bits = rd_le(r, 8);
    memcpy(&a->u.ar_float, &bits, 8);
    break;
  }
  case TN_ARG_SYM: {
    tn_sint v = rd_sint(r);
    if (r->rd_rc == TN_OK && (v.si_sym < 0 || v.si_val != 0))
      rd_fail(r, TN_ECORRUPT, "symbol argument holds a plain int or a scaled symbol");
    a->u.ar_ref = v.si_sym;
    break;
  }
  case TN_ARG_INT_LIST: {
    a->ar_len = rd_count(r, 5, TN_MAX_LIST, "int list");
    tn_sint *v = tn_graph_alloc(g, (size_t)a->ar_len * sizeof *v);
    if (!v) {
      rd_fail(r, TN_ENOMEM, "out of memory");
      break;
    }
    s->ns_lists[i] = v;
    for (uint32_t k = 0; k < a->ar_len; k++)
      v[k] = rd_sint(r);
    a->u.ar_ints = v;
    break;
  }
  case TN_ARG_STRING: case TN_ARG_DEVICE: {
    char *str = tn_graph_alloc(g, TN_MAX_STRING + 1);
    if (!str) {
      rd_fail(r, TN_ENOMEM, "out of memory");
      break;
    }
    s->ns_lists[i] = str;
    a->ar_len = rd_str(r, str);
    a->u.ar_str = str;
    break;
  }
  default:
    rd_fail(r, TN_ECORRUPT, "unknown argument tag %d", a->ar_tag);
  }
}

static void rd_node(tn_rd *r, tn_graph *g, node_scratch *s)
{
  uint32_t nargs = 0, nout = 0;
  tn_meta *outs = NULL;
  tn_sint *dims = NULL;
  int32_t *ovals = NULL;

  memset(s->ns_lists, 0, sizeof s->ns_lists);
  int op = (int)rd_le(r, 2);
  if (r->rd_rc == TN_OK && op >= TN_OP__COUNT) {
    rd_fail(r, TN_ECORRUPT, "unknown op %d", op);
    goto done;
  }
  if (op == TN_OP_fallback)
    rd_str(r, s->ns_target);
  nargs = (uint32_t)rd_le(r, 2);
  if (r->rd_rc == TN_OK && nargs > TN_MAX_ARGS) {
    rd_fail(r, TN_ECORRUPT, "%u arguments exceed %d", nargs, TN_MAX_ARGS);
    goto done;
  }
  for (uint32_t i = 0; i < nargs && r->rd_rc == TN_OK; i++)
    rd_arg(r, g, s, i);
  nout = (uint32_t)rd_le(r, 2);
  if (r->rd_rc != TN_OK)
    goto done;
  if (nout > TN_MAX_OUTPUTS || (size_t)nout * 2 > rd_left(r)) {
    rd_fail(r, TN_ETRUNC, "%u outputs exceed the input", nout);
    goto done;
  }
  outs = tn_graph_alloc(g, (size_t)nout * sizeof *outs);
  dims = tn_graph_alloc(g, (size_t)nout * 2 * TN_MAX_RANK * sizeof *dims);
  ovals = tn_graph_alloc(g, (size_t)nout * sizeof *ovals);
  if (!outs || !dims || !ovals) {
    rd_fail(r, TN_ENOMEM, "out of memory");
    goto done;
  }
  for (uint32_t k = 0; k < nout && r->rd_rc == TN_OK; k++)
    rd_meta(r, &outs[k], dims + 2 * k * TN_MAX_RANK, dims + (2 * k + 1) * TN_MAX_RANK);
  if (r->rd_rc != TN_OK)
    goto done;
  int rc = tn_graph_add_node(g, op, op == TN_OP_fallback ? s->ns_target : NULL,
                             s->ns_args, nargs, outs, nout, ovals);
  if (rc != TN_OK)
    rd_fail(r, rc, "%s", tn_graph_errmsg(g));
done:
  for (uint32_t i = 0; i < TN_MAX_ARGS; i++)
    mi_free(s->ns_lists[i]);
  mi_free(outs);
  mi_free(dims);
  mi_free(ovals);
}

int tn_graph_decode(const uint8_t *buf, size_t len, tn_graph **out, char *err, size_t errlen)
{
  tn_rd r = {buf, buf, buf + len, TN_OK, err, errlen};
  tn_graph *g = NULL;
  node_scratch *scratch = NULL;
  tn_sint sizes[TN_MAX_RANK], strides[TN_MAX_RANK];
  int rc;

  *out = NULL;
  if (errlen)
    err[0] = 0;
  if ((rc = tn_graph_new(&g)) != TN_OK) {
    snprintf(err, errlen, "out of memory");
    return rc;
  }
  if (!buf && len) {
    rd_fail(&r, TN_EINVAL, "NULL buffer");
    goto done;
  }
  if (len < 4 || memcmp(buf, graph_magic, 4) != 0) {
    rd_fail(&r, len < 4 ? TN_ETRUNC : TN_ECORRUPT, "not a graph encoding (bad magic)");
    goto done;
  }
  r.rd_p += 4;
  uint32_t version = (uint32_t)rd_le(&r, 4);
  if (r.rd_rc == TN_OK && version != TN_GRAPH_FORMAT_VERSION) {
    rd_fail(&r, TN_EVERSION, "format version %u, this build reads %d", version, TN_GRAPH_FORMAT_VERSION);
    goto done;
  }
  uint32_t nsyms = (uint32_t)rd_le(&r, 4);
  uint32_t ninputs = (uint32_t)rd_le(&r, 4);
  uint32_t nnodes = (uint32_t)rd_le(&r, 4);
  uint32_t noutputs = (uint32_t)rd_le(&r, 4);
  if (r.rd_rc != TN_OK)
    goto done;
  /* Each symbol is used at least once (5 bytes), each input and node takes
  ** at least 3 bytes, each output 4. */
  if ((uint64_t)nsyms * 5 + (uint64_t)ninputs * 3 + (uint64_t)nnodes * 3 +
      (uint64_t)noutputs * 4 > rd_left(&r)) {
    rd_fail(&r, TN_ETRUNC, "header counts exceed the input");
    goto done;
  }
  for (uint32_t i = 0; i < nsyms; i++) {
    int32_t s;
    if ((rc = tn_graph_add_symbol(g, &s)) != TN_OK) {
      rd_fail(&r, rc, "%s", tn_graph_errmsg(g));
      goto done;
    }
  }
  scratch = mi_heap_malloc(g->gr_heap, sizeof *scratch);
  if (!scratch) {
    rd_fail(&r, TN_ENOMEM, "out of memory");
    goto done;
  }
  for (uint32_t i = 0; i < ninputs && r.rd_rc == TN_OK; i++) {
    tn_input_desc in = {0};
    in.in_kind = (int)rd_le(&r, 1);
    if (in.in_kind != TN_VALUE_PARAM)
      in.in_index = (int32_t)(rd_le(&r, 4) & INT32_MAX);
    if (in.in_kind != TN_VALUE_CONST) {
      rd_str(&r, scratch->ns_target);
      in.in_name = scratch->ns_target;
    }
    rd_meta(&r, &in.in_meta, sizes, strides);
    int32_t v;
    if (r.rd_rc == TN_OK && (rc = tn_graph_add_input(g, &in, &v)) != TN_OK)
      rd_fail(&r, rc, "%s", tn_graph_errmsg(g));
  }
  for (uint32_t i = 0; i < nnodes && r.rd_rc == TN_OK; i++)
    rd_node(&r, g, scratch);
  if (r.rd_rc != TN_OK)
    goto done;
  int32_t *outs = tn_graph_alloc(g, (size_t)noutputs * sizeof *outs);
  if (!outs) {
    rd_fail(&r, TN_ENOMEM, "out of memory");
    goto done;
  }
  for (uint32_t i = 0; i < noutputs; i++) {
    uint32_t v = (uint32_t)rd_le(&r, 4);
    outs[i] = v > INT32_MAX ? -1 : (int32_t)v;
  }
  if (r.rd_rc == TN_OK && (rc = tn_graph_set_outputs(g, outs, noutputs)) != TN_OK)
    rd_fail(&r, rc, "%s", tn_graph_errmsg(g));
  mi_free(outs);
  if (r.rd_rc == TN_OK && rd_left(&r) != 0)
    rd_fail(&r, TN_ECORRUPT, "%zu bytes after the end of the graph", rd_left(&r));
  if (r.rd_rc != TN_OK)
    goto done;

  /* Only canonical encodings are accepted: the bytes must be what this
  ** graph encodes to, or the key of a decoded graph would not match. */
  const uint8_t *enc;
  size_t enclen;
  if ((rc = tn_graph_encode(g, &enc, &enclen)) != TN_OK) {
    rd_fail(&r, rc, "re-encoding failed: %s", tn_strerror(rc));
  } else if (enclen != len || memcmp(enc, buf, len) != 0) {
    r.rd_p = r.rd_base;
    rd_fail(&r, TN_ECORRUPT, "not in canonical form (symbols unused or misnumbered, or order not canonical)");
  }
done:
  mi_free(scratch);
  if (r.rd_rc != TN_OK) {
    tn_graph_free(g);
    return r.rd_rc;
  }
  *out = g;
  return TN_OK;
}

/* -- Dump ------------------------------------------------------------------ */

static void dump_sint(tn_buf *b, tn_sint v)
{
  if (v.si_sym >= 0 && v.si_val)
    buf_printf(b, "%" PRId64 "*s%d", v.si_val, v.si_sym);
  else if (v.si_sym >= 0)
    buf_printf(b, "s%d", v.si_sym);
  else
    buf_printf(b, "%" PRId64, v.si_val);
}

static void dump_meta(tn_buf *b, const tn_meta *m)
{
  buf_printf(b, "%s[", tn_dtype_name(m->me_dtype));
  for (int d = 0; d < m->me_rank; d++) {
    if (d)
      buf_printf(b, ", ");
    dump_sint(b, m->me_sizes[d]);
  }
  buf_printf(b, "] strides (");
  for (int d = 0; d < m->me_rank; d++) {
    if (d)
      buf_printf(b, ", ");
    dump_sint(b, m->me_strides[d]);
  }
  buf_printf(b, ")");
}

static void dump_arg(tn_buf *b, const tn_arg *a)
{
  switch (a->ar_tag) {
  case TN_ARG_NONE: buf_printf(b, "None"); break;
  case TN_ARG_TENSOR: buf_printf(b, "%%%d", a->u.ar_ref); break;
  case TN_ARG_TENSOR_LIST:
  case TN_ARG_OPT_TENSOR_LIST:
    buf_printf(b, "[");
    for (uint32_t i = 0; i < a->ar_len; i++) {
      if (a->u.ar_refs[i] < 0)
        buf_printf(b, "%sNone", i ? ", " : "");
      else
        buf_printf(b, "%s%%%d", i ? ", " : "", a->u.ar_refs[i]);
    }
    buf_printf(b, "]");
    break;
  case TN_ARG_INT: buf_printf(b, "%" PRId64, a->u.ar_int); break;
  case TN_ARG_BOOL: buf_printf(b, "%s", a->u.ar_int ? "True" : "False"); break;
  case TN_ARG_FLOAT: buf_printf(b, "%.17g", a->u.ar_float); break;
  case TN_ARG_SYM: buf_printf(b, "s%d", a->u.ar_ref); break;
  case TN_ARG_INT_LIST:
    buf_printf(b, "[");
    for (uint32_t i = 0; i < a->ar_len; i++) {
      if (i)
        buf_printf(b, ", ");
      dump_sint(b, a->u.ar_ints[i]);
    }
    buf_printf(b, "]");
    break;
  case TN_ARG_STRING: case TN_ARG_DEVICE:
    buf_printf(b, "'");
    buf_put(b, a->u.ar_str, a->ar_len);
    buf_printf(b, "'");
    break;
  case TN_ARG_DTYPE: buf_printf(b, "%s", tn_dtype_name((int)a->u.ar_int)); break;
  default: buf_printf(b, "%s(%" PRId64 ")", tn_arg_tag_name(a->ar_tag), a->u.ar_int); break;
  }
}

int tn_graph_dump(tn_graph *g, const char **text)
{
  int rc = tn_graph_enter_read(g);
  if (rc != TN_OK)
    return rc;
  if (g->gr_dump) {
    *text = g->gr_dump;
    return TN_OK;
  }
  tn_buf b = {g, NULL, 0, 0, TN_OK};
  buf_printf(&b, "graph: %u symbols, %u inputs, %u nodes, %u outputs\n",
             g->gr_nsyms, g->gr_ninputs, g->gr_nnodes, g->gr_noutputs);
  for (uint32_t i = 0; i < g->gr_ninputs; i++) {
    const tn_value *v = &g->gr_values[i];
    buf_printf(&b, "  %%%u = ", i);
    if (v->va_kind == TN_VALUE_ARG)
      buf_printf(&b, "arg %d%s", v->va_index, v->va_name);
    else if (v->va_kind == TN_VALUE_PARAM)
      buf_printf(&b, "param %s", v->va_name);
    else
      buf_printf(&b, "const %d", v->va_index);
    buf_printf(&b, " : ");
    dump_meta(&b, &v->va_meta);
    buf_printf(&b, "\n");
  }
  for (uint32_t k = 0; k < g->gr_nnodes; k++) {
    const tn_node *n = &g->gr_nodes[k];
    buf_printf(&b, "  ");
    for (uint32_t j = 0; j < n->no_nout; j++)
      buf_printf(&b, "%s%%%d", j ? ", " : "", n->no_out[j]);
    buf_printf(&b, " = %s(", n->no_op == TN_OP_fallback ? n->no_target : tn_op_name(n->no_op));
    for (uint32_t i = 0; i < n->no_nargs; i++) {
      if (i)
        buf_printf(&b, ", ");
      dump_arg(&b, &n->no_args[i]);
    }
    buf_printf(&b, ")%s", n->no_op == TN_OP_fallback ? "  # fallback" : "");
    for (uint32_t j = 0; j < n->no_nout; j++) {
      buf_printf(&b, j ? ", " : " : ");
      dump_meta(&b, &g->gr_values[n->no_out[j]].va_meta);
    }
    buf_printf(&b, "\n");
  }
  buf_printf(&b, "  return (");
  for (uint32_t i = 0; i < g->gr_noutputs; i++)
    buf_printf(&b, "%s%%%d", i ? ", " : "", g->gr_outputs[i]);
  buf_printf(&b, ")\n");
  buf_put(&b, "", 1);
  if (b.bu_rc != TN_OK) {
    mi_free(b.bu_data);
    return b.bu_rc;
  }
  g->gr_dump = (char *)b.bu_data;
  *text = g->gr_dump;
  return TN_OK;
}
