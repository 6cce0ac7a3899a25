/*
** Check suite of csrc/graph: builder validation, canonical encoding, decoder
** robustness, keys.
*/
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "graph/graph.h"
#include "tn_check.h"

/* -- Fixtures -------------------------------------------------------------- */

/* Check's assertions report to the test runner, which the --print-key child
** does not have: the fixtures use this instead. */
static int in_runner = 1;
#define REQ(x) \
  do { \
    if (!(x)) { \
      if (in_runner) \
        ck_abort_msg("%s", #x); \
      fprintf(stderr, "failed: %s\n", #x); \
      abort(); \
    } \
  } while (0)

static tn_arg T(int32_t v) { tn_arg a = {TN_ARG_TENSOR, 0, {.ar_ref = v}}; return a; }
static tn_arg I(int64_t v) { tn_arg a = {TN_ARG_INT, 0, {.ar_int = v}}; return a; }

static tn_meta M(int dtype, int rank, const tn_sint *sizes, const tn_sint *strides)
{
  tn_meta m = {dtype, rank, sizes, strides};
  return m;
}

/* x[s0, 16] @ w[16, 8] + b[8], relu; then a second, independent branch
** y = exp(x) (not an output) when with_dead is set. The order of the two
** params and of symbol declarations is controlled by the flags, to check
** that the encoding does not depend on insertion order. */
static tn_graph *build_mlp(int swap_params, int extra_sym_first, int with_dead)
{
  tn_graph *g;
  int32_t s, junk, x, w, b, mm, add, relu, e;
  REQ(tn_graph_new(&g) == TN_OK);
  if (extra_sym_first)
    REQ(tn_graph_add_symbol(g, &junk) == TN_OK);
  REQ(tn_graph_add_symbol(g, &s) == TN_OK);
  tn_sint xs[2] = {TN_SYM(s), TN_SINT(16)}, xst[2] = {TN_SINT(16), TN_SINT(1)};
  tn_sint ws[2] = {TN_SINT(16), TN_SINT(8)}, wst[2] = {TN_SINT(8), TN_SINT(1)};
  tn_sint bs[1] = {TN_SINT(8)}, bst[1] = {TN_SINT(1)};
  tn_sint os[2] = {TN_SYM(s), TN_SINT(8)}, ost[2] = {TN_SINT(8), TN_SINT(1)};
  tn_input_desc in_x = {TN_VALUE_ARG, 0, "", M(TN_DTYPE_FLOAT32, 2, xs, xst)};
  tn_input_desc in_w = {TN_VALUE_PARAM, 0, "fc.weight", M(TN_DTYPE_FLOAT32, 2, ws, wst)};
  tn_input_desc in_b = {TN_VALUE_PARAM, 0, "fc.bias", M(TN_DTYPE_FLOAT32, 1, bs, bst)};
  REQ(tn_graph_add_input(g, &in_x, &x) == TN_OK);
  if (swap_params) {
    REQ(tn_graph_add_input(g, &in_b, &b) == TN_OK);
    REQ(tn_graph_add_input(g, &in_w, &w) == TN_OK);
  } else {
    REQ(tn_graph_add_input(g, &in_w, &w) == TN_OK);
    REQ(tn_graph_add_input(g, &in_b, &b) == TN_OK);
  }
  tn_meta out = M(TN_DTYPE_FLOAT32, 2, os, ost);
  tn_meta xm = M(TN_DTYPE_FLOAT32, 2, xs, xst);
  if (with_dead == 2) { /* dead node inserted first */
    tn_arg ea[1] = {T(x)};
    REQ(tn_graph_add_node(g, TN_OP_exp, NULL, ea, 1, &xm, 1, &e) == TN_OK);
  }
  tn_arg mma[2] = {T(x), T(w)};
  REQ(tn_graph_add_node(g, TN_OP_mm, NULL, mma, 2, &out, 1, &mm) == TN_OK);
  tn_arg adda[3] = {T(mm), T(b), I(1)};
  REQ(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, adda, 3, &out, 1, &add) == TN_OK);
  if (with_dead == 1) {
    tn_arg ea[1] = {T(x)};
    REQ(tn_graph_add_node(g, TN_OP_exp, NULL, ea, 1, &xm, 1, &e) == TN_OK);
  }
  tn_arg ra[1] = {T(add)};
  REQ(tn_graph_add_node(g, TN_OP_relu, NULL, ra, 1, &out, 1, &relu) == TN_OK);
  int32_t outs[2] = {relu, mm};
  REQ(tn_graph_set_outputs(g, outs, 2) == TN_OK);
  return g;
}

static void encoding_of(tn_graph *g, uint8_t **buf, size_t *len)
{
  const uint8_t *enc;
  ck_assert_int_eq(tn_graph_encode(g, &enc, len), TN_OK);
  *buf = malloc(*len);
  memcpy(*buf, enc, *len);
}

/* -- Round trip and canonical form ------------------------------------------ */

/* index's indices, [None, idx]: a fallback node whose optional tensor list
** keeps its None, round-trips, counts idx as the node's one input, and
** whose -1 a plain tensor list rejects. tn_graph_check_node says no to a
** node its op's signature does not take, without poisoning the graph. */
START_TEST(test_optional_tensor_list)
{
  tn_graph *g, *d;
  int32_t x, idx, out, s;
  tn_sint xs[2] = {TN_SINT(4), TN_SINT(6)}, xst[2] = {TN_SINT(6), TN_SINT(1)};
  tn_sint is[1] = {TN_SINT(3)}, ist[1] = {TN_SINT(1)};
  tn_sint os[2] = {TN_SINT(4), TN_SINT(3)}, ost[2] = {TN_SINT(3), TN_SINT(1)};
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  ck_assert_int_eq(tn_graph_add_symbol(g, &s), TN_OK);
  tn_input_desc in_x = {TN_VALUE_ARG, 0, "", M(TN_DTYPE_FLOAT32, 2, xs, xst)};
  tn_input_desc in_i = {TN_VALUE_ARG, 1, "", M(TN_DTYPE_INT64, 1, is, ist)};
  ck_assert_int_eq(tn_graph_add_input(g, &in_x, &x), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &in_i, &idx), TN_OK);
  tn_meta om = M(TN_DTYPE_FLOAT32, 2, os, ost);
  /* mul.Scalar of a symbol is in the signature; mul.Tensor of a symbol is not */
  tn_arg bad[2] = {T(x), {TN_ARG_SYM, 0, {.ar_ref = s}}};
  char msg[200];
  ck_assert_int_eq(tn_graph_check_node(g, TN_OP_mul_Tensor, bad, 2, &om, 1, msg, sizeof msg), TN_EINVAL);
  ck_assert_str_eq(tn_graph_errmsg(g), "");
  int32_t refs[2] = {-1, idx};
  tn_arg args[2] = {T(x), {TN_ARG_OPT_TENSOR_LIST, 2, {.ar_refs = refs}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_fallback, "aten::index.Tensor", args, 2, &om, 1, &out), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &out, 1), TN_OK);
  uint32_t a = 0, e = 0;
  const tn_node *n = tn_graph_node(g, 0);
  ck_assert_int_eq(tn_graph_node_input(n, &a, &e), x);
  ck_assert_int_eq(tn_graph_node_input(n, &a, &e), idx);
  ck_assert_int_eq(tn_graph_node_input(n, &a, &e), -1);
  const char *text;
  ck_assert_int_eq(tn_graph_dump(g, &text), TN_OK);
  ck_assert_ptr_nonnull(strstr(text, "[None, %1]"));
  uint8_t *enc;
  size_t len;
  char err[TN_ERRMSG_LEN];
  encoding_of(g, &enc, &len);
  ck_assert_int_eq(tn_graph_decode(enc, len, &d, err, sizeof err), TN_OK);
  const uint8_t *enc2;
  size_t len2;
  ck_assert_int_eq(tn_graph_encode(d, &enc2, &len2), TN_OK);
  ck_assert_uint_eq(len, len2);
  ck_assert_mem_eq(enc, enc2, len);
  tn_graph_free(d);
  free(enc);
  /* the same -1 in a plain tensor list is an undefined value */
  tn_arg plain[2] = {T(x), {TN_ARG_TENSOR_LIST, 2, {.ar_refs = refs}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_fallback, "aten::index.Tensor", plain, 2, &om, 1, &out), TN_EINVAL);
  ck_assert_ptr_nonnull(strstr(tn_graph_errmsg(g), "undefined value -1"));
  tn_graph_free(g);
}
END_TEST

