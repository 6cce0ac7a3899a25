/*
** C code generation for fused kernel programs (see codegen.h).
*/
#include "codegen.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

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

int tn_codegen_pointwise(const tn_fgroup *grp, char **src)
{
  cg_buf b = {malloc(4096), 0, 4096, TN_OK};
  uint32_t nops = grp->fg_ninputs + grp->fg_noutputs;

  *src = NULL;
  if (!b.cb_text)
    return TN_ENOMEM;
  b.cb_text[0] = 0;
  const char *elem = grp->fg_dtype == TN_DTYPE_FLOAT32 ? "float" : "unsigned short";
  const char *io = grp->fg_dtype == TN_DTYPE_FLOAT32 ? "f32" : grp->fg_dtype == TN_DTYPE_FLOAT16 ? "f16" : "bf16";
  out(&b, "%s", tn_rt_prototypes());
  out(&b, "void tn_kernel(i64 rank, const i64 *sizes, void **ptrs, const i64 *st)\n{\n");
  for (uint32_t k = 0; k < grp->fg_nbufs; k++)
    out(&b, "  float b%u[%d];\n", k, TN_RT_BLOCK);
  out(&b, "  %s *p[%u];\n  i64 s[%u];\n  i64 idx[64];\n", elem, nops, nops);
  out(&b, "  i64 inner = rank ? sizes[rank - 1] : 1, outer = 1, d, k, o, j, n;\n");
  out(&b, "  for (d = 0; d + 1 < rank; d++) { outer *= sizes[d]; idx[d] = 0; }\n");
  out(&b, "  if (inner == 0 || outer == 0) return;\n");
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    if (fi->fi_kind == TN_FI_CONST)
      out(&b, "  tn_rt_fill_f32(b%d, (float)%a, %d);\n", fi->fi_dst, fi->fi_value, TN_RT_BLOCK);
  }
  out(&b, "  for (k = 0; k < %u; k++) s[k] = rank ? st[k * rank + rank - 1] : 0;\n", nops);
  out(&b, "  for (o = 0; o < outer; o++) {\n");
  out(&b, "    for (k = 0; k < %u; k++) {\n", nops);
  out(&b, "      i64 off = 0;\n");
  out(&b, "      for (d = 0; d + 1 < rank; d++) off += idx[d] * st[k * rank + d];\n");
  out(&b, "      p[k] = (%s *)ptrs[k] + off;\n    }\n", elem);
  out(&b, "    for (j = 0; j < inner; j += %d) {\n", TN_RT_BLOCK);
  out(&b, "      n = inner - j < %d ? inner - j : %d;\n", TN_RT_BLOCK, TN_RT_BLOCK);
  for (uint32_t i = 0; i < grp->fg_nprog; i++) {
    const tn_finst *fi = &grp->fg_prog[i];
    switch (fi->fi_kind) {
    case TN_FI_LOAD:
      out(&b, "      tn_rt_load_%s(b%d, p[%d] + j * s[%d], s[%d], n);\n", io, fi->fi_dst, fi->fi_a, fi->fi_a,
          fi->fi_a);
      break;
    case TN_FI_UNARY:
      out(&b, "      tn_rt_unary_f32(%d, b%d, b%d, n);\n", fi->fi_op, fi->fi_dst, fi->fi_a);
      break;
    case TN_FI_BINARY:
      out(&b, "      tn_rt_binary_f32(%d, b%d, b%d, b%d, n);\n", fi->fi_op, fi->fi_dst, fi->fi_a, fi->fi_b);
      break;
    case TN_FI_STORE: {
      uint32_t k = grp->fg_ninputs + (uint32_t)fi->fi_dst;
      out(&b, "      tn_rt_store_%s(p[%u] + j * s[%u], s[%u], b%d, n);\n", io, k, k, k, fi->fi_a);
      break;
    }
    default:
      break;
    }
  }
  out(&b, "    }\n");
  out(&b, "    for (d = rank - 2; d >= 0; d--) { if (++idx[d] < sizes[d]) break; idx[d] = 0; }\n");
  out(&b, "  }\n}\n");
  if (b.cb_rc != TN_OK) {
    free(b.cb_text);
    return b.cb_rc;
  }
  *src = b.cb_text;
  return TN_OK;
}
