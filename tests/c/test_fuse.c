/*
** Check suite of csrc/lowering/fuse.c, csrc/neuron_backend/codegen.c,
** runtime.c and pool.c: group formation (pointwise and row groups),
** generated source, kernels run through libtcc against values computed
** here, eager's NaN rules, the pool.
*/
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph.h"
#include "lowering/fuse.h"
#include "neuron_backend/codegen.h"
#include "neuron_backend/pool.h"
#include "neuron_backend/runtime.h"
#include "neuron_backend/tcc.h"
#include "tn_check.h"

static tn_arg T(int32_t v) { tn_arg a = {TN_ARG_TENSOR, 0, {.ar_ref = v}}; return a; }
static tn_arg F(double v) { tn_arg a = {TN_ARG_FLOAT, 0, {.ar_float = v}}; return a; }
static tn_arg I(int64_t v) { tn_arg a = {TN_ARG_INT, 0, {.ar_int = v}}; return a; }

static const tn_sint S2[2] = {{4, -1}, {5, -1}}, ST2[2] = {{5, -1}, {1, -1}};
static const tn_sint S1[1] = {{5, -1}}, ST1[1] = {{1, -1}};

/* x[4,5], y[5]: a = exp(x * 2 + y); b = cumsum(a) (not fusable); c = a - 1;
** d = relu(x) (alone: dropped). */
static tn_graph *sample(int32_t *a_out, int32_t *c_out)
{
  tn_graph *g;
  int32_t x, y, m, s, a, b, c, d;
  tn_meta f2 = {TN_DTYPE_FLOAT32, 2, S2, ST2};
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, f2};
  tn_input_desc iy = {TN_VALUE_ARG, 1, NULL, {TN_DTYPE_FLOAT32, 1, S1, ST1}};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &iy, &y), TN_OK);
  tn_arg am[2] = {T(x), F(2.0)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &f2, 1, &m), TN_OK);
  tn_arg aa[3] = {T(m), T(y), I(1)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, aa, 3, &f2, 1, &s), TN_OK);
  tn_arg ae[1] = {T(s)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_exp, NULL, ae, 1, &f2, 1, &a), TN_OK);
  tn_arg acs[3] = {T(a), I(0), {TN_ARG_NONE, 0, {0}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_fallback, "aten::cumsum", acs, 3, &f2, 1, &b), TN_OK);
  tn_arg as[3] = {T(a), I(1), I(1)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_sub_Scalar, NULL, as, 3, &f2, 1, &c), TN_OK);
  tn_arg ar[1] = {T(x)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_relu, NULL, ar, 1, &f2, 1, &d), TN_OK);
  int32_t outs[3] = {b, c, d};
  ck_assert_int_eq(tn_graph_set_outputs(g, outs, 3), TN_OK);
  *a_out = a;
  *c_out = c;
  return g;
}

static void init_tcc(void)
{
  char err[512];
  ck_assert_msg(tn_tcc_init(getenv("TN_TCC_LIBDIR"), err, sizeof err) == TN_OK, "%s", err);
}

typedef void (*kfn)(int64_t, const int64_t *, void **, const int64_t *, int64_t, const int64_t *);

static kfn compile_group(const tn_fgroup *grp, tn_tcc_unit **u)
{
  char *src, err[1024];
  tn_tcc_symbol syms[TN_RT_MAX_SYMBOLS];
  size_t n = 0;
  ck_assert_int_eq(tn_codegen_kernel(grp, &src), TN_OK);
  ck_assert_ptr_null(strstr(src, "#include"));
  for (const tn_rt_symbol *s = tn_rt_symbols(); s->rs_name; s++) {
    ck_assert_uint_lt(n, TN_RT_MAX_SYMBOLS);
    syms[n++] = (tn_tcc_symbol){s->rs_name, s->rs_addr};
  }
  ck_assert_msg(tn_tcc_compile(src, syms, n, u, err, sizeof err) == TN_OK, "%s\n%s", err, src);
  free(src);
  return (kfn)tn_tcc_get(*u, "tn_kernel");
}

START_TEST(test_groups_and_outputs)
{
  int32_t a, c;
  tn_graph *g = sample(&a, &c);
  tn_fusion *f;
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1); /* relu alone is left to eager */
  const tn_fgroup *grp = tn_fusion_group(f, 0);
  /* mul, add, exp and c = a - 1, which reads only the group: it runs early */
  ck_assert_uint_eq(grp->fg_nnodes, 4);
  ck_assert_uint_eq(grp->fg_ninputs, 2);
  ck_assert_uint_eq(grp->fg_noutputs, 2);   /* a (read by cumsum) and c (a graph output) */
  ck_assert_int_eq(grp->fg_outputs[0], a);
  ck_assert_int_eq(grp->fg_outputs[1], c);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