START_TEST(test_round_trip)
{
  tn_graph *g = build_mlp(0, 0, 0), *d;
  uint8_t *enc;
  size_t len;
  char err[TN_ERRMSG_LEN];
  const char *t1, *t2;
  encoding_of(g, &enc, &len);
  ck_assert_int_eq(tn_graph_decode(enc, len, &d, err, sizeof err), TN_OK);
  ck_assert_uint_eq(tn_graph_num_nodes(d), 3);
  ck_assert_uint_eq(tn_graph_num_inputs(d), 3);
  ck_assert_uint_eq(tn_graph_num_outputs(d), 2);
  const uint8_t *enc2;
  size_t len2;
  ck_assert_int_eq(tn_graph_encode(d, &enc2, &len2), TN_OK);
  ck_assert_uint_eq(len, len2);
  ck_assert_mem_eq(enc, enc2, len);
  ck_assert_int_eq(tn_graph_dump(d, &t1), TN_OK);
  ck_assert_ptr_nonnull(strstr(t1, "aten::mm"));
  ck_assert_ptr_nonnull(strstr(t1, "param fc.weight"));
  ck_assert_ptr_nonnull(strstr(t1, "float32[s0, 8]"));
  ck_assert_int_eq(tn_graph_dump(g, &t2), TN_OK);
  free(enc);
  tn_graph_free(g);
  tn_graph_free(d);
}
END_TEST

