/*
** Check suite of tier 2: csrc/neuron_backend/codegen.c tn_codegen_tier2
** and tier2.c (the system C compiler, shared objects loaded from bytes):
** generated row and pointwise kernels compiled, loaded and run against
** values computed here; layouts left to tier 1; compiler failures; bytes
** that are no object.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph/graph.h"
#include "lowering/fuse.h"
#include "neuron_backend/codegen.h"
#include "neuron_backend/tier2.h"
#include "tn_check.h"

static tn_arg T(int32_t v) { tn_arg a = {TN_ARG_TENSOR, 0, {.ar_ref = v}}; return a; }
static tn_arg F(double v) { tn_arg a = {TN_ARG_FLOAT, 0, {.ar_float = v}}; return a; }

typedef int (*kfn2)(int64_t, const int64_t *, void **, const int64_t *, int64_t, const int64_t *);

static const char *const FLAGS[] = {"-O3", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
                                    "-w"};

/* The tier 2 of grp, compiled and loaded. */
static kfn2 build(const tn_fgroup *grp, tn_tier2_obj **o)
{
  char *src, err[1024];
  uint8_t *so;
  size_t len;
  ck_assert_int_eq(tn_codegen_tier2(grp, &src), TN_OK);
  ck_assert_ptr_nonnull(src);
  ck_assert_ptr_null(strstr(src, "#include"));
  ck_assert_msg(tn_tier2_compile("cc", FLAGS, sizeof FLAGS / sizeof FLAGS[0], src, 0, &so, &len, err, sizeof err) == TN_OK,
                "%s\n%s", err, src);
  free(src);
  ck_assert_msg(tn_tier2_load(so, len, "tn_kernel2", o, err, sizeof err) == TN_OK, "%s", err);
  free(so);
  return (kfn2)tn_tier2_symbol(*o);
}

/* x[R, C] -> softmax(x * 0.5, -1): a row group of three phases. */
START_TEST(test_softmax_rows)
{
  static const tn_sint RS[2] = {{4, -1}, {8, -1}}, RST[2] = {{8, -1}, {1, -1}};
  tn_meta f2 = {TN_DTYPE_FLOAT32, 2, RS, RST};
  tn_graph *g;
  tn_fusion *f;
  tn_tier2_obj *o;
  int32_t x, y, sm;
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, f2};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  tn_arg am[2] = {T(x), F(0.5)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &f2, 1, &y), TN_OK);
  tn_arg as[3] = {T(y), {TN_ARG_INT, 0, {.ar_int = -1}}, {TN_ARG_BOOL, 0, {.ar_int = 0}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_softmax, NULL, as, 3, &f2, 1, &sm), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &sm, 1), TN_OK);
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  kfn2 fn = build(tn_fusion_group(f, 0), &o);

  static const int64_t widths[] = {16, 17, 100, 1024, 1041, 3000};
  for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
    enum { R = 3 };
    int64_t cols = widths[w];
    float *xs = malloc(sizeof(float) * R * 3000), *out = malloc(sizeof(float) * R * 3000);
    for (int64_t i = 0; i < R * cols; i++)
      xs[i] = (float)((i * 7919) % 1000) / 50.0f - 10.0f;
    xs[cols + 5] = NAN;           /* row 1: all NaN */
    xs[2 * cols + 1] = -INFINITY; /* row 2: one zero probability */
    int64_t rows = R, st[2] = {cols, cols}, cst[2] = {1, 1};
    void *ptrs[2] = {xs, out};
    ck_assert_int_eq(fn(1, &rows, ptrs, st, cols, cst), 0);
    for (int r = 0; r < R; r++) {
      double mval = -INFINITY, sum = 0;
      for (int64_t c = 0; c < cols; c++)
        if (xs[r * cols + c] * 0.5 > mval)
          mval = xs[r * cols + c] * 0.5;
      for (int64_t c = 0; c < cols; c++)
        sum += exp(xs[r * cols + c] * 0.5 - mval);
      for (int64_t c = 0; c < cols; c++) {
        double want = exp(xs[r * cols + c] * 0.5 - mval) / sum;
        float got = out[r * cols + c];
        if (r == 1)
          ck_assert_msg(isnan(got), "row with NaN: softmax must be NaN");
        else
          ck_assert_msg(fabs(got - want) <= 2e-6 * want + 1e-9, "cols %lld row %d col %lld: %g vs %g",
                        (long long)cols, r, (long long)c, got, want);
      }
    }
    /* a row strided along itself (a transposed input): left to tier 1, nothing written */
    int64_t cst2[2] = {2, 1};
    out[0] = 12345.0f;
    ck_assert_int_eq(fn(1, &rows, ptrs, st, cols / 2, cst2), 1);
    ck_assert_float_eq(out[0], 12345.0f);
    free(xs);
    free(out);
  }
  int64_t rows = 2, st[2] = {8, 8}, cst[2] = {1, 1}; /* rows under 16: tier 1's tiles */
  float xs[16] = {0}, out[16];
  void *ptrs[2] = {xs, out};
  ck_assert_int_eq(fn(1, &rows, ptrs, st, 8, cst), 1);
  tn_tier2_free(o);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

