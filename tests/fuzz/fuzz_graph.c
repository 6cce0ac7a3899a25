/*
** libFuzzer target: the graph decoder (tn_graph_decode) and what consumes
** a decoded graph — the key, the canonical numbering, the dump, fusion
** and code generation, and tcc compiling the generated kernels.
**
** The decoder must reject any input it cannot take with a documented code
** and a message, and a graph it accepts must behave as one the builder
** made: it re-encodes to exactly the input bytes (the encoding is
** canonical), numbers itself canonically, and every kernel fusion forms
** from it is well formed and compiles. A graph the cache hands to the
** lowering passes through the same decoder, so this is also the check
** that a damaged artifact key can never crash a process.
**
** Built and run by `make fuzz-c` (tests/fuzz/README.md).
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph.h"
#include "lowering/fuse.h"
#include "neuron_backend/codegen.h"
#include "neuron_backend/runtime.h"
#include "neuron_backend/tcc.h"

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "fuzz_graph: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      abort();                                                             \
    }                                                                      \
  } while (0)

static tn_tcc_symbol syms[TN_RT_MAX_SYMBOLS];
static size_t nsyms;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
  char err[512];
  (void)argc;
  (void)argv;
  CHECK(tn_tcc_init(getenv("TN_TCC_LIBDIR"), err, sizeof err) == TN_OK, "tcc: %s", err);
  for (const tn_rt_symbol *s = tn_rt_symbols(); s->rs_name; s++) {
    CHECK(nsyms < TN_RT_MAX_SYMBOLS, "too many runtime symbols");
    syms[nsyms++] = (tn_tcc_symbol){s->rs_name, s->rs_addr};
  }
  return 0;
}

static int known_decode_error(int rc)
{
  return rc == TN_ETRUNC || rc == TN_ECORRUPT || rc == TN_EVERSION || rc == TN_EINVAL;
}

static void check_ids(const int32_t *ids, uint32_t n, uint32_t limit, const char *what)
{
  for (uint32_t i = 0; i < n; i++)
    CHECK(ids[i] >= 0 && (uint32_t)ids[i] < limit, "%s %u is %d of %u", what, i, ids[i], limit);
}

/* Every group fusion forms on g is well formed, and its kernel compiles. */
static void check_fusion(tn_graph *g, int flags, int64_t min_row)
{
  tn_fusion *f = NULL;
  char err[2048];
  int rc = tn_fuse_graph(g, flags, min_row, &f);
  CHECK(rc == TN_OK, "fuse: %s", tn_strerror(rc));
  uint32_t nv = tn_graph_num_values(g), nn = tn_graph_num_nodes(g);
  for (uint32_t i = 0; i < tn_fusion_count(f); i++) {
    const tn_fgroup *grp = tn_fusion_group(f, i);
    CHECK(grp->fg_nnodes > 0, "group %u has no node", i);
    check_ids(grp->fg_nodes, grp->fg_nnodes, nn, "node");
    check_ids(grp->fg_inputs, grp->fg_ninputs, nv, "input");
    check_ids(grp->fg_outputs, grp->fg_noutputs, nv, "output");
    for (uint32_t k = 0; k < grp->fg_ninputs + grp->fg_noutputs; k++)
      CHECK(tn_dtype_name(grp->fg_odtypes[k]) != NULL, "operand %u has dtype %d", k, grp->fg_odtypes[k]);
    char *src = NULL;
    CHECK(tn_codegen_kernel(grp, &src) == TN_OK, "codegen of group %u", i);
    CHECK(strstr(src, "#include") == NULL, "generated code includes a header");
    tn_tcc_unit *u = NULL;
    rc = tn_tcc_compile(src, syms, nsyms, &u, err, sizeof err);
    CHECK(rc == TN_OK, "group %u does not compile: %s\n%s", i, err, src);
    CHECK(tn_tcc_get(u, "tn_kernel") != NULL, "no tn_kernel in group %u", i);
    tn_tcc_free(u);
    free(src);
  }
  tn_fusion_free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  tn_graph *g = NULL;
  char err[TN_ERRMSG_LEN];
  int rc = tn_graph_decode(data, size, &g, err, sizeof err);
  if (rc != TN_OK) {
    CHECK(g == NULL, "a failed decode returned a graph");
    CHECK(known_decode_error(rc), "decode returned %d (%s)", rc, tn_strerror(rc));
    CHECK(err[0] != 0, "decode failed (%s) without a message", tn_strerror(rc));
    return 0;
  }

  /* canonical: the bytes come back exactly, and the numbering is the identity */
  const uint8_t *enc;
  size_t len;
  CHECK(tn_graph_encode(g, &enc, &len) == TN_OK, "re-encode");
  CHECK(len == size && memcmp(enc, data, size) == 0, "re-encoding differs (%zu vs %zu bytes)", len, size);
  const int32_t *order, *vmap;
  CHECK(tn_graph_canonical(g, &order, &vmap) == TN_OK, "canonical");
  for (uint32_t k = 0; k < tn_graph_num_nodes(g); k++)
    CHECK(order[k] == (int32_t)k, "node %u is canonical %d", k, order[k]);
  for (uint32_t v = 0; v < tn_graph_num_values(g); v++)
    CHECK(vmap[v] == (int32_t)v, "value %u is canonical %d", v, vmap[v]);
  check_ids(tn_graph_outputs(g), tn_graph_num_outputs(g), tn_graph_num_values(g), "graph output");

  uint8_t k1[16], k2[16];
  CHECK(tn_graph_key(g, "ctx", 3, k1) == TN_OK && tn_graph_key(g, "ctx", 3, k2) == TN_OK, "key");
  CHECK(memcmp(k1, k2, 16) == 0, "the key is not stable");
  const char *text;
  CHECK(tn_graph_dump(g, &text) == TN_OK && text[0], "dump");

  check_fusion(g, 0, 0);
  check_fusion(g, TN_FUSE_ROWS | TN_FUSE_GEMM | TN_FUSE_LINEAR_ACT, 0);
  check_fusion(g, TN_FUSE_ROWS, 64); /* the rows row_fusion_min_row leaves out */
  tn_graph_free(g);
  return 0;
}