START_TEST(test_canonical_independent_of_insertion)
{
  uint8_t *a, *b, *c, *d;
  size_t la, lb, lc, ld;
  tn_graph *g1 = build_mlp(0, 0, 1), *g2 = build_mlp(1, 0, 2), *g3 = build_mlp(1, 1, 1);
  tn_graph *g4 = build_mlp(0, 0, 0);
  encoding_of(g1, &a, &la);
  encoding_of(g2, &b, &lb);
  encoding_of(g3, &c, &lc);
  encoding_of(g4, &d, &ld);
  ck_assert_uint_eq(la, lb);
  ck_assert_mem_eq(a, b, la);
  ck_assert_uint_eq(la, lc);
  ck_assert_mem_eq(a, c, la); /* an unused symbol declared first changes nothing */
  ck_assert_uint_ne(la, ld);  /* the dead node is part of the program */
  uint8_t k1[16], k2[16], k3[16];
  ck_assert_int_eq(tn_graph_key(g1, NULL, 0, k1), TN_OK);
  ck_assert_int_eq(tn_graph_key(g2, NULL, 0, k2), TN_OK);
  ck_assert_int_eq(tn_graph_key(g2, "torch 2.13", 10, k3), TN_OK);
  ck_assert_mem_eq(k1, k2, 16);
  ck_assert_mem_ne(k1, k3, 16);
  free(a); free(b); free(c); free(d);
  tn_graph_free(g1); tn_graph_free(g2); tn_graph_free(g3); tn_graph_free(g4);
}
END_TEST

static void key_hex(char out[33])
{
  tn_graph *g = build_mlp(0, 0, 0);
  uint8_t k[16];
  REQ(tn_graph_key(g, "ctx", 3, k) == TN_OK);
  for (int i = 0; i < 16; i++)
    snprintf(out + 2 * i, 3, "%02x", k[i]);
  tn_graph_free(g);
}