/* a[N] + b (broadcast scalar tensor) -> exp: a pointwise group whose last
** chunk is padded; every value the same bits wherever it lies. */
START_TEST(test_pointwise_tail_and_broadcast)
{
  static const tn_sint S1[1] = {{40, -1}}, ST1[1] = {{1, -1}};
  tn_meta f1 = {TN_DTYPE_FLOAT32, 1, S1, ST1}, f0 = {TN_DTYPE_FLOAT32, 1, S1, ST1};
  tn_graph *g;
  tn_fusion *f;
  tn_tier2_obj *o;
  int32_t a, b, s, e;
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ia = {TN_VALUE_ARG, 0, NULL, f1}, ib = {TN_VALUE_ARG, 1, NULL, f0};
  ck_assert_int_eq(tn_graph_add_input(g, &ia, &a), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &ib, &b), TN_OK);
  tn_arg aa[3] = {T(a), T(b), {TN_ARG_INT, 0, {.ar_int = 1}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, aa, 3, &f1, 1, &s), TN_OK);
  tn_arg ae[1] = {T(s)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_exp, NULL, ae, 1, &f1, 1, &e), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &e, 1), TN_OK);
  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  kfn2 fn = build(tn_fusion_group(f, 0), &o);
  for (int64_t n = 1; n <= 70; n += 3) {
    float x[70], y = 0.25f, out[70];
    for (int64_t i = 0; i < n; i++)
      x[i] = 0.5f;
    int64_t st[3] = {1, 0, 1}; /* y broadcasts */
    void *ptrs[3] = {x, &y, out};
    ck_assert_int_eq(fn(1, &n, ptrs, st, 1, NULL), 0);
    for (int64_t i = 0; i < n; i++) {
      ck_assert_msg(out[i] == out[0], "n %lld: element %lld differs from element 0", (long long)n, (long long)i);
      ck_assert_float_eq_tol(out[i], expf(0.75f), 1e-6f);
    }
  }
  tn_tier2_free(o);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

START_TEST(test_groups_tier_2_does_not_write)
{
  /* int64 values: tier 1 only */
  static const tn_sint S1[1] = {{8, -1}}, ST1[1] = {{1, -1}};
  tn_meta i1 = {TN_DTYPE_INT64, 1, S1, ST1};
  tn_graph *g;
  tn_fusion *f;
  int32_t a, m, n;
  char *src = (char *)1;
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ia = {TN_VALUE_ARG, 0, NULL, i1};
  ck_assert_int_eq(tn_graph_add_input(g, &ia, &a), TN_OK);
  tn_arg am[2] = {T(a), {TN_ARG_INT, 0, {.ar_int = 3}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &i1, 1, &m), TN_OK);
  tn_arg an[1] = {T(m)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_neg, NULL, an, 1, &i1, 1, &n), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &n, 1), TN_OK);
  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  ck_assert_int_eq(tn_codegen_tier2(tn_fusion_group(f, 0), &src), TN_OK);
  ck_assert_ptr_null(src);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