START_TEST(test_kernel_matches_reference_with_broadcast_and_strides)
{
  int32_t a, c;
  tn_graph *g = sample(&a, &c);
  tn_fusion *f;
  tn_tcc_unit *u;
  init_tcc();
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, &f), TN_OK);
  kfn fn = compile_group(tn_fusion_group(f, 0), &u);
  /* x is a transposed view: element (i, j) at x[j * 4 + i]; y broadcasts */
  float x[20], y[5], out_a[20], out_c[20];
  for (int i = 0; i < 20; i++)
    x[i] = (float)i / 7.0f - 1.0f;
  for (int j = 0; j < 5; j++)
    y[j] = (float)j * 0.25f;
  int64_t sizes[2] = {4, 5};
  int64_t st[8] = {1, 4, /* y */ 0, 1, /* a */ 5, 1, /* c */ 5, 1};
  void *ptrs[4] = {x, y, out_a, out_c};
  fn(2, sizes, ptrs, st, 1, NULL);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 5; j++) {
      float want = expf(x[j * 4 + i] * 2.0f + y[j]);
      ck_assert_float_eq_tol(out_a[i * 5 + j], want, 1e-6f * fabsf(want) + 1e-7f);
      ck_assert_float_eq_tol(out_c[i * 5 + j], want - 1.0f, 1e-6f * fabsf(want) + 1e-6f);
    }
  tn_tcc_free(u);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

START_TEST(test_runtime_nan_rules)
{
  float a[6] = {NAN, -NAN, 1.0f, -0.0f, INFINITY, -INFINITY}, b[6] = {0, 0, NAN, 0.0f, 1, 1}, r[6];
  tn_rt_unary_f32(TN_RT_RELU, r, a, 6);
  ck_assert(isnan(r[0]) && isnan(r[1]) && r[2] == 1.0f && r[4] == INFINITY && r[5] == 0.0f);
  tn_rt_binary_f32(TN_RT_B_MAXIMUM, r, a, b, 6);
  ck_assert(isnan(r[0]) && isnan(r[2]) && r[4] == INFINITY && r[5] == 1.0f);
  tn_rt_binary_f32(TN_RT_B_CLAMP_MIN, r, a, b, 6);
  ck_assert(isnan(r[0]) && isnan(r[2]));
  tn_rt_unary_f32(TN_RT_GELU, r, a, 6);
  ck_assert(isnan(r[4]) && isnan(r[5]) && r[3] == 0.0f && signbit(r[3]));
  tn_rt_unary_f32(TN_RT_NEG, r, a, 6);
  ck_assert(signbit(r[0]) != signbit(a[0]) && r[3] == 0.0f && !signbit(r[3]));
}
END_TEST