/* Another process (this binary re-executed, so a different address space
** layout) must compute the same key. */
START_TEST(test_key_stable_across_processes)
{
  char here[33], there[64] = {0}, cmd[4200], exe[4096];
  key_hex(here);
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ck_assert_int_gt(n, 0);
  exe[n] = 0;
  snprintf(cmd, sizeof cmd, "%s --print-key", exe);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  ck_assert_ptr_nonnull(fgets(there, sizeof there, p));
  ck_assert_int_eq(pclose(p), 0);
  there[strcspn(there, "\n")] = 0;
  ck_assert_str_eq(here, there);
}
END_TEST

/* -- Decoder robustness -------------------------------------------------------- */

START_TEST(test_every_truncation_rejected)
{
  tn_graph *g = build_mlp(0, 0, 1), *d;
  uint8_t *enc;
  size_t len;
  char err[TN_ERRMSG_LEN];
  encoding_of(g, &enc, &len);
  for (size_t n = 0; n < len; n++) {
    uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan/valgrind see overreads */
    memcpy(copy, enc, n);
    int rc = tn_graph_decode(copy, n, &d, err, sizeof err);
    ck_assert_msg(rc == TN_ETRUNC || rc == TN_ECORRUPT, "length %zu decoded with rc %d", n, rc);
    ck_assert_ptr_null(d);
    ck_assert_msg(err[0] != 0, "no message for length %zu", n);
    free(copy);
  }
  free(enc);
  tn_graph_free(g);
}
END_TEST

START_TEST(test_random_corruptions_rejected_or_canonical)
{
  tn_graph *g = build_mlp(0, 0, 1), *d;
  uint8_t *enc;
  size_t len;
  char err[TN_ERRMSG_LEN];
  unsigned seed = 12345;
  int rejected = 0;
  encoding_of(g, &enc, &len);
  uint8_t *copy = malloc(len);
  for (int i = 0; i < 20000; i++) {
    memcpy(copy, enc, len);
    size_t at = (size_t)rand_r(&seed) % len;
    uint8_t v = (uint8_t)rand_r(&seed);
    if (v == copy[at])
      v ^= 0x40;
    copy[at] = v;
    int rc = tn_graph_decode(copy, len, &d, err, sizeof err);
    if (rc != TN_OK) {
      rejected++;
      ck_assert_ptr_null(d);
      continue;
    }
    /* accepted: then it is a different, valid, canonical graph */
    const uint8_t *re;
    size_t rlen;
    ck_assert_int_eq(tn_graph_encode(d, &re, &rlen), TN_OK);
    ck_assert_uint_eq(rlen, len);
    ck_assert_mem_eq(re, copy, len);
    tn_graph_free(d);
  }
  ck_assert_int_gt(rejected, 10000); /* most corruptions are caught, none crash */
  free(copy);
  free(enc);
  tn_graph_free(g);
}
END_TEST

START_TEST(test_decode_rejects_trailing_and_version)
{
  tn_graph *g = build_mlp(0, 0, 0), *d;
  uint8_t *enc;
  size_t len;
  char err[TN_ERRMSG_LEN];
  encoding_of(g, &enc, &len);
  uint8_t *longer = malloc(len + 1);
  memcpy(longer, enc, len);
  longer[len] = 0;
  ck_assert_int_eq(tn_graph_decode(longer, len + 1, &d, err, sizeof err), TN_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(err, "after the end"));
  enc[4] = 99;
  ck_assert_int_eq(tn_graph_decode(enc, len, &d, err, sizeof err), TN_EVERSION);
  enc[0] = 'X';
  ck_assert_int_eq(tn_graph_decode(enc, len, &d, err, sizeof err), TN_ECORRUPT);
  ck_assert_int_eq(tn_graph_decode(NULL, 0, &d, err, sizeof err), TN_ETRUNC);
  free(longer);
  free(enc);
  tn_graph_free(g);
}
END_TEST

/* -- Builder validation ------------------------------------------------------------ */