START_TEST(test_compiler_failures)
{
  char err[1024];
  uint8_t *so = (uint8_t *)1;
  size_t len = 1;
  static const char src[] = "int tn_kernel2(void) { return 0; }\n";
  ck_assert_int_eq(tn_tier2_compile("/nonexistent/cc", FLAGS, 3, src, 0, &so, &len, err, sizeof err), TN_ECOMPILE);
  ck_assert_ptr_null(so);
  ck_assert_msg(strstr(err, "cannot run the C compiler") != NULL, "%s", err);
  ck_assert_int_eq(tn_tier2_compile("cc", FLAGS, 3, "this is not C;\n", 0, &so, &len, err, sizeof err), TN_ECOMPILE);
  ck_assert_msg(strstr(err, "status 1") != NULL && strstr(err, "error") != NULL, "%s", err);
  ck_assert_int_eq(tn_tier2_compile("cc", FLAGS, 40, src, 0, &so, &len, err, sizeof err), TN_EINVAL);
  char line[256];
  ck_assert_int_eq(tn_tier2_version("cc", line, sizeof line, err, sizeof err), TN_OK);
  ck_assert_msg(strlen(line) > 0 && strchr(line, '\n') == NULL, "%s", line);
  ck_assert_int_eq(tn_tier2_version("/nonexistent/cc", line, sizeof line, err, sizeof err), TN_ECOMPILE);
  ck_assert_int_eq(tn_tier2_version("false", line, sizeof line, err, sizeof err), TN_ECOMPILE);
}
END_TEST

START_TEST(test_load_rejects_what_is_no_object)
{
  char err[1024];
  tn_tier2_obj *o = (tn_tier2_obj *)1;
  static const uint8_t junk[] = "not an object at all";
  ck_assert_int_eq(tn_tier2_load(junk, sizeof junk, "tn_kernel2", &o, err, sizeof err), TN_ECORRUPT);
  ck_assert_ptr_null(o);
  static const uint8_t elf[] = "\177ELF but truncated";
  ck_assert_int_eq(tn_tier2_load(elf, sizeof elf, "tn_kernel2", &o, err, sizeof err), TN_ECOMPILE);
  uint8_t *so;
  size_t len;
  ck_assert_int_eq(tn_tier2_compile("cc", FLAGS, 3, "int other(void) { return 1; }\n", 0, &so, &len, err, sizeof err),
                   TN_OK);
  ck_assert_int_eq(tn_tier2_load(so, len, "tn_kernel2", &o, err, sizeof err), TN_ECOMPILE);
  ck_assert_msg(strstr(err, "no tn_kernel2") != NULL, "%s", err);
  /* two objects of one source loaded at once are two objects */
  tn_tier2_obj *o1, *o2;
  ck_assert_int_eq(tn_tier2_load(so, len, "other", &o1, err, sizeof err), TN_OK);
  ck_assert_int_eq(tn_tier2_load(so, len, "other", &o2, err, sizeof err), TN_OK);
  ck_assert_ptr_ne(tn_tier2_symbol(o1), tn_tier2_symbol(o2));
  tn_tier2_free(o1);
  tn_tier2_free(o2);
  free(so);
}
END_TEST

/* A "compiler" that writes its scheduling policy (Linux: /proc/self/sched)
** as the object: idle runs it in the idle class (SCHED_IDLE, 5). */
START_TEST(test_idle_runs_the_compiler_in_the_idle_class)
{
  char dir[] = "/tmp/tn-tier2-test-XXXXXX", cc[64], err[1024];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(cc, sizeof cc, "%s/cc", dir);
  FILE *f = fopen(cc, "w");
  ck_assert_ptr_nonnull(f);
  fputs("#!/bin/sh\nwhile [ \"$1\" != -o ]; do shift; done\n"
        "awk '/^policy/ {print $3}' /proc/$$/sched > \"$2\"\n", f);
  fclose(f);
  ck_assert_int_eq(chmod(cc, 0700), 0);
  for (int idle = 0; idle <= 1; idle++) {
    uint8_t *so;
    size_t len;
    int rc = tn_tier2_compile(cc, FLAGS, 3, "int x;\n", idle, &so, &len, err, sizeof err);
    ck_assert_msg(rc == TN_OK, "rc %d: %s", rc, err);
    ck_assert_msg(len >= 1 && so[0] == (idle ? '5' : '0'), "idle %d: policy %.*s", idle, (int)len, (const char *)so);
    free(so);
  }
  unlink(cc);
  rmdir(dir);
}
END_TEST

int main(void)
{
  Suite *s = suite_create("tier2");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_softmax_rows);
  tcase_add_test(tc, test_pointwise_tail_and_broadcast);
  tcase_add_test(tc, test_groups_tier_2_does_not_write);
  tcase_add_test(tc, test_compiler_failures);
  tcase_add_test(tc, test_load_rejects_what_is_no_object);
  tcase_add_test(tc, test_idle_runs_the_compiler_in_the_idle_class);
  suite_add_tcase(s, tc);
  return tn_check_run(s);
}