START_TEST(test_vector_math_accuracy)
{
  enum { N = 4096 };
  static float x[N], r[N];
  for (int i = 0; i < N; i++)
    x[i] = -20.0f + 40.0f * (float)i / N;
  struct { int op; double (*ref)(double); } cases[] = {
    {TN_RT_EXP, exp}, {TN_RT_TANH, tanh}, {TN_RT_ERF, erf}, {TN_RT_SIN, sin}, {TN_RT_COS, cos},
    {TN_RT_EXPM1, expm1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tn_rt_unary_f32(cases[c].op, r, x, N);
    for (int i = 0; i < N; i++) {
      double want = cases[c].ref(x[i]);
      ck_assert_msg(fabs(r[i] - want) <= 4e-7 * fabs(want) + 1e-30 + 2e-7 * (fabs(want) < 1),
                    "op %d at %g: %.9g vs %.9g", cases[c].op, x[i], r[i], want);
    }
  }
}
END_TEST

/* x[4,8]: s = softmax(x * 0.5, -1); m = amax(x, [-1]). Two row groups (the
** multiply joins the softmax as its prologue), run on rows packed several
** to a block (tiles), rows of one block (values persist across phases) and
** rows of three blocks (recomputed per phase). */
START_TEST(test_row_kernels)
{
  static const tn_sint RS[2] = {{4, -1}, {8, -1}}, RST[2] = {{8, -1}, {1, -1}}, MS[1] = {{4, -1}}, MST[1] = {{1, -1}};
  tn_meta f2 = {TN_DTYPE_FLOAT32, 2, RS, RST}, f1 = {TN_DTYPE_FLOAT32, 1, MS, MST};
  tn_graph *g;
  tn_fusion *f;
  tn_tcc_unit *u0, *u1;
  int32_t x, y, sm, m;
  init_tcc();
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, f2};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  tn_arg am[2] = {T(x), F(0.5)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &f2, 1, &y), TN_OK);
  tn_arg as[3] = {T(y), I(-1), {TN_ARG_BOOL, 0, {.ar_int = 0}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_softmax, NULL, as, 3, &f2, 1, &sm), TN_OK);
  tn_sint last = {-1, -1};
  tn_arg ax[3] = {T(x), {TN_ARG_INT_LIST, 1, {.ar_ints = &last}}, {TN_ARG_BOOL, 0, {.ar_int = 0}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_amax, NULL, ax, 3, &f1, 1, &m), TN_OK);
  int32_t outs[2] = {sm, m};
  ck_assert_int_eq(tn_graph_set_outputs(g, outs, 2), TN_OK);

  ck_assert_int_eq(tn_fuse_graph(g, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 0); /* without TN_FUSE_ROWS: nothing (the multiply alone is dropped) */
  tn_fusion_free(f);
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 2);
  const tn_fgroup *gs = tn_fusion_group(f, 0), *gm = tn_fusion_group(f, 1);
  ck_assert_uint_eq(gs->fg_nnodes, 2);
  ck_assert_int_eq(gs->fg_reduce_dims, 1);
  ck_assert_int_eq(gs->fg_out_kinds[0], TN_FO_FULL);
  ck_assert_int_eq(gm->fg_out_kinds[0], TN_FO_ROW);
  ck_assert_int_eq(gm->fg_nonempty, 1);
  kfn fs = compile_group(gs, &u0), fm = compile_group(gm, &u1);

  static const int64_t widths[3] = {100, 700, 3000};
  for (int w = 0; w < 3; w++) {
    enum { R = 3 };
    int64_t cols = widths[w];
    float *xs = malloc(sizeof(float) * R * 3000), *out = malloc(sizeof(float) * R * 3000), mx[R];
    for (int64_t i = 0; i < R * cols; i++)
      xs[i] = (float)((i * 7919) % 1000) / 50.0f - 10.0f;
    xs[cols + 5] = NAN; /* row 1: amax is NaN */
    xs[2 * cols + 1] = -INFINITY; /* row 2: a zero probability */
    int64_t rows = R, st[2] = {cols, cols}, cst[2] = {1, 1};
    void *ptrs[2] = {xs, out};
    fs(1, &rows, ptrs, st, cols, cst);
    int64_t st1[2] = {cols, 1}, cst1[2] = {1, 0};
    void *ptrs1[2] = {xs, mx};
    fm(1, &rows, ptrs1, st1, cols, cst1);
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
          ck_assert_msg(fabs(got - want) <= 1e-6 * want + 1e-9, "cols %lld row %d col %lld: %g vs %g",
                        (long long)cols, r, (long long)c, got, want);
      }
      if (r == 1)
        ck_assert(isnan(mx[r]));
      else
        ck_assert_float_eq(mx[r], (float)(2 * mval));
    }
    free(xs);
    free(out);
  }
  tn_tcc_free(u0);
  tn_tcc_free(u1);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

static void add_part(void *ctx, int part, int nparts)
{
  int *hits = ctx;
  __atomic_add_fetch(&hits[part], 1, __ATOMIC_RELAXED);
  (void)nparts;
}

/* Both ways of running parts: our pool, and an OpenMP runtime (the
** system's libgomp here; PyTorch's in the extension), whose team may be
** smaller than the parts asked for. */
START_TEST(test_pool_runs_every_part_once)
{
  void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(gomp != NULL, "libgomp.so.1: %s", dlerror());
  for (int way = 0; way < 2; way++) {
    if (way == 1)
      tn_pool_use_openmp(dlsym(gomp, "GOMP_parallel"), dlsym(gomp, "omp_get_thread_num"),
                         dlsym(gomp, "omp_get_num_threads"));
    for (int round = 0; round < 200; round++) {
      int hits[8] = {0};
      int n = tn_pool_run(add_part, hits, 1 + round % 7);
      ck_assert_int_eq(n, 1 + round % 7);
      for (int p = 0; p < 8; p++)
        ck_assert_int_eq(hits[p], p < n ? 1 : 0);
    }
  }
  tn_pool_use_openmp(NULL, NULL, NULL);
}
END_TEST

int main(void)
{
  Suite *s = suite_create("fuse");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_groups_and_outputs);
  tcase_add_test(tc, test_kernel_matches_reference_with_broadcast_and_strides);
  tcase_add_test(tc, test_runtime_nan_rules);
  tcase_add_test(tc, test_vector_math_accuracy);
  tcase_add_test(tc, test_pool_runs_every_part_once);
  tcase_add_test(tc, test_row_kernels);
  suite_add_tcase(s, tc);
  return tn_check_run(s);
}