typedef struct small {
  tn_graph *g;
  int32_t a, b, s;
} small;

/* a: float32[4, 3], b: float32[5, 2], symbol s declared. */
static small small_graph(void)
{
  static const tn_sint as[2] = {{4, -1}, {3, -1}}, ast[2] = {{3, -1}, {1, -1}};
  static const tn_sint bs[2] = {{5, -1}, {2, -1}}, bst[2] = {{2, -1}, {1, -1}};
  small r;
  ck_assert_int_eq(tn_graph_new(&r.g), TN_OK);
  ck_assert_int_eq(tn_graph_add_symbol(r.g, &r.s), TN_OK);
  tn_input_desc ia = {TN_VALUE_ARG, 0, NULL, {TN_DTYPE_FLOAT32, 2, as, ast}};
  tn_input_desc ib = {TN_VALUE_ARG, 1, NULL, {TN_DTYPE_FLOAT32, 2, bs, bst}};
  ck_assert_int_eq(tn_graph_add_input(r.g, &ia, &r.a), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(r.g, &ib, &r.b), TN_OK);
  return r;
}

static void expect_reject(small *r, int op, const char *target, const tn_arg *args, uint32_t nargs,
                          const tn_meta *outs, uint32_t nout, const char *needle)
{
  int32_t ov[4];
  int rc = tn_graph_add_node(r->g, op, target, args, nargs, outs, nout, ov);
  ck_assert_int_eq(rc, TN_EINVAL);
  const char *msg = tn_graph_errmsg(r->g);
  ck_assert_msg(strstr(msg, needle) != NULL, "message '%s' lacks '%s'", msg, needle);
  ck_assert_msg(strncmp(msg, "node ", 5) == 0, "message '%s' does not name the node", msg);
  /* poisoned until reset */
  int32_t s;
  ck_assert_int_eq(tn_graph_add_symbol(r->g, &s), TN_EPOISONED);
  const uint8_t *enc;
  size_t len;
  ck_assert_int_eq(tn_graph_encode(r->g, &enc, &len), TN_EPOISONED);
  ck_assert_uint_eq(tn_graph_num_nodes(r->g), 0);
  ck_assert_int_eq(tn_graph_reset(r->g), TN_OK);
  ck_assert_str_eq(tn_graph_errmsg(r->g), "");
  ck_assert_int_eq(tn_graph_add_symbol(r->g, &s), TN_OK);
  tn_graph_free(r->g);
}

START_TEST(test_reject_mm_inner_mismatch)
{
  small r = small_graph();
  tn_sint os[2] = {TN_SINT(4), TN_SINT(2)}, ost[2] = {TN_SINT(2), TN_SINT(1)};
  tn_meta out = {TN_DTYPE_FLOAT32, 2, os, ost};
  tn_arg args[2] = {T(r.a), T(r.b)};
  expect_reject(&r, TN_OP_mm, NULL, args, 2, &out, 1, "inner sizes differ: 3 and 5");
}
END_TEST

START_TEST(test_reject_arg_count_and_tag)
{
  small r = small_graph();
  tn_sint os[2] = {TN_SINT(4), TN_SINT(3)}, ost[2] = {TN_SINT(3), TN_SINT(1)};
  tn_meta out = {TN_DTYPE_FLOAT32, 2, os, ost};
  tn_arg one[1] = {T(r.a)};
  expect_reject(&r, TN_OP_add_Tensor, NULL, one, 1, &out, 1, "expects 3 arguments, got 1");
  r = small_graph();
  tn_arg bad[3] = {T(r.a), I(2), I(1)};
  expect_reject(&r, TN_OP_add_Tensor, NULL, bad, 3, &out, 1, "arg 1: a int is not accepted");
}
END_TEST

START_TEST(test_reject_dangling_and_symbols)
{
  small r = small_graph();
  tn_sint os[2] = {TN_SINT(4), TN_SINT(3)}, ost[2] = {TN_SINT(3), TN_SINT(1)};
  tn_meta out = {TN_DTYPE_FLOAT32, 2, os, ost};
  tn_arg dang[1] = {T(77)};
  expect_reject(&r, TN_OP_relu, NULL, dang, 1, &out, 1, "undefined value 77");
  r = small_graph();
  tn_sint us[2] = {TN_SYM(9), TN_SINT(3)};
  tn_meta bad = {TN_DTYPE_FLOAT32, 2, us, ost};
  tn_arg x[1] = {T(r.a)};
  expect_reject(&r, TN_OP_relu, NULL, x, 1, &bad, 1, "undeclared symbol");
  r = small_graph();
  tn_meta badt = {42, 2, os, ost};
  expect_reject(&r, TN_OP_relu, NULL, x, 1, &badt, 1, "unknown dtype 42");
}
END_TEST

START_TEST(test_reject_broadcast_and_dtype)
{
  small r = small_graph();
  tn_sint os[2] = {TN_SINT(4), TN_SINT(3)}, ost[2] = {TN_SINT(3), TN_SINT(1)};
  tn_meta out = {TN_DTYPE_FLOAT32, 2, os, ost};
  tn_arg args[3] = {T(r.a), T(r.b), I(1)};
  expect_reject(&r, TN_OP_add_Tensor, NULL, args, 3, &out, 1, "does not broadcast");
  r = small_graph();
  tn_arg cmp[2] = {T(r.a), T(r.a)};
  expect_reject(&r, TN_OP_lt_Tensor, NULL, cmp, 2, &out, 1, "must produce bool");
  r = small_graph();
  tn_arg perm[2] = {T(r.a), {TN_ARG_INT_LIST, 2, {.ar_ints = (tn_sint[]){{0, -1}, {0, -1}}}}};
  expect_reject(&r, TN_OP_permute, NULL, perm, 2, &out, 1, "appears twice");
}
END_TEST

START_TEST(test_reject_fallback_without_target_and_roles)
{
  small r = small_graph();
  tn_sint os[2] = {TN_SINT(4), TN_SINT(3)}, ost[2] = {TN_SINT(3), TN_SINT(1)};
  tn_meta out = {TN_DTYPE_FLOAT32, 2, os, ost};
  tn_arg x[2] = {T(r.a), I(1)};
  expect_reject(&r, TN_OP_fallback, NULL, x, 2, &out, 1, "target must be a qualified op name");
  /* a fallback with a target takes any arguments */
  r = small_graph();
  int32_t v;
  ck_assert_int_eq(tn_graph_add_node(r.g, TN_OP_fallback, "aten::cumsum", x, 2, &out, 1, &v), TN_OK);
  /* inputs after nodes, and duplicate roles, are refused */
  tn_input_desc late = {TN_VALUE_ARG, 5, NULL, {TN_DTYPE_FLOAT32, 2, os, ost}};
  ck_assert_int_eq(tn_graph_add_input(r.g, &late, &v), TN_EINVAL);
  ck_assert_ptr_nonnull(strstr(tn_graph_errmsg(r.g), "before the first node"));
  tn_graph_free(r.g);
  r = small_graph();
  tn_input_desc dup = {TN_VALUE_ARG, 1, "", {TN_DTYPE_FLOAT32, 2, os, ost}};
  ck_assert_int_eq(tn_graph_add_input(r.g, &dup, &v), TN_EINVAL);
  ck_assert_ptr_nonnull(strstr(tn_graph_errmsg(r.g), "same role as input 1"));
  tn_graph_free(r.g);
}
END_TEST

START_TEST(test_rank_limits)
{
  small r = small_graph();
  tn_sint big[TN_MAX_RANK + 1];
  for (int i = 0; i <= TN_MAX_RANK; i++)
    big[i] = TN_SINT(1);
  tn_input_desc in = {TN_VALUE_ARG, 7, NULL, {TN_DTYPE_FLOAT32, TN_MAX_RANK + 1, big, big}};
  int32_t v;
  ck_assert_int_eq(tn_graph_add_input(r.g, &in, &v), TN_EINVAL);
  ck_assert_ptr_nonnull(strstr(tn_graph_errmsg(r.g), "rank 65"));
  tn_graph_free(r.g);
  r = small_graph();
  in.in_meta.me_rank = TN_MAX_RANK;
  ck_assert_int_eq(tn_graph_add_input(r.g, &in, &v), TN_OK);
  tn_graph_free(r.g);
}
END_TEST

/* -- Threads ------------------------------------------------------------------ */

static void *other_thread(void *arg)
{
  tn_graph *g = arg;
  int32_t s;
  const uint8_t *enc;
  size_t len;
  intptr_t bad = 0;
  bad |= tn_graph_add_symbol(g, &s) != TN_ETHREAD;
  bad |= tn_graph_encode(g, &enc, &len) != TN_ETHREAD;
  bad |= tn_graph_reset(g) != TN_ETHREAD;
  bad |= tn_graph_num_nodes(g) != 3; /* reads are fine */
  return (void *)bad;
}

START_TEST(test_owner_thread_enforced)
{
  tn_graph *g = build_mlp(0, 0, 0);
  pthread_t t;
  void *res;
  ck_assert_int_eq(pthread_create(&t, NULL, other_thread, g), 0);
  ck_assert_int_eq(pthread_join(t, &res), 0);
  ck_assert_ptr_null(res);
  tn_graph_free(g);
}
END_TEST

static void *free_elsewhere(void *arg)
{
  tn_graph_free(arg);
  return NULL;
}

START_TEST(test_free_off_owner_thread_is_counted)
{
  tn_graph *g = build_mlp(0, 0, 0);
  uint64_t before = tn_graph_abandoned();
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, free_elsewhere, g), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_uint_eq(tn_graph_abandoned(), before + 1);
}
END_TEST

START_TEST(test_malloc_not_overridden)
{
  ck_assert_msg(tn_malloc_is_libc(), "malloc is not libc's: mimalloc overrides it");
}
END_TEST

START_TEST(test_op_table)
{
  ck_assert_int_eq(tn_op_find("aten::add.Tensor"), TN_OP_add_Tensor);
  ck_assert_int_eq(tn_op_find("aten::native_layer_norm"), TN_OP_native_layer_norm);
  ck_assert_int_eq(tn_op_outputs(TN_OP_native_layer_norm), 3);
  ck_assert_int_eq(tn_op_find("aten::nope"), -1);
  for (int i = 1; i < tn_op_count(); i++)
    ck_assert_int_eq(tn_op_find(tn_op_name(i)), i); /* names are unique */
}
END_TEST

static Suite *graph_suite(void)
{
  Suite *s = suite_create("graph");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_optional_tensor_list);
  tcase_add_test(tc, test_canonical_independent_of_insertion);
  tcase_add_test(tc, test_key_stable_across_processes);
  tcase_add_test(tc, test_every_truncation_rejected);
  tcase_add_test(tc, test_random_corruptions_rejected_or_canonical);
  tcase_add_test(tc, test_decode_rejects_trailing_and_version);
  tcase_add_test(tc, test_reject_mm_inner_mismatch);
  tcase_add_test(tc, test_reject_arg_count_and_tag);
  tcase_add_test(tc, test_reject_dangling_and_symbols);
  tcase_add_test(tc, test_reject_broadcast_and_dtype);
  tcase_add_test(tc, test_reject_fallback_without_target_and_roles);
  tcase_add_test(tc, test_rank_limits);
  tcase_add_test(tc, test_owner_thread_enforced);
  tcase_add_test(tc, test_free_off_owner_thread_is_counted);
  tcase_add_test(tc, test_malloc_not_overridden);
  tcase_add_test(tc, test_op_table);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv)
{
  if (argc > 1 && strcmp(argv[1], "--print-key") == 0) {
    char hex[33];
    in_runner = 0;
    key_hex(hex);
    puts(hex);
    return 0;
  }
  return tn_check_run(graph_suite());
}
