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
#include "tn_config.h"
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
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, 0, &f), TN_OK);
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

/* out = q + k0 + k1 + ... over n inputs: one chain of adds. */
static tn_graph *sum_of(int n)
{
  tn_graph *g;
  tn_meta f2 = {TN_DTYPE_FLOAT32, 2, S2, ST2};
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  int32_t in[70], acc;
  ck_assert_int_le(n, 70);
  for (int i = 0; i < n; i++) { /* inputs before the first node */
    tn_input_desc ix = {TN_VALUE_ARG, i, NULL, f2};
    ck_assert_int_eq(tn_graph_add_input(g, &ix, &in[i]), TN_OK);
  }
  acc = in[0];
  for (int i = 1; i < n; i++) {
    tn_arg aa[3] = {T(acc), T(in[i]), I(1)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, aa, 3, &f2, 1, &acc), TN_OK);
  }
  ck_assert_int_eq(tn_graph_set_outputs(g, &acc, 1), TN_OK);
  return g;
}

/* A kernel takes at most TN_LAUNCH_MAX_OPERANDS tensors: a group of 65
** inputs and its result made the kernel's construction fail, and the whole
** graph ran eagerly. It is left to PyTorch, node by node; 63 inputs fuse. */
START_TEST(test_a_group_of_more_operands_than_a_kernel_takes_is_not_made)
{
  for (int n = 63; n <= 65; n++) {
    tn_graph *g = sum_of(n);
    tn_fusion *f;
    ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, 0, &f), TN_OK);
    for (uint32_t k = 0; k < tn_fusion_count(f); k++) {
      const tn_fgroup *grp = tn_fusion_group(f, k);
      ck_assert_uint_le(grp->fg_ninputs + grp->fg_noutputs, 64);
    }
    ck_assert_uint_eq(tn_fusion_count(f), n <= 63 ? 1 : 0);
    tn_fusion_free(f);
    tn_graph_free(g);
  }
}
END_TEST

START_TEST(test_kernel_matches_reference_with_broadcast_and_strides)
{
  int32_t a, c;
  tn_graph *g = sample(&a, &c);
  tn_fusion *f;
  tn_tcc_unit *u;
  init_tcc();
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, 0, &f), TN_OK);
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

/* The same kernel over shapes that take each of its loops: tiles of short
** rows (a last tile that is partial, an outer dim the odometer walks) and
** rows of more than 128 elements, one block or several at a time. */
START_TEST(test_kernel_tiles_and_rows)
{
  static const int64_t shapes[][3] = {{2, 300, 5}, {1, 3, 1500}, {2, 2, 129}, {3, 7, 128}, {1, 1, 1}};
  int32_t a, c;
  tn_graph *g = sample(&a, &c);
  tn_fusion *f;
  tn_tcc_unit *u;
  init_tcc();
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, 0, &f), TN_OK);
  kfn fn = compile_group(tn_fusion_group(f, 0), &u);
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
    int64_t no = shapes[t][0], nr = shapes[t][1], ni = shapes[t][2], n = no * nr * ni;
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)ni);
    float *oa = malloc(sizeof(float) * (size_t)n), *oc = malloc(sizeof(float) * (size_t)n);
    ck_assert(x && y && oa && oc);
    for (int64_t i = 0; i < n; i++)
      x[i] = (float)(i % 97) / 31.0f - 1.5f;
    for (int64_t j = 0; j < ni; j++)
      y[j] = (float)(j % 13) * 0.125f;
    /* x: each outer slice transposed (element (o, r, i) at o*nr*ni + i*nr + r); y broadcasts */
    int64_t sizes[3] = {no, nr, ni};
    int64_t st[12] = {nr * ni, 1, nr, /* y */ 0, 0, 1, /* a */ nr * ni, ni, 1, /* c */ nr * ni, ni, 1};
    void *ptrs[4] = {x, y, oa, oc};
    fn(3, sizes, ptrs, st, 1, NULL);
    for (int64_t o = 0; o < no; o++)
      for (int64_t r = 0; r < nr; r++)
        for (int64_t i = 0; i < ni; i++) {
          int64_t at = (o * nr + r) * ni + i;
          float want = expf(x[o * nr * ni + i * nr + r] * 2.0f + y[i]);
          ck_assert_msg(fabsf(oa[at] - want) <= 1e-6f * fabsf(want) + 1e-7f, "shape %zu at %lld: %g != %g", t,
                        (long long)at, (double)oa[at], (double)want);
          ck_assert_msg(fabsf(oc[at] - (want - 1.0f)) <= 1e-6f * fabsf(want) + 1e-6f, "shape %zu at %lld", t,
                        (long long)at);
        }
    free(x);
    free(y);
    free(oa);
    free(oc);
  }
  tn_tcc_free(u);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

/* The runtime's ISA for loop tests: _i indexes config cpu_isa's choices
** (auto, avx512, avx2, default); the fixture puts auto back. */
static void set_isa(int i)
{
  char err[TN_ERRMSG_LEN];
  ck_assert_int_eq(tn_config_set_int(TN_CFG_cpu_isa, i, err, sizeof err), TN_OK);
}

static void reset_isa(void)
{
  set_isa(0);
}

START_TEST(test_runtime_nan_rules)
{
  set_isa(_i);
  float a[6] = {NAN, -NAN, 1.0f, -0.0f, INFINITY, -INFINITY}, b[6] = {0, 0, NAN, 0.0f, 1, 1}, r[6];
  tn_rt_unary_f32(TN_RT_RELU, r, a, 6);
  ck_assert(isnan(r[0]) && isnan(r[1]) && r[2] == 1.0f && r[4] == INFINITY && r[5] == 0.0f);
  tn_rt_binary_f32(TN_RT_B_MAXIMUM, r, a, b, 6);
  ck_assert(isnan(r[0]) && isnan(r[2]) && r[4] == INFINITY && r[5] == 1.0f);
  tn_rt_binary_f32(TN_RT_B_CLAMP_MIN, r, a, b, 6);
  ck_assert(isnan(r[0]) && isnan(r[2]));
  /* gelu(+inf) = +inf, gelu(-inf) = NaN (0 * -inf), as the formula gives */
  tn_rt_unary_f32(TN_RT_GELU, r, a, 6);
  ck_assert(isnan(r[0]) && r[4] == INFINITY && isnan(r[5]) && r[3] == 0.0f && signbit(r[3]));
  double d[6] = {NAN, -NAN, 1.0, -0.0, INFINITY, -INFINITY}, rd[6];
  tn_rt_unary_f64(TN_RT_GELU, rd, d, 6);
  ck_assert(isnan(rd[0]) && rd[4] == INFINITY && isnan(rd[5]) && rd[3] == 0.0 && signbit(rd[3]));
  tn_rt_unary_f32(TN_RT_NEG, r, a, 6);
  ck_assert(signbit(r[0]) != signbit(a[0]) && r[3] == 0.0f && !signbit(r[3]));
}
END_TEST

/* Every math op gives the same special values (NaN, infinities, zeros and
** their signs, saturation) whatever ISA the runtime uses, and values within
** a few ulp of each other: a kernel's answer does not depend on the machine. */
START_TEST(test_math_specials_do_not_depend_on_the_isa)
{
  static const float sp[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e30f, -1e30f, 1e-40f, -1e-40f,
                             88.8f, -88.8f, 89.5f, -104.0f, 20.0f, -20.0f, 9.0f, -9.0f, 0.5f, 1e-7f, 3e38f};
  enum { NS = sizeof sp / sizeof sp[0], N = 3 * NS + 5 }; /* vectors and a tail */
  static const int ops[] = {TN_RT_EXP, TN_RT_LOG, TN_RT_LOG1P, TN_RT_EXPM1, TN_RT_SQRT, TN_RT_RSQRT,
                            TN_RT_SIGMOID, TN_RT_TANH, TN_RT_SILU, TN_RT_ERF, TN_RT_SIN, TN_RT_COS,
                            TN_RT_GELU, TN_RT_GELU_TANH};
  float x[N], want[N], got[N];
  double xd[N], wantd[N], gotd[N];
  for (int i = 0; i < N; i++) {
    x[i] = sp[i % NS];
    xd[i] = x[i];
  }
  for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
    set_isa(3); /* default: the scalar math library */
    tn_rt_unary_f32(ops[o], want, x, N);
    tn_rt_unary_f64(ops[o], wantd, xd, N);
    for (int isa = 0; isa < 3; isa++) {
      set_isa(isa);
      tn_rt_unary_f32(ops[o], got, x, N);
      tn_rt_unary_f64(ops[o], gotd, xd, N);
      for (int i = 0; i < N; i++) {
        ck_assert_msg(isnan(got[i]) == isnan(want[i]) && isinf(got[i]) == isinf(want[i]) &&
                      (isnan(got[i]) || signbit(got[i]) == signbit(want[i]) || got[i] == 0) &&
                      (!isfinite(got[i]) || fabsf(got[i] - want[i]) <= 4e-7f * fabsf(want[i]) + 1e-38f),
                      "op %d isa %d at %g: %.9g, scalar library %.9g", ops[o], isa, x[i], got[i], want[i]);
        ck_assert_msg(isnan(gotd[i]) == isnan(wantd[i]) && isinf(gotd[i]) == isinf(wantd[i]) &&
                      (!isfinite(gotd[i]) || fabs(gotd[i] - wantd[i]) <= 1e-14 * fabs(wantd[i]) + 1e-300),
                      "op %d isa %d at %g (f64): %.17g, scalar library %.17g", ops[o], isa, xd[i], gotd[i],
                      wantd[i]);
      }
    }
  }
}
END_TEST

START_TEST(test_vector_math_accuracy)
{
  set_isa(_i);
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

/* amax over x's two trailing dims of 32 and 2^58 + 32 elements: rows
** longer than any min_row. Their product overflowed int64 in
** row_long_enough (undefined behaviour, UBSan's report in the graph
** fuzzer), and came out negative: the rows were taken for short ones. */
START_TEST(test_rows_whose_length_overflows_are_long)
{
  static const tn_sint XS[3] = {{2, -1}, {32, -1}, {360287970189639712LL, -1}};
  static const tn_sint XST[3] = {{0, -1}, {0, -1}, {1, -1}}, MS[1] = {{2, -1}}, MST[1] = {{1, -1}};
  tn_meta f3 = {TN_DTYPE_FLOAT32, 3, XS, XST}, f1 = {TN_DTYPE_FLOAT32, 1, MS, MST};
  tn_graph *g;
  tn_fusion *f;
  int32_t x, m;
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, f3};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  tn_sint dims[2] = {{-2, -1}, {-1, -1}};
  tn_arg ax[3] = {T(x), {TN_ARG_INT_LIST, 2, {.ar_ints = dims}}, {TN_ARG_BOOL, 0, {.ar_int = 0}}};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_amax, NULL, ax, 3, &f1, 1, &m), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &m, 1), TN_OK);
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, 64, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  tn_fusion_free(f);
  tn_graph_free(g);
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

  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 0); /* without TN_FUSE_ROWS: nothing (the multiply alone is dropped) */
  tn_fusion_free(f);
  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, 0, &f), TN_OK);
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

/* -- Integer, comparison, selection and cast primitives -------------------- */

/* Blocks of 37: more than one vector width, so vector bodies and scalar
** tails both run (the clones go up to AVX-512: 8 int64 or 16 float lanes). */
enum { RN = 37 };

/* int64 arithmetic as two's complement, computed here independently. */
static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

START_TEST(test_rt_int_loads_widen)
{
  static int64_t s64[3 * RN];
  static int32_t s32[3 * RN];
  static int16_t s16[3 * RN];
  static int8_t s8[3 * RN];
  static uint8_t su8[3 * RN];
  int64_t d[RN];
  for (int i = 0; i < 3 * RN; i++) {
    s64[i] = i % 2 ? INT64_MIN + i : INT64_MAX - i;
    s32[i] = i % 2 ? INT32_MIN + i : INT32_MAX - i;
    s16[i] = (int16_t)(i % 2 ? INT16_MIN + i : INT16_MAX - i);
    s8[i] = (int8_t)(i % 2 ? INT8_MIN + i : INT8_MAX - i);
    su8[i] = (uint8_t)(255 - i);
  }
  int64_t strides[3] = {1, 3, 0};
  for (int k = 0; k < 3; k++) {
    int64_t st = strides[k];
#define CHECK_LOAD(fn, src, expr) \
    do { \
      for (int i = 0; i < RN; i++) \
        d[i] = -7; \
      fn(d, src, st, RN); \
      for (int i = 0; i < RN; i++) { \
        int64_t want = (expr); \
        ck_assert_msg(d[i] == want, #fn " stride %lld at %d: %lld, want %lld", (long long)st, i, \
                      (long long)d[i], (long long)want); \
      } \
    } while (0)
    CHECK_LOAD(tn_rt_load_i64, s64, s64[i * st]);
    CHECK_LOAD(tn_rt_load_i32, s32, (int64_t)s32[i * st]);
    CHECK_LOAD(tn_rt_load_i16, s16, (int64_t)s16[i * st]);
    CHECK_LOAD(tn_rt_load_i8, s8, (int64_t)s8[i * st]);
    CHECK_LOAD(tn_rt_load_u8, su8, (int64_t)su8[i * st]);
#undef CHECK_LOAD
  }
  /* widening keeps the sign of narrow types and not of uint8 */
  tn_rt_load_i8(d, s8 + 1, 0, 1);
  ck_assert_int_eq(d[0], -127);
  tn_rt_load_i32(d, s32 + 1, 0, 1);
  ck_assert_int_eq(d[0], (int64_t)INT32_MIN + 1);
  tn_rt_load_u8(d, su8, 0, 1);
  ck_assert_int_eq(d[0], 255);
}
END_TEST

START_TEST(test_rt_int_stores_wrap)
{
  static const int64_t pat[12] = {0, -1, 300, 70000, (int64_t)1 << 31, -129, 128, 256,
                                  ((int64_t)1 << 40) + 3, INT64_MIN, INT64_MAX, 5};
  int64_t src[RN];
  for (int i = 0; i < RN; i++)
    src[i] = pat[i % 12];
  static int64_t d64[2 * RN];
  static int32_t d32[2 * RN];
  static int16_t d16[2 * RN];
  static int8_t d8[2 * RN];
  static uint8_t du8[2 * RN];
  for (int64_t st = 1; st <= 2; st++) {
    memset(d64, 0x5a, sizeof d64);
    memset(d32, 0x5a, sizeof d32);
    memset(d16, 0x5a, sizeof d16);
    memset(d8, 0x5a, sizeof d8);
    memset(du8, 0x5a, sizeof du8);
    tn_rt_store_i64(d64, st, src, RN);
    tn_rt_store_i32(d32, st, src, RN);
    tn_rt_store_i16(d16, st, src, RN);
    tn_rt_store_i8(d8, st, src, RN);
    tn_rt_store_u8(du8, st, src, RN);
    for (int i = 0; i < RN; i++) {
      int64_t x = src[i];
      ck_assert_int_eq(d64[i * st], x);
      ck_assert_int_eq(d32[i * st], (int32_t)(uint32_t)(uint64_t)x);
      ck_assert_int_eq(d16[i * st], (int16_t)(uint16_t)(uint64_t)x);
      ck_assert_int_eq(d8[i * st], (int8_t)(uint8_t)(uint64_t)x);
      ck_assert_uint_eq(du8[i * st], (uint8_t)(uint64_t)x);
      if (st == 2) { /* the skipped elements are untouched */
        ck_assert_uint_eq(du8[i * st + 1], 0x5a);
        ck_assert_int_eq(d32[i * st + 1], 0x5a5a5a5a);
      }
    }
  }
  /* the values eager gives for these (int64 tensor .to(dtype)) */
  ck_assert_int_eq(d32[8 * 2], 3);      /* 2^40 + 3 -> int32 */
  ck_assert_int_eq(d16[3 * 2], 4464);   /* 70000 -> int16 */
  ck_assert_int_eq(d8[2 * 2], 44);      /* 300 -> int8 */
  ck_assert_int_eq(d8[5 * 2], 127);     /* -129 -> int8 */
  ck_assert_int_eq(d8[6 * 2], -128);    /* 128 -> int8 */
  ck_assert_uint_eq(du8[1 * 2], 255);   /* -1 -> uint8 */
  ck_assert_int_eq(d32[4 * 2], INT32_MIN); /* 2^31 -> int32 */
}
END_TEST

START_TEST(test_rt_int_fill_unary)
{
  static const int64_t pat[8] = {0, 5, -5, INT64_MIN, INT64_MAX, -1, 1, INT64_MIN + 1};
  int64_t a[RN], r[RN];
  tn_rt_fill_i64(r, INT64_MIN, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], INT64_MIN);
  for (int i = 0; i < RN; i++)
    a[i] = pat[i % 8];
  tn_rt_unary_i64(TN_RT_NEG, r, a, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], wrap_sub(0, a[i]));
  ck_assert_int_eq(r[3], INT64_MIN); /* -INT64_MIN wraps to itself */
  ck_assert_int_eq(r[7], INT64_MAX);
  tn_rt_unary_i64(TN_RT_ABS, r, a, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] < 0 ? wrap_sub(0, a[i]) : a[i]);
  ck_assert_int_eq(r[2], 5);
  ck_assert_int_eq(r[3], INT64_MIN); /* |INT64_MIN| wraps, as eager's abs */
  tn_rt_unary_i64(TN_RT_RELU, r, a, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] < 0 ? 0 : a[i]);
  /* in place */
  memcpy(r, a, sizeof r);
  tn_rt_unary_i64(TN_RT_NEG, r, r, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], wrap_sub(0, a[i]));
}
END_TEST

START_TEST(test_rt_int_binary)
{
  static const int64_t pa[9] = {INT64_MAX, INT64_MIN, (int64_t)1 << 62, 3037000500, -7, 0, 5, -3, 0};
  static const int64_t pb[9] = {1, 1, 4, 3037000500, 3, 0, -2, 0, 9};
  int64_t a[RN], b[RN], r[RN];
  for (int i = 0; i < RN; i++) {
    a[i] = pa[i % 9];
    b[i] = pb[i % 9];
  }
  struct { int op; int64_t (*ref)(int64_t, int64_t); } ring[] = {
    {TN_RT_B_ADD, wrap_add}, {TN_RT_B_SUB, wrap_sub}, {TN_RT_B_MUL, wrap_mul},
  };
  for (int k = 0; k < 3; k++) {
    tn_rt_binary_i64(ring[k].op, r, a, b, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(r[i] == ring[k].ref(a[i], b[i]), "op %d at %d: %lld", ring[k].op, i, (long long)r[i]);
    for (int64_t s = -3; s <= 3; s += 3) {
      tn_rt_binary_s_i64(ring[k].op, r, a, s, RN);
      for (int i = 0; i < RN; i++)
        ck_assert_msg(r[i] == ring[k].ref(a[i], s), "op %d s %lld at %d", ring[k].op, (long long)s, i);
    }
  }
  tn_rt_binary_i64(TN_RT_B_ADD, r, a, b, RN);
  ck_assert_int_eq(r[0], INT64_MIN); /* INT64_MAX + 1 */
  tn_rt_binary_i64(TN_RT_B_SUB, r, a, b, RN);
  ck_assert_int_eq(r[1], INT64_MAX); /* INT64_MIN - 1 */
  tn_rt_binary_i64(TN_RT_B_MUL, r, a, b, RN);
  ck_assert_int_eq(r[2], 0);         /* 2^62 * 4 */
  ck_assert_int_eq(r[3], wrap_mul(3037000500, 3037000500));
  ck_assert_int_lt(r[3], 0);         /* past INT64_MAX: wrapped negative */

  tn_rt_binary_i64(TN_RT_B_MAXIMUM, r, a, b, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] > b[i] ? a[i] : b[i]);
  tn_rt_binary_i64(TN_RT_B_MINIMUM, r, a, b, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] < b[i] ? a[i] : b[i]);
  tn_rt_binary_i64(TN_RT_B_CLAMP_MIN, r, a, b, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] < b[i] ? b[i] : a[i]);
  tn_rt_binary_i64(TN_RT_B_CLAMP_MAX, r, a, b, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] > b[i] ? b[i] : a[i]);
  tn_rt_binary_s_i64(TN_RT_B_CLAMP_MIN, r, a, -3, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] < -3 ? -3 : a[i]);
  tn_rt_binary_s_i64(TN_RT_B_CLAMP_MAX, r, a, 5, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] > 5 ? 5 : a[i]);
  tn_rt_binary_s_i64(TN_RT_B_MAXIMUM, r, a, 0, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] > 0 ? a[i] : 0);
  tn_rt_binary_s_i64(TN_RT_B_MINIMUM, r, a, 0, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(r[i], a[i] < 0 ? a[i] : 0);

  /* dst aliasing a, then b */
  int64_t c[RN];
  memcpy(c, a, sizeof c);
  tn_rt_binary_i64(TN_RT_B_ADD, c, c, b, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(c[i], wrap_add(a[i], b[i]));
  memcpy(c, b, sizeof c);
  tn_rt_binary_i64(TN_RT_B_SUB, c, a, c, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(c[i], wrap_sub(a[i], b[i]));
  memcpy(c, a, sizeof c);
  tn_rt_binary_s_i64(TN_RT_B_MUL, c, c, 3, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(c[i], wrap_mul(a[i], 3));
}
END_TEST

/* Bool blocks: bytes holding 0 or 1, as bool tensors do. Loads and stores
** are byte copies (with a stride); nothing is written past n. */
START_TEST(test_rt_bool_load_store)
{
  static uint8_t src[3 * RN], dst[2 * RN + 16];
  uint8_t d[RN + 16];
  for (int i = 0; i < 3 * RN; i++)
    src[i] = (uint8_t)(i % 3 == 0 || i % 7 == 2);
  int64_t strides[3] = {1, 3, 0};
  for (int k = 0; k < 3; k++) {
    int64_t st = strides[k];
    memset(d, 0x5a, sizeof d);
    tn_rt_load_b8(d, src, st, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(d[i] == src[i * st], "load_b8 stride %lld at %d: %d, want %d", (long long)st, i, d[i],
                    src[i * st]);
    for (int i = RN; i < RN + 16; i++)
      ck_assert_msg(d[i] == 0x5a, "load_b8 stride %lld wrote d[%d] past n", (long long)st, i);
  }
  uint8_t blk[RN];
  for (int i = 0; i < RN; i++)
    blk[i] = (uint8_t)(i % 4 == 1 || i % 5 == 0);
  for (int64_t st = 1; st <= 2; st++) {
    memset(dst, 0x5a, sizeof dst);
    tn_rt_store_b8(dst, st, blk, RN);
    for (int i = 0; i < RN; i++) {
      ck_assert_msg(dst[i * st] == blk[i], "store_b8 stride %lld at %d: %d, want %d", (long long)st, i,
                    dst[i * st], blk[i]);
      if (st == 2) /* the skipped elements are untouched */
        ck_assert_uint_eq(dst[i * st + 1], 0x5a);
    }
    for (int64_t i = (RN - 1) * st + 1; i < (int64_t)sizeof dst; i++)
      ck_assert_msg(dst[i] == 0x5a, "store_b8 stride %lld wrote dst[%lld] past the last element", (long long)st,
                    (long long)i);
  }
}
END_TEST

START_TEST(test_rt_bool_ops)
{
  uint8_t a[RN], b[RN], r[RN + 16], t[RN];
  for (int i = 0; i < RN; i++) { /* every pair (a, b) occurs, in body and tail */
    a[i] = (uint8_t)(i % 2);
    b[i] = (uint8_t)((i / 2) % 2);
  }
  for (int v = 1; v >= 0; v--) {
    memset(r, 0x5a, sizeof r);
    tn_rt_fill_b8(r, (uint8_t)v, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_int_eq(r[i], v);
    for (int i = RN; i < RN + 16; i++)
      ck_assert_int_eq(r[i], 0x5a);
  }

  memset(r, 0x5a, sizeof r);
  tn_rt_unary_b8(TN_RT_LNOT, r, a, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_msg(r[i] == !a[i], "lnot at %d: %d of %d", i, r[i], a[i]);
  for (int i = RN; i < RN + 16; i++)
    ck_assert_int_eq(r[i], 0x5a);
  memcpy(t, a, sizeof t); /* in place */
  tn_rt_unary_b8(TN_RT_LNOT, t, t, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(t[i], !a[i]);

  /* on 0 and 1: LAND, BAND and MINIMUM are and; LOR, BOR and MAXIMUM are or */
  enum { AND, OR, XOR };
  struct { int op, fn; const char *name; } ops[7] = {
    {TN_RT_B_LAND, AND, "land"}, {TN_RT_B_BAND, AND, "band"}, {TN_RT_B_MINIMUM, AND, "minimum"},
    {TN_RT_B_LOR, OR, "lor"}, {TN_RT_B_BOR, OR, "bor"}, {TN_RT_B_MAXIMUM, OR, "maximum"},
    {TN_RT_B_BXOR, XOR, "bxor"},
  };
#define BOOL_REF(fn, x, y) ((fn) == AND ? ((x) && (y)) : (fn) == OR ? ((x) || (y)) : ((x) != (y)))
  for (int k = 0; k < 7; k++) {
    int fn = ops[k].fn;
    memset(r, 0x5a, sizeof r);
    tn_rt_binary_b8(ops[k].op, r, a, b, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(r[i] == BOOL_REF(fn, a[i], b[i]), "%s(%d, %d) at %d: %d", ops[k].name, a[i], b[i], i, r[i]);
    for (int i = RN; i < RN + 16; i++)
      ck_assert_msg(r[i] == 0x5a, "%s wrote r[%d] past n", ops[k].name, i);
    for (int s = 0; s <= 1; s++) {
      memset(r, 0x5a, sizeof r);
      tn_rt_binary_s_b8(ops[k].op, r, a, (uint8_t)s, RN);
      for (int i = 0; i < RN; i++)
        ck_assert_msg(r[i] == BOOL_REF(fn, a[i], s), "%s(%d, s %d) at %d: %d", ops[k].name, a[i], s, i, r[i]);
      for (int i = RN; i < RN + 16; i++)
        ck_assert_msg(r[i] == 0x5a, "%s (scalar) wrote r[%d] past n", ops[k].name, i);
      memcpy(t, a, sizeof t); /* dst aliasing a */
      tn_rt_binary_s_b8(ops[k].op, t, t, (uint8_t)s, RN);
      for (int i = 0; i < RN; i++)
        ck_assert_msg(t[i] == BOOL_REF(fn, a[i], s), "%s(%d, s %d) in place at %d: %d", ops[k].name, a[i], s, i,
                      t[i]);
    }
    /* dst aliasing a, then b */
    memcpy(t, a, sizeof t);
    tn_rt_binary_b8(ops[k].op, t, t, b, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(t[i] == BOOL_REF(fn, a[i], b[i]), "%s into a at %d: %d", ops[k].name, i, t[i]);
    memcpy(t, b, sizeof t);
    tn_rt_binary_b8(ops[k].op, t, a, t, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(t[i] == BOOL_REF(fn, a[i], b[i]), "%s into b at %d: %d", ops[k].name, i, t[i]);
  }
#undef BOOL_REF
  /* spelled out on the four pairs (0,0) (1,0) (0,1) (1,1) */
  tn_rt_binary_b8(TN_RT_B_LAND, r, a, b, 4);
  ck_assert(r[0] == 0 && r[1] == 0 && r[2] == 0 && r[3] == 1);
  tn_rt_binary_b8(TN_RT_B_LOR, r, a, b, 4);
  ck_assert(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 1);
  tn_rt_binary_b8(TN_RT_B_BXOR, r, a, b, 4);
  ck_assert(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 0);
}
END_TEST

/* Expected comparison of x and y under TN_RT_C_* op (NaN: only NE holds). */
static int64_t cmp_ref(int op, double x, double y)
{
  if (x != x || y != y)
    return op == TN_RT_C_NE;
  switch (op) {
  case TN_RT_C_EQ: return x == y;
  case TN_RT_C_NE: return x != y;
  case TN_RT_C_LT: return x < y;
  case TN_RT_C_LE: return x <= y;
  case TN_RT_C_GT: return x > y;
  default: return x >= y;
  }
}

START_TEST(test_rt_compare)
{
  static const float pa[8] = {NAN, 1.0f, -0.0f, INFINITY, -INFINITY, 2.5f, NAN, 3.0f};
  static const float pb[8] = {NAN, 1.0f, 0.0f, INFINITY, 1.0f, -2.5f, 0.0f, NAN};
  float a32[RN], b32[RN];
  double a64[RN], b64[RN];
  int64_t ai[RN], bi[RN];
  uint8_t ab[RN], bb[RN], r[RN + 16]; /* results are bool blocks: bytes, 0 or 1 */
  memset(r, 0x5a, sizeof r);
  for (int i = 0; i < RN; i++) {
    ab[i] = (uint8_t)(i % 2);
    bb[i] = (uint8_t)(i % 4 < 2);
    a32[i] = pa[i % 8];
    b32[i] = pb[i % 8];
    a64[i] = pa[i % 8];
    b64[i] = pb[i % 8];
    ai[i] = (int64_t)(i % 5) - 2 + (i % 7 == 0 ? INT64_MIN / 2 : 0);
    bi[i] = (int64_t)(i % 3) - 1;
  }
  static const double scalars[4] = {1.0, 0.0, NAN, -INFINITY};
  for (int op = TN_RT_C_EQ; op <= TN_RT_C_GE; op++) {
    tn_rt_compare_f32(op, r, a32, b32, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(r[i] == cmp_ref(op, a32[i], b32[i]), "f32 op %d at %d: %lld", op, i, (long long)r[i]);
    tn_rt_compare_f64(op, r, a64, b64, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(r[i] == cmp_ref(op, a64[i], b64[i]), "f64 op %d at %d: %lld", op, i, (long long)r[i]);
    tn_rt_compare_i64(op, r, ai, bi, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(r[i] == cmp_ref(op, (double)ai[i], (double)bi[i]), "i64 op %d at %d", op, i);
    tn_rt_compare_b8(op, r, ab, bb, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(r[i] == cmp_ref(op, ab[i], bb[i]), "b8 op %d (%d, %d) at %d: %d", op, ab[i], bb[i], i, r[i]);
    for (int k = 0; k < 4; k++) {
      double s = scalars[k];
      tn_rt_compare_s_f32(op, r, a32, (float)s, RN);
      for (int i = 0; i < RN; i++)
        ck_assert_msg(r[i] == cmp_ref(op, a32[i], s), "f32 op %d s %g at %d: %lld", op, s, i, (long long)r[i]);
      tn_rt_compare_s_f64(op, r, a64, s, RN);
      for (int i = 0; i < RN; i++)
        ck_assert_msg(r[i] == cmp_ref(op, a64[i], s), "f64 op %d s %g at %d: %lld", op, s, i, (long long)r[i]);
    }
    for (int64_t s = -1; s <= 1; s++) {
      tn_rt_compare_s_i64(op, r, ai, s, RN);
      for (int i = 0; i < RN; i++)
        ck_assert_msg(r[i] == cmp_ref(op, (double)ai[i], (double)s), "i64 op %d s %lld at %d", op,
                      (long long)s, i);
    }
    for (int s = 0; s <= 1; s++) {
      tn_rt_compare_s_b8(op, r, ab, (uint8_t)s, RN);
      for (int i = 0; i < RN; i++)
        ck_assert_msg(r[i] == cmp_ref(op, ab[i], s), "b8 op %d (%d, s %d) at %d: %d", op, ab[i], s, i, r[i]);
    }
    for (int i = RN; i < RN + 16; i++) /* bytes: nothing written past n */
      ck_assert_msg(r[i] == 0x5a, "op %d wrote r[%d] past n = %d", op, i, RN);
  }
  /* spelled out: NaN against itself, -0 == +0, inf == inf */
  tn_rt_compare_f32(TN_RT_C_NE, r, a32, b32, 8);
  ck_assert(r[0] == 1 && r[1] == 0 && r[2] == 0 && r[6] == 1 && r[7] == 1);
  tn_rt_compare_f32(TN_RT_C_EQ, r, a32, b32, 8);
  ck_assert(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 1 && r[6] == 0);
  tn_rt_compare_f64(TN_RT_C_GE, r, a64, b64, 8);
  ck_assert(r[0] == 0 && r[2] == 1 && r[4] == 0 && r[5] == 1 && r[6] == 0 && r[7] == 0);
  /* int64 compares exactly (no detour through double) */
  int64_t big[2] = {INT64_MAX, INT64_MAX - 1};
  tn_rt_compare_s_i64(TN_RT_C_EQ, r, big, INT64_MAX, 2);
  ck_assert(r[0] == 1 && r[1] == 0);
  tn_rt_compare_s_i64(TN_RT_C_LT, r, big, INT64_MAX, 2);
  ck_assert(r[0] == 0 && r[1] == 1);
  /* bool order: false < true */
  static const uint8_t bf[4] = {0, 0, 1, 1}, bt[4] = {0, 1, 0, 1};
  tn_rt_compare_b8(TN_RT_C_LT, r, bf, bt, 4);
  ck_assert(r[0] == 0 && r[1] == 1 && r[2] == 0 && r[3] == 0);
  tn_rt_compare_b8(TN_RT_C_GE, r, bf, bt, 4);
  ck_assert(r[0] == 1 && r[1] == 0 && r[2] == 1 && r[3] == 1);
  tn_rt_compare_s_b8(TN_RT_C_NE, r, bt, 1, 4);
  ck_assert(r[0] == 1 && r[1] == 0 && r[2] == 1 && r[3] == 0);
}
END_TEST

START_TEST(test_rt_where)
{
  uint8_t c[RN], ab[RN], bb[RN], rb[RN];
  int64_t ai[RN], bi[RN], ri[RN];
  float a32[RN], b32[RN], r32[RN];
  double a64[RN], b64[RN], r64[RN];
  for (int i = 0; i < RN; i++) {
    c[i] = i % 3 == 1;
    a32[i] = i == 4 ? NAN : i == 7 ? -0.0f : (float)i;
    b32[i] = i == 5 ? NAN : i == 8 ? -0.0f : -(float)i - 100.0f;
    a64[i] = a32[i] * 1.5;
    b64[i] = b32[i] * 1.5;
    ai[i] = i % 2 ? INT64_MIN + i : i;
    bi[i] = INT64_MAX - i;
    ab[i] = (uint8_t)(i % 2);
    bb[i] = (uint8_t)(i % 5 < 3);
  }
  c[4] = 1; /* the NaN of a is chosen */
  c[7] = 1; /* a's -0 is chosen */
  c[8] = 0; /* b's -0 is chosen */
#define CHECK_WHERE(r, a, b) \
  for (int i = 0; i < RN; i++) \
    ck_assert_msg(memcmp(&r[i], c[i] ? &a[i] : &b[i], sizeof r[i]) == 0, #r " at %d", i)
  tn_rt_where_f32(r32, c, a32, b32, RN);
  CHECK_WHERE(r32, a32, b32);
  ck_assert(isnan(r32[4]) && r32[7] == 0.0f && signbit(r32[7]) && signbit(r32[8]));
  tn_rt_where_f64(r64, c, a64, b64, RN);
  CHECK_WHERE(r64, a64, b64);
  tn_rt_where_i64(ri, c, ai, bi, RN);
  CHECK_WHERE(ri, ai, bi);
  tn_rt_where_b8(rb, c, ab, bb, RN);
  CHECK_WHERE(rb, ab, bb);
  /* dst aliasing a, then b */
  float t32[RN];
  double t64[RN];
  int64_t ti[RN];
  uint8_t tb[RN];
  memcpy(t32, a32, sizeof t32);
  tn_rt_where_f32(t32, c, t32, b32, RN);
  CHECK_WHERE(t32, a32, b32);
  memcpy(t32, b32, sizeof t32);
  tn_rt_where_f32(t32, c, a32, t32, RN);
  CHECK_WHERE(t32, a32, b32);
  memcpy(t64, a64, sizeof t64);
  tn_rt_where_f64(t64, c, t64, b64, RN);
  CHECK_WHERE(t64, a64, b64);
  memcpy(t64, b64, sizeof t64);
  tn_rt_where_f64(t64, c, a64, t64, RN);
  CHECK_WHERE(t64, a64, b64);
  memcpy(ti, ai, sizeof ti);
  tn_rt_where_i64(ti, c, ti, bi, RN);
  CHECK_WHERE(ti, ai, bi);
  memcpy(ti, bi, sizeof ti);
  tn_rt_where_i64(ti, c, ai, ti, RN);
  CHECK_WHERE(ti, ai, bi);
  memcpy(tb, ab, sizeof tb);
  tn_rt_where_b8(tb, c, tb, bb, RN);
  CHECK_WHERE(tb, ab, bb);
  memcpy(tb, bb, sizeof tb);
  tn_rt_where_b8(tb, c, ab, tb, RN);
  CHECK_WHERE(tb, ab, bb);
#undef CHECK_WHERE
}
END_TEST

/* Floats to integers: eager's values (torch 2.13, CPU) for
** [nan, inf, -inf, 3e9, -3e9, 1e20, 300.5, -1.5, 70000.7, -129.9] of each
** source dtype .to() each integer dtype, and bool (whose blocks are bytes:
** checked as such, then widened here). */
#define I64MIN INT64_MIN
#define I32MIN INT32_MIN
static const double cast_src[10] = {NAN, INFINITY, -INFINITY, 3e9, -3e9, 1e20, 300.5, -1.5, 70000.7, -129.9};
static const int cast_to[6] = {TN_DTYPE_INT64, TN_DTYPE_INT32, TN_DTYPE_INT16, TN_DTYPE_INT8, TN_DTYPE_UINT8,
                               TN_DTYPE_BOOL};
/* float32 and float64 sources */
static const int64_t cast_want_f[6][10] = {
  {I64MIN, I64MIN, I64MIN, 3000000000, -3000000000, I64MIN, 300, -1, 70000, -129},
  {I32MIN, I32MIN, I32MIN, I32MIN, I32MIN, I32MIN, 300, -1, 70000, -129},
  {0, 0, 0, 0, 0, 0, 300, -1, 4464, -129},
  {0, 0, 0, 0, 0, 0, 44, -1, 112, 127},
  {0, 0, 0, 0, 0, 0, 44, 255, 112, 127},
  {1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
};
/* float16 sources (3e9 and 70000.7 are inf in float16) */
static const int64_t cast_want_f16[6][10] = {
  {I64MIN, I64MIN, I64MIN, I64MIN, I64MIN, I64MIN, 300, -1, I64MIN, -129},
  {I32MIN, I32MIN, I32MIN, I32MIN, I32MIN, I32MIN, 300, -1, I32MIN, -129},
  {0, 0, 0, 0, 0, 0, 300, -1, 0, -129},
  {0, 0, 0, 0, 0, 0, 44, -1, 0, 127},
  {0, 0, 0, 0, 0, 0, 44, 255, 0, 127},
  {1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
};
/* bfloat16 sources (3e9 -> 3003121664, 70000.7 -> 70144, -129.9 -> -130) */
static const int64_t cast_want_bf16[6][10] = {
  {I64MIN, I64MIN, I64MIN, 3003121664, -3003121664, I64MIN, 300, -1, 70144, -130},
  {I32MIN, I32MIN, I32MIN, I32MIN, I32MIN, I32MIN, 300, -1, 70144, -130},
  {0, 0, 0, 0, 0, 0, 300, -1, 4608, -130},
  {0, 0, 0, 0, 0, 0, 44, -1, 0, 126},
  {0, 0, 0, 0, 0, 0, 44, 255, 0, 126},
  {1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
};

START_TEST(test_rt_cast_float_to_int)
{
  float s32[RN];
  double s64[RN];
  int64_t d[RN];
  uint8_t db[RN + 16];
  for (int i = 0; i < RN; i++) {
    s32[i] = (float)cast_src[i % 10];
    s64[i] = cast_src[i % 10];
  }
  struct { int from; const void *src; const int64_t (*want)[10]; } froms[4] = {
    {TN_DTYPE_FLOAT32, s32, cast_want_f}, {TN_DTYPE_FLOAT64, s64, cast_want_f},
    {TN_DTYPE_FLOAT16, s32, cast_want_f16}, {TN_DTYPE_BFLOAT16, s32, cast_want_bf16},
  };
  int bad = 0;
  char msg[2048] = "";
  size_t len = 0;
  for (int f = 0; f < 4; f++)
    for (int t = 0; t < 6; t++) {
      if (cast_to[t] == TN_DTYPE_BOOL) {
        memset(db, 0x5a, sizeof db);
        tn_rt_cast(TN_DTYPE_BOOL, froms[f].from, db, froms[f].src, RN);
        for (int i = RN; i < RN + 16; i++)
          ck_assert_msg(db[i] == 0x5a, "cast(bool <- %s) wrote past n at %d", tn_dtype_name(froms[f].from), i);
        for (int i = 0; i < RN; i++)
          d[i] = db[i];
      } else {
        for (int i = 0; i < RN; i++)
          d[i] = 12345;
        tn_rt_cast(cast_to[t], froms[f].from, d, froms[f].src, RN);
      }
      for (int i = 0; i < RN; i++) {
        int64_t want = froms[f].want[t][i % 10];
        if (d[i] != want) {
          if (bad++ < 12 && len < sizeof msg - 200)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "\n  cast(%s <- %s) of %.9g at %d: got %lld, want %lld",
                                    tn_dtype_name(cast_to[t]), tn_dtype_name(froms[f].from), cast_src[i % 10], i,
                                    (long long)d[i], (long long)want);
        }
      }
    }
  ck_assert_msg(bad == 0, "%d wrong elements:%s", bad, msg);
}
END_TEST

/* Truncation toward zero of values rounded to float16 / bfloat16 first,
** and float -> bool as x != 0. */
START_TEST(test_rt_cast_rounds_half_sources)
{
  float s[4] = {255.9f, 2047.9f, 2.99f, -1.7f};
  int64_t d[4];
  tn_rt_cast(TN_DTYPE_INT64, TN_DTYPE_BFLOAT16, d, s, 4);
  ck_assert_int_eq(d[0], 256);  /* bf16(255.9) = 256 */
  ck_assert_int_eq(d[2], 2);    /* bf16(2.99) = 2.984375 */
  ck_assert_int_eq(d[3], -1);
  tn_rt_cast(TN_DTYPE_INT64, TN_DTYPE_FLOAT16, d, s, 4);
  ck_assert_int_eq(d[1], 2048); /* f16(2047.9) = 2048 */
  ck_assert_int_eq(d[2], 2);
  tn_rt_cast(TN_DTYPE_INT64, TN_DTYPE_FLOAT32, d, s, 4);
  ck_assert(d[0] == 255 && d[1] == 2047 && d[2] == 2 && d[3] == -1);

  float b[6] = {NAN, 0.0f, -0.0f, 0.5f, -INFINITY, 1e-30f};
  double b64[6] = {NAN, 0.0, -0.0, 0.5, -INFINITY, 1e-300};
  uint8_t r[6];
  tn_rt_cast(TN_DTYPE_BOOL, TN_DTYPE_FLOAT32, r, b, 6);
  ck_assert(r[0] == 1 && r[1] == 0 && r[2] == 0 && r[3] == 1 && r[4] == 1 && r[5] == 1);
  tn_rt_cast(TN_DTYPE_BOOL, TN_DTYPE_FLOAT64, r, b64, 6);
  ck_assert(r[0] == 1 && r[1] == 0 && r[2] == 0 && r[3] == 1 && r[4] == 1 && r[5] == 1);
  tn_rt_cast(TN_DTYPE_BOOL, TN_DTYPE_FLOAT16, r, b, 6);
  ck_assert(r[0] == 1 && r[1] == 0 && r[2] == 0 && r[3] == 1 && r[4] == 1);
  ck_assert_int_eq(r[5], 0); /* 1e-30 is 0 in float16 */
  tn_rt_cast(TN_DTYPE_BOOL, TN_DTYPE_BFLOAT16, r, b, 6);
  ck_assert(r[0] == 1 && r[1] == 0 && r[2] == 0 && r[3] == 1 && r[4] == 1);
  ck_assert_int_eq(r[5], 1); /* but not in bfloat16 (float32's exponent range) */
}
END_TEST

/* The runtime's float16 conversions against the C compiler's _Float16
** (every float16 value in; out: every float16 value, the midpoints between
** neighbours, where rounding to even decides, a float32 ulp either side,
** and a sweep of all float32 exponents), and bfloat16's rounding at its
** midpoints. A NaN must stay a NaN of its sign. */
static int half_same(uint16_t got, uint16_t want, int f16)
{
  uint16_t inf = f16 ? 0x7c00 : 0x7f80, man = f16 ? 0x03ff : 0x007f;
  int gnan = (got & inf) == inf && (got & man), wnan = (want & inf) == inf && (want & man);
  return gnan || wnan ? gnan && wnan && (got & 0x8000) == (want & 0x8000) : got == want;
}

static uint16_t f16_bits(float f)
{
  _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

START_TEST(test_rt_half_conversions_round_to_nearest_even)
{
  enum { N = 65536 };
  uint16_t *h = malloc(N * sizeof *h), *back = malloc(4 * N * sizeof *back);
  float *f = malloc(4 * N * sizeof *f);
  ck_assert(h && back && f);
  int bad = 0;
  for (uint32_t i = 0; i < N; i++)
    h[i] = (uint16_t)i;
  for (uint32_t i = 0; i < N; i += 7) /* 7 at a time: the portable conversion */
    tn_rt_load_f16(f + i, h + i, 1, N - i > 7 ? 7 : N - i);
  tn_rt_load_f16(f + 7, h + 7, 1, N - 7); /* and F16C's where the CPU has it */
  for (uint32_t i = 0; i < N; i++) {
    _Float16 w;
    memcpy(&w, &h[i], 2);
    float want = (float)w;
    if (!(f[i] == want || (isnan(f[i]) && isnan(want))) || (f[i] == 0 && signbit(f[i]) != signbit(want)))
      ck_assert_msg(bad++ > 8, "f16 0x%04x -> %a, want %a", i, f[i], want);
  }
  /* out: each value, the midpoint to the next one up (by magnitude) and a float32 ulp either side of it */
  uint32_t n = 0;
  for (uint32_t i = 0; i < N; i++) {
    uint16_t next = (uint16_t)(i + 1);
    if ((i & 0x7fff) >= 0x7c00 || (next & 0x7fff) > 0x7c00 || (next & 0x7fff) == 0)
      continue;
    float a, c;
    tn_rt_load_f16(&a, &h[i], 1, 1);
    tn_rt_load_f16(&c, &next, 1, 1);
    float mid = (float)(((double)a + (double)c) / 2);
    f[n++] = mid;
    f[n++] = nextafterf(mid, 0.0f);
    f[n++] = nextafterf(mid, copysignf(INFINITY, mid));
    f[n++] = a;
  }
  for (int part = 0; part < 2; part++) { /* whole (F16C where the CPU has it), then 7 at a time (portable) */
    for (uint32_t i = 0; i < n; i += part ? 7 : n)
      tn_rt_store_f16(back + i, 1, f + i, part && n - i > 7 ? 7 : n - i);
    for (uint32_t i = 0; i < n; i++)
      if (!half_same(back[i], f16_bits(f[i]), 1))
        ck_assert_msg(bad++ > 8, "f16(%a) = 0x%04x, want 0x%04x (part %d)", f[i], back[i], f16_bits(f[i]), part);
  }
  /* every float32 exponent, signs, NaN and infinities: bit patterns 0x00010001 apart, 4 per call */
  for (uint64_t u = 0; u <= 0xffffffffu; u += 0x00010001u * 4) {
    uint32_t w[4] = {(uint32_t)u, (uint32_t)u + 0x10001u, (uint32_t)u + 0x20002u, (uint32_t)u + 0x30003u};
    float x[4];
    uint16_t o[4];
    memcpy(x, w, sizeof x);
    tn_rt_store_f16(o, 1, x, 4);
    for (int k = 0; k < 4; k++)
      if (!half_same(o[k], f16_bits(x[k]), 1))
        ck_assert_msg(bad++ > 8, "f16(%a) = 0x%04x, want 0x%04x", x[k], o[k], f16_bits(x[k]));
  }
  /* bfloat16: the midpoint between b and b + 1 goes to the even one, a float32 ulp off it to the nearer */
  n = 0;
  for (uint32_t i = 0; i < N; i++) {
    if ((i & 0x7fff) >= 0x7f80 || ((i + 1) & 0x7fff) > 0x7f80 || ((i + 1) & 0x7fff) == 0)
      continue;
    uint32_t lo = i << 16, hi = (i + 1) << 16, m = lo + 0x8000u;
    memcpy(&f[n++], &m, 4);
    m = lo + 0x7fffu;
    memcpy(&f[n++], &m, 4);
    m = lo + 0x8001u;
    memcpy(&f[n++], &m, 4);
    (void)hi;
  }
  tn_rt_store_bf16(back, 1, f, n);
  for (uint32_t i = 0; i < n; i += 3) {
    uint32_t u;
    memcpy(&u, &f[i], 4);
    uint16_t b = (uint16_t)(u >> 16), even = (b & 1) ? (uint16_t)(b + 1) : b;
    if (back[i] != even || back[i + 1] != b || back[i + 2] != (uint16_t)(b + 1))
      ck_assert_msg(bad++ > 8, "bf16 at 0x%04x: got 0x%04x 0x%04x 0x%04x", b, back[i], back[i + 1], back[i + 2]);
  }
  float nan_in[2] = {NAN, -NAN};
  tn_rt_store_bf16(back, 1, nan_in, 2);
  ck_assert(half_same(back[0], 0x7fc0, 0) && half_same(back[1], 0xffc0, 0));
  free(h);
  free(back);
  free(f);
  ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(test_rt_cast_int_and_float)
{
  /* int -> int wraps; eager's int64 tensor .to(dtype) */
  static const int64_t pat[8] = {((int64_t)1 << 40) + 3, 300, -1, 70000, -129, 256, 0, INT64_MIN};
  int64_t src[RN], d[RN];
  for (int i = 0; i < RN; i++)
    src[i] = pat[i % 8];
  static const int64_t want[6][8] = {
    {((int64_t)1 << 40) + 3, 300, -1, 70000, -129, 256, 0, INT64_MIN},
    {3, 300, -1, 70000, -129, 256, 0, 0},
    {3, 300, -1, 4464, -129, 256, 0, 0},
    {3, 44, -1, 112, 127, 0, 0, 0},
    {3, 44, 255, 112, 127, 0, 0, 0},
    {1, 1, 1, 1, 1, 1, 0, 1},
  };
  for (int t = 0; t < 6; t++) {
    if (cast_to[t] == TN_DTYPE_BOOL) { /* bytes */
      uint8_t db[RN];
      tn_rt_cast(TN_DTYPE_BOOL, TN_DTYPE_INT64, db, src, RN);
      for (int i = 0; i < RN; i++)
        d[i] = db[i];
    } else {
      tn_rt_cast(cast_to[t], TN_DTYPE_INT64, d, src, RN);
    }
    for (int i = 0; i < RN; i++)
      ck_assert_msg(d[i] == want[t][i % 8], "cast(%s <- int64) of %lld: got %lld, want %lld",
                    tn_dtype_name(cast_to[t]), (long long)src[i], (long long)d[i], (long long)want[t][i % 8]);
  }
  /* in place (int64 blocks both) */
  memcpy(d, src, sizeof d);
  tn_rt_cast(TN_DTYPE_INT8, TN_DTYPE_INT32, d, d, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(d[i], want[3][i % 8]);

  /* int -> float: float16 and bfloat16 through float32, as eager
  ** (2^24 + 2^16 + 1 -> float32 2^24 + 2^16 -> bfloat16 2^24 by ties-to-even;
  ** straight to bfloat16 it would be 2^24 + 2^17) */
  static const int64_t ip[6] = {((int64_t)1 << 24) + (1 << 16) + 1, 65519, 65520, -7, 300, ((int64_t)1 << 40) + 3};
  static const float want_f32[6] = {16842752.0f, 65519.0f, 65520.0f, -7.0f, 300.0f, 1099511627776.0f};
  static const float want_f16[6] = {INFINITY, 65504.0f, INFINITY, -7.0f, 300.0f, INFINITY};
  static const float want_bf16[6] = {16777216.0f, 65536.0f, 65536.0f, -7.0f, 300.0f, 1099511627776.0f};
  float fd[RN];
  double dd[RN];
  for (int i = 0; i < RN; i++)
    src[i] = ip[i % 6];
  tn_rt_cast(TN_DTYPE_FLOAT32, TN_DTYPE_INT64, fd, src, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_float_eq(fd[i], want_f32[i % 6]);
  tn_rt_cast(TN_DTYPE_FLOAT16, TN_DTYPE_INT64, fd, src, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_msg(fd[i] == want_f16[i % 6], "cast(float16 <- int64) of %lld: %g", (long long)src[i], fd[i]);
  tn_rt_cast(TN_DTYPE_BFLOAT16, TN_DTYPE_INT64, fd, src, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_msg(fd[i] == want_bf16[i % 6], "cast(bfloat16 <- int64) of %lld: %g", (long long)src[i], fd[i]);
  tn_rt_cast(TN_DTYPE_FLOAT64, TN_DTYPE_INT64, dd, src, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(dd[i] == (double)src[i]);
  uint8_t bsrc[3] = {1, 0, 1};
  tn_rt_cast(TN_DTYPE_FLOAT32, TN_DTYPE_BOOL, fd, bsrc, 3);
  ck_assert(fd[0] == 1.0f && fd[1] == 0.0f && fd[2] == 1.0f);

  /* float -> float: half sources rounded first; same-dtype float16 rounds */
  float fs[RN];
  for (int i = 0; i < RN; i++)
    fs[i] = i % 3 == 0 ? 1.0001f : i % 3 == 1 ? 0.1f : NAN;
  tn_rt_cast(TN_DTYPE_FLOAT32, TN_DTYPE_FLOAT16, fd, fs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(i % 3 == 0 ? fd[i] == 1.0f : i % 3 == 1 ? fd[i] == 0.0999755859375f : isnan(fd[i]));
  tn_rt_cast(TN_DTYPE_FLOAT16, TN_DTYPE_FLOAT16, fd, fs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(i % 3 == 0 ? fd[i] == 1.0f : i % 3 == 1 ? fd[i] == 0.0999755859375f : isnan(fd[i]));
  tn_rt_cast(TN_DTYPE_FLOAT16, TN_DTYPE_FLOAT32, fd, fs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(i % 3 == 0 ? fd[i] == 1.0f : i % 3 == 1 ? fd[i] == 0.0999755859375f : isnan(fd[i]));
  tn_rt_cast(TN_DTYPE_BFLOAT16, TN_DTYPE_FLOAT32, fd, fs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(i % 3 == 0 ? fd[i] == 1.0f : i % 3 == 1 ? fd[i] == 0.10009765625f : isnan(fd[i]));
  tn_rt_cast(TN_DTYPE_FLOAT32, TN_DTYPE_FLOAT32, fd, fs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(memcmp(&fd[i], &fs[i], 4) == 0);
  tn_rt_cast(TN_DTYPE_FLOAT64, TN_DTYPE_BFLOAT16, dd, fs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(i % 3 == 0 ? dd[i] == 1.0 : i % 3 == 1 ? dd[i] == 0.10009765625 : isnan(dd[i]));
  tn_rt_cast(TN_DTYPE_FLOAT64, TN_DTYPE_FLOAT32, dd, fs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(i % 3 == 2 ? isnan(dd[i]) : dd[i] == (double)fs[i]);
  double ds[RN];
  for (int i = 0; i < RN; i++)
    ds[i] = i % 2 ? 0.1 : 1e300;
  tn_rt_cast(TN_DTYPE_FLOAT32, TN_DTYPE_FLOAT64, fd, ds, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(i % 2 ? fd[i] == 0.1f : fd[i] == INFINITY);
  tn_rt_cast(TN_DTYPE_FLOAT64, TN_DTYPE_FLOAT64, dd, ds, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(dd[i] == ds[i]);
  /* in place, float blocks both */
  memcpy(fd, fs, sizeof fd);
  tn_rt_cast(TN_DTYPE_FLOAT32, TN_DTYPE_FLOAT16, fd, fd, RN);
  for (int i = 0; i < RN; i++)
    ck_assert(i % 3 == 0 ? fd[i] == 1.0f : i % 3 == 1 ? fd[i] == 0.0999755859375f : isnan(fd[i]));
}
END_TEST

/* Casts from and to bool: bool blocks are bytes (0 or 1). To bool is
** x != 0 (NaN true; int64 values whose low byte is 0 true; float16 and
** bfloat16 sources rounded to their dtype first); from bool 0 / 1 in the
** target's compute type. Expected values: eager's (torch 2.13, CPU). */
START_TEST(test_rt_cast_bool)
{
  uint8_t bs[RN], bd[RN + 16];
  for (int i = 0; i < RN; i++)
    bs[i] = (uint8_t)(i % 3 != 1);

  /* bool -> integers: 0 / 1 in int64 blocks */
  static const int int_to[5] = {TN_DTYPE_INT64, TN_DTYPE_INT32, TN_DTYPE_INT16, TN_DTYPE_INT8, TN_DTYPE_UINT8};
  int64_t d[RN + 4];
  for (int t = 0; t < 5; t++) {
    for (int i = 0; i < RN + 4; i++)
      d[i] = 12345;
    tn_rt_cast(int_to[t], TN_DTYPE_BOOL, d, bs, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(d[i] == bs[i], "cast(%s <- bool) of %d at %d: got %lld", tn_dtype_name(int_to[t]), bs[i], i,
                    (long long)d[i]);
    for (int i = RN; i < RN + 4; i++)
      ck_assert_int_eq(d[i], 12345);
  }
  /* bool -> floats: 0.0 / 1.0 (float blocks; float64: double blocks) */
  static const int float_to[3] = {TN_DTYPE_FLOAT32, TN_DTYPE_FLOAT16, TN_DTYPE_BFLOAT16};
  float fd[RN];
  for (int t = 0; t < 3; t++) {
    for (int i = 0; i < RN; i++)
      fd[i] = -7.0f;
    tn_rt_cast(float_to[t], TN_DTYPE_BOOL, fd, bs, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(fd[i] == (bs[i] ? 1.0f : 0.0f) && !signbit(fd[i]), "cast(%s <- bool) of %d at %d: got %g",
                    tn_dtype_name(float_to[t]), bs[i], i, fd[i]);
  }
  double dd[RN];
  for (int i = 0; i < RN; i++)
    dd[i] = -7.0;
  tn_rt_cast(TN_DTYPE_FLOAT64, TN_DTYPE_BOOL, dd, bs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_msg(dd[i] == (bs[i] ? 1.0 : 0.0) && !signbit(dd[i]), "cast(float64 <- bool) at %d: got %g", i, dd[i]);
  /* bool -> bool: a copy; in place (byte blocks both) */
  memset(bd, 0x5a, sizeof bd);
  tn_rt_cast(TN_DTYPE_BOOL, TN_DTYPE_BOOL, bd, bs, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(bd[i], bs[i]);
  for (int i = RN; i < RN + 16; i++)
    ck_assert_int_eq(bd[i], 0x5a);
  tn_rt_cast(TN_DTYPE_BOOL, TN_DTYPE_BOOL, bd, bd, RN);
  for (int i = 0; i < RN; i++)
    ck_assert_int_eq(bd[i], bs[i]);

  /* integers -> bool (int64 blocks of each dtype's values) */
  static const int64_t i64v[8] = {0, 1, -1, 256, ((int64_t)1 << 40) + 3, INT64_MIN, INT64_MAX, -256};
  static const int64_t i32v[8] = {0, 1, -1, 256, INT32_MIN, INT32_MAX, -256, 65536};
  static const int64_t i8v[8] = {0, 1, -1, 127, -128, 0, 64, -2};
  static const int64_t u8v[8] = {0, 1, 255, 128, 0, 2, 0, 254};
  struct { int from; const int64_t *v; } ints[5] = {
    {TN_DTYPE_INT64, i64v}, {TN_DTYPE_INT32, i32v}, {TN_DTYPE_INT16, i8v}, {TN_DTYPE_INT8, i8v},
    {TN_DTYPE_UINT8, u8v},
  };
  int64_t is[RN];
  for (int f = 0; f < 5; f++) {
    for (int i = 0; i < RN; i++)
      is[i] = ints[f].v[i % 8];
    memset(bd, 0x5a, sizeof bd);
    tn_rt_cast(TN_DTYPE_BOOL, ints[f].from, bd, is, RN);
    for (int i = 0; i < RN; i++)
      ck_assert_msg(bd[i] == (is[i] != 0), "cast(bool <- %s) of %lld at %d: got %d", tn_dtype_name(ints[f].from),
                    (long long)is[i], i, bd[i]);
    for (int i = RN; i < RN + 16; i++)
      ck_assert_msg(bd[i] == 0x5a, "cast(bool <- %s) wrote past n at %d", tn_dtype_name(ints[f].from), i);
  }

  /* floats -> bool: values held as float32 for float32 / float16 /
  ** bfloat16 sources (the half ones rounded first: 1e-8, 2^-25 (a tie to
  ** 0) and 1e-40 are 0 in float16; 1e-45 is 0 in bfloat16; 3e-8 rounds up
  ** to float16's smallest subnormal) */
  enum { NF = 14 };
  static const float fv[NF] = {NAN, 0.0f, -0.0f, 0.5f, -INFINITY, 1e-30f, 1e-8f, 3e-8f,
                               0x1p-25f, -1e-8f, 1e-40f, 1e-45f, 65520.0f, -3e38f};
  static const uint8_t want_f32[NF] = {1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  static const uint8_t want_f16[NF] = {1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1};
  static const uint8_t want_bf16[NF] = {1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1};
  float fs[RN];
  double ds[RN];
  for (int i = 0; i < RN; i++) {
    fs[i] = fv[i % NF];
    ds[i] = fv[i % NF];
  }
  struct { int from; const void *src; const uint8_t *want; } fl[4] = {
    {TN_DTYPE_FLOAT32, fs, want_f32}, {TN_DTYPE_FLOAT64, ds, want_f32},
    {TN_DTYPE_FLOAT16, fs, want_f16}, {TN_DTYPE_BFLOAT16, fs, want_bf16},
  };
  int bad = 0;
  char msg[2048] = "";
  size_t len = 0;
  for (int f = 0; f < 4; f++) {
    memset(bd, 0x5a, sizeof bd);
    tn_rt_cast(TN_DTYPE_BOOL, fl[f].from, bd, fl[f].src, RN);
    for (int i = 0; i < RN + 16; i++) {
      int want = i < RN ? fl[f].want[i % NF] : 0x5a;
      if (bd[i] != want && bad++ < 12 && len < sizeof msg - 200)
        len += (size_t)snprintf(msg + len, sizeof msg - len, "\n  cast(bool <- %s) of %.9g at %d: got %d, want %d",
                                tn_dtype_name(fl[f].from), i < RN ? (double)fs[i] : 0.0, i, bd[i], want);
    }
  }
  ck_assert_msg(bad == 0, "%d wrong elements:%s", bad, msg);
  /* float64: its own tiny values are not 0 */
  double tiny[3] = {1e-300, 5e-324, -0.0};
  tn_rt_cast(TN_DTYPE_BOOL, TN_DTYPE_FLOAT64, bd, tiny, 3);
  ck_assert(bd[0] == 1 && bd[1] == 1 && bd[2] == 0);
}
END_TEST

/* Running argmax / argmin over blocks: ties go to the first, the first NaN
** wins over everything (also over a later larger block), int64 and double
** the same way. */
START_TEST(test_rt_argreduce)
{
  float a[40];
  for (int i = 0; i < 40; i++)
    a[i] = (float)(i % 7);
  float best = 0;
  int64_t at = -1;
  tn_rt_argreduce_f32(TN_RT_R_ARGMAX, a, 20, 0, &best, &at);      /* first 6 at index 6 */
  tn_rt_argreduce_f32(TN_RT_R_ARGMAX, a + 20, 20, 20, &best, &at); /* ties later: kept */
  ck_assert_int_eq(at, 6);
  ck_assert(best == 6.0f);
  at = -1;
  tn_rt_argreduce_f32(TN_RT_R_ARGMIN, a + 3, 37, 3, &best, &at);   /* first 0 at 7 */
  ck_assert_int_eq(at, 7);
  a[25] = NAN;
  a[31] = NAN;
  at = -1;
  tn_rt_argreduce_f32(TN_RT_R_ARGMAX, a, 20, 0, &best, &at);
  tn_rt_argreduce_f32(TN_RT_R_ARGMAX, a + 20, 20, 20, &best, &at);
  ck_assert_int_eq(at, 25);
  a[39] = INFINITY;
  at = -1;
  tn_rt_argreduce_f32(TN_RT_R_ARGMIN, a + 20, 20, 20, &best, &at);  /* NaN wins for argmin too */
  ck_assert_int_eq(at, 25);
  double d[5] = {1.0, -0.0, 0.0, NAN, -3.0};
  double bd = 0;
  at = -1;
  tn_rt_argreduce_f64(TN_RT_R_ARGMIN, d, 3, 0, &bd, &at);
  ck_assert_int_eq(at, 1);                                          /* -0.0 and 0.0 tie: the first */
  tn_rt_argreduce_f64(TN_RT_R_ARGMIN, d + 3, 2, 3, &bd, &at);
  ck_assert_int_eq(at, 3);
  int64_t v[6] = {5, INT64_MIN, 9, 9, INT64_MAX, INT64_MAX}, bv = 0;
  at = -1;
  tn_rt_argreduce_i64(TN_RT_R_ARGMAX, v, 6, 100, &bv, &at);
  ck_assert_int_eq(at, 104);
  at = -1;
  tn_rt_argreduce_i64(TN_RT_R_ARGMIN, v, 6, 0, &bv, &at);
  ck_assert_int_eq(at, 1);
}
END_TEST

START_TEST(test_rt_round)
{
  ck_assert(tn_rt_round(TN_DTYPE_FLOAT32, 0.1) == (double)0.1f);
  ck_assert(tn_rt_round(TN_DTYPE_FLOAT16, 0.1) == 0.0999755859375);
  ck_assert(tn_rt_round(TN_DTYPE_BFLOAT16, 0.1) == 0.10009765625);
  ck_assert(tn_rt_round(TN_DTYPE_FLOAT16, 1.0001) == 1.0);
  ck_assert(tn_rt_round(TN_DTYPE_FLOAT16, 70000.0) == INFINITY);
  ck_assert(tn_rt_round(TN_DTYPE_FLOAT32, 1e300) == INFINITY);
  ck_assert(isnan(tn_rt_round(TN_DTYPE_FLOAT16, NAN)));
  ck_assert(tn_rt_round(TN_DTYPE_FLOAT64, 0.1) == 0.1);
  ck_assert(tn_rt_round(TN_DTYPE_FLOAT64, 1e300) == 1e300);
  ck_assert(tn_rt_round(TN_DTYPE_UINT8, 300) == 44);
  ck_assert(tn_rt_round(TN_DTYPE_UINT8, -1) == 255);
  ck_assert(tn_rt_round(TN_DTYPE_INT8, 300) == 44);
  ck_assert(tn_rt_round(TN_DTYPE_INT8, -129) == 127);
  ck_assert(tn_rt_round(TN_DTYPE_INT16, 70000) == 4464);
  ck_assert(tn_rt_round(TN_DTYPE_INT32, 1099511627779.0) == 3); /* 2^40 + 3 */
  ck_assert(tn_rt_round(TN_DTYPE_INT64, 1099511627779.0) == 1099511627779.0);
  ck_assert(tn_rt_round(TN_DTYPE_INT64, -5) == -5);
  ck_assert(tn_rt_round(TN_DTYPE_BOOL, 5) == 1);
  ck_assert(tn_rt_round(TN_DTYPE_BOOL, -1) == 1);
  ck_assert(tn_rt_round(TN_DTYPE_BOOL, 0) == 0);
  ck_assert(tn_rt_round(TN_DTYPE_BOOL, 0.5) == 1);
  ck_assert(tn_rt_round(TN_DTYPE_BOOL, -0.0) == 0);
  ck_assert(tn_rt_round(TN_DTYPE_BOOL, 256) == 1); /* not wrapped to a byte */
  ck_assert(tn_rt_round(TN_DTYPE_BOOL, NAN) == 1);
  ck_assert(tn_rt_round(TN_DTYPE_BOOL, 1e300) == 1);
}
END_TEST

/* End to end: x[3,40] and y[40] float32 (y broadcast over rows);
** m = x > 0.5; w = where(m, x, y); o = w.to(int32). One group of three
** nodes: inputs x, y (float32), output o (int32). */
START_TEST(test_compare_where_cast_kernel)
{
  enum { R = 3, C = 40 };
  static const tn_sint XS[2] = {{R, -1}, {C, -1}}, XST[2] = {{C, -1}, {1, -1}};
  static const tn_sint YS[1] = {{C, -1}}, YST[1] = {{1, -1}};
  tn_meta fx = {TN_DTYPE_FLOAT32, 2, XS, XST}, fy = {TN_DTYPE_FLOAT32, 1, YS, YST};
  tn_meta bm = {TN_DTYPE_BOOL, 2, XS, XST}, im = {TN_DTYPE_INT32, 2, XS, XST};
  tn_graph *g;
  tn_fusion *f;
  tn_tcc_unit *u;
  int32_t x, y, m, w, o;
  init_tcc();
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, fx};
  tn_input_desc iy = {TN_VALUE_ARG, 1, NULL, fy};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &iy, &y), TN_OK);
  tn_arg ag[2] = {T(x), F(0.5)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_gt_Scalar, NULL, ag, 2, &bm, 1, &m), TN_OK);
  tn_arg aw[3] = {T(m), T(x), T(y)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_where_self, NULL, aw, 3, &fx, 1, &w), TN_OK);
  tn_arg none = {TN_ARG_NONE, 0, {0}};
  tn_arg ac[7] = {T(w), {TN_ARG_DTYPE, 0, {.ar_int = TN_DTYPE_INT32}}, none, none, none,
                  {TN_ARG_BOOL, 0, {.ar_int = 0}}, none};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_to_copy, NULL, ac, 7, &im, 1, &o), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &o, 1), TN_OK);

  ck_assert_int_eq(tn_fuse_graph(g, TN_FUSE_ROWS, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  const tn_fgroup *grp = tn_fusion_group(f, 0);
  ck_assert_uint_eq(grp->fg_nnodes, 3);
  ck_assert_int_eq(grp->fg_reduce_dims, 0);
  ck_assert_uint_eq(grp->fg_ninputs, 2);
  ck_assert_uint_eq(grp->fg_noutputs, 1);
  ck_assert_int_eq(grp->fg_inputs[0], x);
  ck_assert_int_eq(grp->fg_inputs[1], y);
  ck_assert_int_eq(grp->fg_outputs[0], o);
  ck_assert_int_eq(grp->fg_odtypes[0], TN_DTYPE_FLOAT32);
  ck_assert_int_eq(grp->fg_odtypes[1], TN_DTYPE_FLOAT32);
  ck_assert_int_eq(grp->fg_odtypes[2], TN_DTYPE_INT32);
  kfn fn = compile_group(grp, &u);

  static const float xp[8] = {0.5f, 0.51f, 2.7f, -3.0f, NAN, 3e9f, 70000.7f, INFINITY};
  static const float yp[10] = {-1.5f, 3e9f, -129.9f, 70000.7f, NAN, -INFINITY, 0.0f, -0.99f, 1e20f, 42.9f};
  float xs[R * C], ys[C];
  int32_t out[R * C];
  for (int i = 0; i < R * C; i++)
    xs[i] = xp[(i * 3) % 8] * (i % 5 == 4 ? -1.0f : 1.0f);
  for (int j = 0; j < C; j++)
    ys[j] = yp[j % 10];
  memset(out, 0x5a, sizeof out);
  int64_t sizes[2] = {R, C};
  int64_t st[6] = {C, 1, /* y */ 0, 1, /* o */ C, 1};
  void *ptrs[3] = {xs, ys, out};
  fn(2, sizes, ptrs, st, 1, NULL);
  for (int i = 0; i < R; i++)
    for (int j = 0; j < C; j++) {
      float xv = xs[i * C + j];
      double v = xv > 0.5f ? xv : ys[j];
      /* float -> int32 as eager: truncation, INT32_MIN for NaN and out of range */
      int32_t want = v == v && v > -2147483649.0 && v < 2147483648.0 ? (int32_t)v : INT32_MIN;
      ck_assert_msg(out[i * C + j] == want, "(%d, %d): x %g y %g: got %d, want %d", i, j, xv, ys[j],
                    out[i * C + j], want);
    }
  tn_tcc_free(u);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

/* -- Gathers, cycles, permuted outputs, mixed dtypes ----------------------- */

static const tn_arg NONE_ARG = {TN_ARG_NONE, 0, {0}};
static tn_arg B(int v) { tn_arg a = {TN_ARG_BOOL, 0, {.ar_int = v}}; return a; }

/* The group holding node id nd, or -1. */
static int group_of_node(const tn_fusion *f, int32_t nd)
{
  for (uint32_t k = 0; k < tn_fusion_count(f); k++) {
    const tn_fgroup *grp = tn_fusion_group(f, k);
    for (uint32_t i = 0; i < grp->fg_nnodes; i++)
      if (grp->fg_nodes[i] == nd)
        return (int)k;
  }
  return -1;
}

/* The node that produces value v. */
static int32_t node_of(const tn_graph *g, int32_t v)
{
  return tn_graph_value(g, v)->va_node;
}

/* W[6,4] float32, ids[3] int64, bias[4] float32: e = embedding(W, ids);
** m = e * 2; a = m + bias. One group: the table and its index are operands
** 0 and 1 (a gather), bias operand 2. Run with the ABI of codegen.h. */
START_TEST(test_gather_embedding_group)
{
  static const tn_sint WS[2] = {{6, -1}, {4, -1}}, WST[2] = {{4, -1}, {1, -1}};
  static const tn_sint IS[1] = {{3, -1}}, IST[1] = {{1, -1}};
  static const tn_sint BS[1] = {{4, -1}}, BST[1] = {{1, -1}};
  static const tn_sint OS[2] = {{3, -1}, {4, -1}}, OST[2] = {{4, -1}, {1, -1}};
  tn_meta mw = {TN_DTYPE_FLOAT32, 2, WS, WST}, mi = {TN_DTYPE_INT64, 1, IS, IST};
  tn_meta mb = {TN_DTYPE_FLOAT32, 1, BS, BST}, mo = {TN_DTYPE_FLOAT32, 2, OS, OST};
  tn_graph *g;
  tn_fusion *f;
  tn_tcc_unit *u;
  int32_t w, ids, bias, e, m, a;
  init_tcc();
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc iw = {TN_VALUE_ARG, 0, NULL, mw}, ii = {TN_VALUE_ARG, 1, NULL, mi}, ib = {TN_VALUE_ARG, 2, NULL, mb};
  ck_assert_int_eq(tn_graph_add_input(g, &iw, &w), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &ii, &ids), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &ib, &bias), TN_OK);
  tn_arg ae[5] = {T(w), T(ids), I(-1), B(0), B(0)};
  ck_assert_msg(tn_graph_add_node(g, TN_OP_embedding, NULL, ae, 5, &mo, 1, &e) == TN_OK, "%s", tn_graph_errmsg(g));
  tn_arg am[2] = {T(e), F(2.0)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &mo, 1, &m), TN_OK);
  tn_arg aa[3] = {T(m), T(bias), I(1)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, aa, 3, &mo, 1, &a), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &a, 1), TN_OK);

  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  const tn_fgroup *grp = tn_fusion_group(f, 0);
  ck_assert_uint_eq(grp->fg_nnodes, 3);
  ck_assert_int_eq(grp->fg_reduce_dims, 0);
  ck_assert_uint_eq(grp->fg_ninputs, 3);
  ck_assert_uint_eq(grp->fg_noutputs, 1);
  ck_assert_int_eq(grp->fg_inputs[0], w);
  ck_assert_int_eq(grp->fg_inputs[1], ids);
  ck_assert_int_eq(grp->fg_inputs[2], bias);
  ck_assert_int_eq(grp->fg_outputs[0], a);
  ck_assert_int_eq(grp->fg_gather[0], 1);
  ck_assert_int_eq(grp->fg_gather[1], TN_FG_INDEX);
  ck_assert_int_eq(grp->fg_gather[2], -1);
  ck_assert_int_eq(grp->fg_odtypes[0], TN_DTYPE_FLOAT32);
  ck_assert_int_eq(grp->fg_odtypes[1], TN_DTYPE_INT64);
  ck_assert_int_eq(grp->fg_odtypes[2], TN_DTYPE_FLOAT32);
  ck_assert_int_eq(grp->fg_odtypes[3], TN_DTYPE_FLOAT32);
  kfn fn = compile_group(grp, &u);

  float W[24], bv[4], out[12];
  int64_t iv[3] = {5, 0, 3};
  for (int r = 0; r < 6; r++)
    for (int c = 0; c < 4; c++)
      W[r * 4 + c] = (float)(r * 10 + c) + 0.25f * (float)c - 7.5f;
  for (int c = 0; c < 4; c++)
    bv[c] = 0.5f - (float)c * 1.75f;
  memset(out, 0x5a, sizeof out);
  /* iteration space [3, 4] (index sizes + row sizes); the table 0 over the
  ** index dim, the index 0 over the row dim; cstrides[0] the table's row stride */
  int64_t sizes[2] = {3, 4};
  int64_t st[8] = {/* W */ 0, 1, /* ids */ 1, 0, /* bias */ 0, 1, /* a */ 4, 1};
  int64_t cst[4] = {4, 0, 0, 0};
  void *ptrs[4] = {W, iv, bv, out};
  fn(2, sizes, ptrs, st, 0, cst);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) {
      float want = W[iv[i] * 4 + j] * 2.0f + bv[j];
      ck_assert_msg(out[i * 4 + j] == want, "a[%d][%d] (ids %lld): got %g, want %g", i, j, (long long)iv[i],
                    out[i * 4 + j], want);
    }
  tn_tcc_free(u);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

/* x[3,5] float32, idx[3,2] int64: g = gather(x, 1, idx); a = g * 2 + 1.
** One group; the table's operand records dim 1, and the kernel reads each
** element at the column its index names (table stride 0 along dim 1, the
** column stride in cst). */
START_TEST(test_element_gather_group)
{
  static const tn_sint XS[2] = {{3, -1}, {5, -1}}, XST[2] = {{5, -1}, {1, -1}};
  static const tn_sint IS[2] = {{3, -1}, {2, -1}}, IST[2] = {{2, -1}, {1, -1}};
  tn_meta mx = {TN_DTYPE_FLOAT32, 2, XS, XST}, mi = {TN_DTYPE_INT64, 2, IS, IST};
  tn_meta mo = {TN_DTYPE_FLOAT32, 2, IS, IST};
  tn_graph *g;
  tn_fusion *f;
  tn_tcc_unit *u;
  int32_t x, idx, ga, m, a;
  init_tcc();
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, mx}, ii = {TN_VALUE_ARG, 1, NULL, mi};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &ii, &idx), TN_OK);
  tn_arg ag[4] = {T(x), I(-1), T(idx), B(0)};
  ck_assert_msg(tn_graph_add_node(g, TN_OP_gather, NULL, ag, 4, &mo, 1, &ga) == TN_OK, "%s", tn_graph_errmsg(g));
  tn_arg am[2] = {T(ga), F(2.0)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &mo, 1, &m), TN_OK);
  tn_arg aa[3] = {T(m), F(1.0), F(1.0)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Scalar, NULL, aa, 3, &mo, 1, &a), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &a, 1), TN_OK);

  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  const tn_fgroup *grp = tn_fusion_group(f, 0);
  ck_assert_uint_eq(grp->fg_nnodes, 3);
  ck_assert_uint_eq(grp->fg_ninputs, 2);
  ck_assert_int_eq(grp->fg_gather[0], 1);
  ck_assert_int_eq(grp->fg_gather[1], TN_FG_INDEX);
  ck_assert_int_eq(grp->fg_gather_dim[0], 1); /* dim -1 of a rank-2 table */
  ck_assert_int_eq(grp->fg_gather_dim[1], -1);
  kfn fn = compile_group(grp, &u);

  float X[15], out[6];
  int64_t iv[6] = {4, 0, 2, 2, 1, 3};
  for (int e = 0; e < 15; e++)
    X[e] = (float)e * 1.5f - 4.0f;
  memset(out, 0x5a, sizeof out);
  int64_t sizes[2] = {3, 2};
  int64_t st[6] = {/* x */ 5, 0, /* idx */ 2, 1, /* a */ 2, 1};
  int64_t cst[3] = {1, 0, 0};
  void *ptrs[3] = {X, iv, out};
  fn(2, sizes, ptrs, st, 0, cst);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) {
      float want = X[i * 5 + iv[i * 2 + j]] * 2.0f + 1.0f;
      ck_assert_msg(out[i * 2 + j] == want, "a[%d][%d]: got %g, want %g", i, j, out[i * 2 + j], want);
    }
  tn_tcc_free(u);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

/* x[3,4], idx[3] int64: t = x * 2; s = index_select(t, 0, idx); u = s + x.
** The gather's table t is computed by the graph: t and s must not share a
** group (a kernel picks rows of a tensor it is given). */
START_TEST(test_gather_table_not_computed_in_group)
{
  static const tn_sint XS[2] = {{3, -1}, {4, -1}}, XST[2] = {{4, -1}, {1, -1}};
  static const tn_sint IS[1] = {{3, -1}}, IST[1] = {{1, -1}};
  tn_meta mx = {TN_DTYPE_FLOAT32, 2, XS, XST}, mi = {TN_DTYPE_INT64, 1, IS, IST};
  for (int variant = 0; variant < 2; variant++) {
    tn_graph *g;
    tn_fusion *f;
    int32_t x, idx, t, s, uu;
    ck_assert_int_eq(tn_graph_new(&g), TN_OK);
    tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, mx}, ii = {TN_VALUE_ARG, 1, NULL, mi};
    ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
    ck_assert_int_eq(tn_graph_add_input(g, &ii, &idx), TN_OK);
    tn_arg am[2] = {T(x), F(2.0)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &mx, 1, &t), TN_OK);
    tn_arg as[3] = {T(t), I(0), T(idx)};
    ck_assert_msg(tn_graph_add_node(g, TN_OP_index_select, NULL, as, 3, &mx, 1, &s) == TN_OK, "%s",
                  tn_graph_errmsg(g));
    /* variant 1: u = s + t also reads the table as a plain operand */
    tn_arg aa[3] = {T(s), T(variant ? t : x), I(1)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, aa, 3, &mx, 1, &uu), TN_OK);
    ck_assert_int_eq(tn_graph_set_outputs(g, &uu, 1), TN_OK);

    ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
    int gt = group_of_node(f, node_of(g, t)), gs = group_of_node(f, node_of(g, s));
    ck_assert_msg(gt < 0 || gt != gs, "variant %d: t and its gather s in group %d", variant, gt);
    for (uint32_t k = 0; k < tn_fusion_count(f); k++) {
      const tn_fgroup *grp = tn_fusion_group(f, k);
      for (uint32_t i = 0; i < grp->fg_ninputs; i++) /* a gathered table is an input of the group */
        if (grp->fg_gather[i] >= 0) {
          int32_t p = node_of(g, grp->fg_inputs[i]);
          ck_assert(p < 0 || group_of_node(f, p) != (int)k);
        }
    }
    tn_fusion_free(f);
    tn_graph_free(g);
  }
}
END_TEST

/* Adds a fallback aten::cumsum(src, 0) of meta m; returns its value. */
static int32_t add_cumsum(tn_graph *g, int32_t src, const tn_meta *m)
{
  int32_t v;
  tn_arg acs[3] = {T(src), I(0), NONE_ARG};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_fallback, "aten::cumsum", acs, 3, m, 1, &v), TN_OK);
  return v;
}

/* x[4,5]: a = x * 2; b = cumsum(a) (eager); c = a + b; d = -c. c reads b,
** which depends on a: a and c in one kernel would need the kernel's own
** result first. Positive case: q = cumsum(y) does not depend on p = x * 2,
** so r = p + q joins p's group (q may run before the kernel). */
START_TEST(test_cycle_rule)
{
  tn_meta f2 = {TN_DTYPE_FLOAT32, 2, S2, ST2};
  tn_graph *g;
  tn_fusion *f;
  int32_t x, y, a, b, c, d, p, q, r;

  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, f2};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  tn_arg am[2] = {T(x), F(2.0)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &f2, 1, &a), TN_OK);
  b = add_cumsum(g, a, &f2);
  tn_arg ac[3] = {T(a), T(b), I(1)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, ac, 3, &f2, 1, &c), TN_OK);
  tn_arg an[1] = {T(c)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_neg, NULL, an, 1, &f2, 1, &d), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &d, 1), TN_OK);
  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  int ga = group_of_node(f, node_of(g, a)), gc = group_of_node(f, node_of(g, c));
  ck_assert_msg(ga < 0 || ga != gc, "a and c (which reads cumsum(a)) in group %d", ga);
  ck_assert_int_eq(group_of_node(f, node_of(g, b)), -1);
  ck_assert_int_ge(gc, 0); /* c and d still fuse */
  ck_assert_int_eq(group_of_node(f, node_of(g, d)), gc);
  tn_fusion_free(f);
  tn_graph_free(g);

  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc iy = {TN_VALUE_ARG, 1, NULL, f2};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &iy, &y), TN_OK);
  tn_arg ap[2] = {T(x), F(2.0)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, ap, 2, &f2, 1, &p), TN_OK);
  q = add_cumsum(g, y, &f2);
  tn_arg ar[3] = {T(p), T(q), I(1)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, ar, 3, &f2, 1, &r), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &r, 1), TN_OK);
  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  int gp = group_of_node(f, node_of(g, p)), gr = group_of_node(f, node_of(g, r));
  ck_assert_msg(gp >= 0 && gp == gr, "p in group %d, r in group %d: want one group", gp, gr);
  const tn_fgroup *grp = tn_fusion_group(f, (uint32_t)gp);
  ck_assert_uint_eq(grp->fg_nnodes, 2);
  ck_assert_uint_eq(grp->fg_ninputs, 2);
  ck_assert_int_eq(grp->fg_inputs[0], x);
  ck_assert_int_eq(grp->fg_inputs[1], q);
  ck_assert_int_eq(grp->fg_outputs[0], r);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

/* x[4,5]: a = exp(x); u = a * 3 (group 1, outputs a and u); w = cumsum(u)
** (eager); c = a + w; d = c * 0.5 (group 2: reads a last). Group 2's output
** d may take a's buffer (fg_donor); with a also a graph output, it may not. */
START_TEST(test_donor_is_the_input_at_its_last_use)
{
  tn_meta f2 = {TN_DTYPE_FLOAT32, 2, S2, ST2};
  for (int escape = 0; escape < 2; escape++) {
    tn_graph *g;
    tn_fusion *f;
    int32_t x, a, u, w, c, d;
    ck_assert_int_eq(tn_graph_new(&g), TN_OK);
    tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, f2};
    ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
    tn_arg ae[1] = {T(x)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_exp, NULL, ae, 1, &f2, 1, &a), TN_OK);
    tn_arg au[2] = {T(a), F(3.0)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, au, 2, &f2, 1, &u), TN_OK);
    w = add_cumsum(g, u, &f2);
    tn_arg ac[3] = {T(a), T(w), I(1)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Tensor, NULL, ac, 3, &f2, 1, &c), TN_OK);
    tn_arg ad[2] = {T(c), F(0.5)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, ad, 2, &f2, 1, &d), TN_OK);
    int32_t outs[2] = {d, a};
    ck_assert_int_eq(tn_graph_set_outputs(g, outs, escape ? 2 : 1), TN_OK);
    ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
    int g1 = group_of_node(f, node_of(g, a)), g2 = group_of_node(f, node_of(g, d));
    ck_assert_msg(g1 >= 0 && g2 >= 0 && g1 != g2, "groups %d and %d", g1, g2);
    const tn_fgroup *first = tn_fusion_group(f, (uint32_t)g1), *second = tn_fusion_group(f, (uint32_t)g2);
    for (uint32_t o = 0; o < first->fg_noutputs; o++)
      ck_assert_int_eq(first->fg_donor[o], -1); /* x is a graph input: never a donor */
    ck_assert_uint_eq(second->fg_noutputs, 1);
    int ai = -1;
    for (uint32_t i = 0; i < second->fg_ninputs; i++)
      if (second->fg_inputs[i] == a)
        ai = (int)i;
    ck_assert_int_ge(ai, 0);
    ck_assert_int_eq(second->fg_donor[0], escape ? -1 : ai);
    tn_fusion_free(f);
    tn_graph_free(g);
  }
}
END_TEST

/* y[4,3], x[4,5]: a = exp(x), b = sin(x) * 2, c = cat([y, e, a, b], dim)
** with e an empty [4,0] input: a's one-node group is kept for its cat
** slot (offset 3 along dim 1: the empty part takes no room), b's group
** fills the slice from 8. With a read twice by the cat, or a cat over
** dim -1 of a result of another rank, there is no slot (and a's group
** goes). */
START_TEST(test_cat_slots)
{
  static const tn_sint SY[2] = {{4, -1}, {3, -1}}, STY[2] = {{3, -1}, {1, -1}};
  static const tn_sint SE[2] = {{4, -1}, {0, -1}}, STE[2] = {{1, -1}, {1, -1}};
  static const tn_sint SC[2] = {{4, -1}, {13, -1}}, STC[2] = {{13, -1}, {1, -1}};
  static const tn_sint SD[2] = {{4, -1}, {18, -1}}, STD[2] = {{18, -1}, {1, -1}};
  tn_meta f2 = {TN_DTYPE_FLOAT32, 2, S2, ST2}, fy = {TN_DTYPE_FLOAT32, 2, SY, STY};
  tn_meta fe = {TN_DTYPE_FLOAT32, 2, SE, STE}, fc = {TN_DTYPE_FLOAT32, 2, SC, STC};
  tn_meta fd = {TN_DTYPE_FLOAT32, 2, SD, STD};
  for (int twice = 0; twice < 2; twice++) {
    tn_graph *g;
    tn_fusion *f;
    int32_t y, e, x, a, sb, b, c;
    ck_assert_int_eq(tn_graph_new(&g), TN_OK);
    tn_input_desc iy = {TN_VALUE_ARG, 0, NULL, fy}, ie = {TN_VALUE_ARG, 1, NULL, fe}, ix = {TN_VALUE_ARG, 2, NULL, f2};
    ck_assert_int_eq(tn_graph_add_input(g, &iy, &y), TN_OK);
    ck_assert_int_eq(tn_graph_add_input(g, &ie, &e), TN_OK);
    ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
    tn_arg ax[1] = {T(x)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_exp, NULL, ax, 1, &f2, 1, &a), TN_OK);
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_sin, NULL, ax, 1, &f2, 1, &sb), TN_OK);
    tn_arg am[2] = {T(sb), F(2.0)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &f2, 1, &b), TN_OK);
    int32_t parts[5] = {y, e, a, b, a};
    tn_arg ac[2] = {{TN_ARG_TENSOR_LIST, twice ? 5 : 4, {.ar_refs = parts}}, I(1)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_cat, NULL, ac, 2, twice ? &fd : &fc, 1, &c), TN_OK);
    ck_assert_int_eq(tn_graph_set_outputs(g, &c, 1), TN_OK);
    ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
    int ga = group_of_node(f, node_of(g, a)), gb = group_of_node(f, node_of(g, b));
    ck_assert_int_ge(gb, 0);
    const tn_fgroup *bg = tn_fusion_group(f, (uint32_t)gb);
    ck_assert_uint_eq(bg->fg_noutputs, 1);
    ck_assert_int_eq(bg->fg_into_cat[0], c);
    ck_assert_int_eq(bg->fg_into_dim[0], 1);
    ck_assert_int_eq(bg->fg_into_off[0], 8);
    ck_assert_int_eq(bg->fg_donor[0], -1);
    if (twice) {
      ck_assert_int_eq(ga, -1); /* a single node without a slot: left to eager */
    } else {
      ck_assert_int_ge(ga, 0);
      const tn_fgroup *ag = tn_fusion_group(f, (uint32_t)ga);
      ck_assert_int_eq(ag->fg_into_cat[0], c);
      ck_assert_int_eq(ag->fg_into_dim[0], 1);
      ck_assert_int_eq(ag->fg_into_off[0], 3);
    }
    tn_fusion_free(f);
    tn_graph_free(g);
  }
}
END_TEST

/* x[4,5] with strides (1, 4) (a transpose): a = x * 2, b = a + 1, both
** results laid out as x. Densely permuted: one group. Not dense (strides
** (10, 2)): no group. */
START_TEST(test_permuted_output)
{
  static const tn_sint PST[2] = {{1, -1}, {4, -1}}, GST[2] = {{10, -1}, {2, -1}};
  tn_meta pm = {TN_DTYPE_FLOAT32, 2, S2, PST}, cm = {TN_DTYPE_FLOAT32, 2, S2, ST2};
  tn_meta gm = {TN_DTYPE_FLOAT32, 2, S2, GST};
  tn_tcc_unit *u;
  init_tcc();
  ck_assert_int_eq(tn_fuse_contiguous(&pm), 0);
  ck_assert_int_eq(tn_fuse_contiguous(&cm), 1);
  ck_assert_int_eq(tn_fuse_contiguous(&gm), 0);
  for (int dense = 1; dense >= 0; dense--) {
    const tn_meta *m = dense ? &pm : &gm;
    tn_graph *g;
    tn_fusion *f;
    int32_t x, a, b;
    ck_assert_int_eq(tn_graph_new(&g), TN_OK);
    tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, *m};
    ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
    tn_arg am[2] = {T(x), F(2.0)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, m, 1, &a), TN_OK);
    tn_arg ab[3] = {T(a), F(1.0), I(1)};
    ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Scalar, NULL, ab, 3, m, 1, &b), TN_OK);
    ck_assert_int_eq(tn_graph_set_outputs(g, &b, 1), TN_OK);
    ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
    if (!dense) {
      ck_assert_uint_eq(tn_fusion_count(f), 0);
    } else {
      ck_assert_uint_eq(tn_fusion_count(f), 1);
      const tn_fgroup *grp = tn_fusion_group(f, 0);
      ck_assert_uint_eq(grp->fg_nnodes, 2);
      ck_assert_int_eq(grp->fg_outputs[0], b);
      ck_assert_int_eq(tn_fuse_contiguous(&tn_graph_value(g, b)->va_meta), 0);
      /* run: the caller gives the output in its permuted layout */
      kfn fn = compile_group(grp, &u);
      float xs[20], out[20];
      for (int i = 0; i < 20; i++)
        xs[i] = (float)i * 0.3f - 2.0f;
      memset(out, 0x5a, sizeof out);
      int64_t sizes[2] = {4, 5}, st[4] = {1, 4, 1, 4};
      void *ptrs[2] = {xs, out};
      fn(2, sizes, ptrs, st, 0, NULL);
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
          ck_assert_float_eq(out[j * 4 + i], xs[j * 4 + i] * 2.0f + 1.0f);
      tn_tcc_free(u);
    }
    tn_fusion_free(f);
    tn_graph_free(g);
  }
}
END_TEST

/* A dynamic variant's transposed head: (B, H=4, S, D=64) over (B, S, H, D),
** strides (256*s, 64, 256, 1), with B = s0 and S = s1. Dense in the order
** D, H, S, B: places (3, 1, 2, 0). A dim of size 1 (whose traced stride
** need not be eager's), strides that need a product of two symbols, or
** that leave a gap, are no order; contiguous and concrete layouts are not
** this kind. */
START_TEST(test_symbolic_dense_order)
{
  static const tn_sint SZ[4] = {{0, 0}, {4, -1}, {0, 1}, {64, -1}};
  static const tn_sint ST[4] = {{256, 1}, {64, -1}, {256, -1}, {1, -1}};
  /* (B, 4, 1, S, 64): a dim of size 1, its stride 256 fitting the place after H */
  static const tn_sint SZ1[5] = {{0, 0}, {4, -1}, {1, -1}, {0, 1}, {64, -1}};
  static const tn_sint ST1[5] = {{256, 1}, {64, -1}, {256, -1}, {256, -1}, {1, -1}};
  static const tn_sint BAD1[5] = {{256, 1}, {64, -1}, {7, -1}, {256, -1}, {1, -1}}; /* a stride no place has */
  static const tn_sint SZ2[3] = {{0, 0}, {0, 1}, {0, 2}}, ST2S[3] = {{0, 3}, {1, -1}, {0, 1}}; /* (s0, s1, s2) */
  static const tn_sint GAP[4] = {{512, 1}, {64, -1}, {512, -1}, {1, -1}};
  static const tn_sint CST[4] = {{768, -1}, {64, -1}, {256, -1}, {1, -1}};
  static const tn_sint CSZ[4] = {{2, -1}, {4, -1}, {3, -1}, {64, -1}};
  tn_meta m = {TN_DTYPE_FLOAT32, 4, SZ, ST}, m1 = {TN_DTYPE_FLOAT32, 5, SZ1, ST1};
  tn_meta bad1 = {TN_DTYPE_FLOAT32, 5, SZ1, BAD1}, two = {TN_DTYPE_FLOAT32, 3, SZ2, ST2S};
  tn_meta gap = {TN_DTYPE_FLOAT32, 4, SZ, GAP}, concrete = {TN_DTYPE_FLOAT32, 4, CSZ, CST};
  int8_t pos[5] = {-1, -1, -1, -1, -1};
  ck_assert_int_eq(tn_fuse_dense_order(&m, pos), 1);
  ck_assert_int_eq(pos[0], 3);
  ck_assert_int_eq(pos[1], 1);
  ck_assert_int_eq(pos[2], 2);
  ck_assert_int_eq(pos[3], 0);
  ck_assert_int_eq(tn_fuse_dense_order(&m1, pos), 0);
  ck_assert_int_eq(tn_fuse_dense_order(&bad1, pos), 0);
  /* (s0, s1, s2) with strides (s3, 1, s1): dim 0 would need s1 * s2 */
  ck_assert_int_eq(tn_fuse_dense_order(&two, pos), 0);
  ck_assert_int_eq(tn_fuse_dense_order(&gap, pos), 0);
  ck_assert_int_eq(tn_fuse_dense_order(&concrete, pos), 0); /* concrete: its strides are passed as they are */

  /* a graph: y = x * 2 + 1 with x in that layout is one group */
  tn_graph *g;
  tn_fusion *f;
  int32_t x, a, b, s0, s1;
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  ck_assert_int_eq(tn_graph_add_symbol(g, &s0), TN_OK);
  ck_assert_int_eq(tn_graph_add_symbol(g, &s1), TN_OK);
  ck_assert_int_eq(s0, 0);
  ck_assert_int_eq(s1, 1);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, m};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  tn_arg am[2] = {T(x), F(2.0)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_mul_Scalar, NULL, am, 2, &m, 1, &a), TN_OK);
  tn_arg ab[3] = {T(a), F(1.0), I(1)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_add_Scalar, NULL, ab, 3, &m, 1, &b), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &b, 1), TN_OK);
  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  ck_assert_uint_eq(tn_fusion_group(f, 0)->fg_nnodes, 2);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

/* x int32[8], y, y2 float32[8]: c = x > 3; w = where(c, y, y2);
** o = w.to(int16). One group over three dtypes: x loads as int32 values in
** int64 blocks, the comparison is an integer one, the cast float32 ->
** int16 truncates and wraps as eager (NaN, inf and out of int32: 0). */
START_TEST(test_mixed_dtype_group)
{
  enum { N = 8 };
  static const tn_sint VS[1] = {{N, -1}}, VST[1] = {{1, -1}};
  tn_meta mx = {TN_DTYPE_INT32, 1, VS, VST}, mf = {TN_DTYPE_FLOAT32, 1, VS, VST};
  tn_meta mc = {TN_DTYPE_BOOL, 1, VS, VST}, mo = {TN_DTYPE_INT16, 1, VS, VST};
  tn_graph *g;
  tn_fusion *f;
  tn_tcc_unit *u;
  int32_t x, y, y2, c, w, o;
  init_tcc();
  ck_assert_int_eq(tn_graph_new(&g), TN_OK);
  tn_input_desc ix = {TN_VALUE_ARG, 0, NULL, mx}, iy = {TN_VALUE_ARG, 1, NULL, mf}, iy2 = {TN_VALUE_ARG, 2, NULL, mf};
  ck_assert_int_eq(tn_graph_add_input(g, &ix, &x), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &iy, &y), TN_OK);
  ck_assert_int_eq(tn_graph_add_input(g, &iy2, &y2), TN_OK);
  tn_arg ag[2] = {T(x), I(3)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_gt_Scalar, NULL, ag, 2, &mc, 1, &c), TN_OK);
  tn_arg aw[3] = {T(c), T(y), T(y2)};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_where_self, NULL, aw, 3, &mf, 1, &w), TN_OK);
  tn_arg ac[7] = {T(w), {TN_ARG_DTYPE, 0, {.ar_int = TN_DTYPE_INT16}}, NONE_ARG, NONE_ARG, NONE_ARG, B(0), NONE_ARG};
  ck_assert_int_eq(tn_graph_add_node(g, TN_OP_to_copy, NULL, ac, 7, &mo, 1, &o), TN_OK);
  ck_assert_int_eq(tn_graph_set_outputs(g, &o, 1), TN_OK);

  ck_assert_int_eq(tn_fuse_graph(g, 0, 0, &f), TN_OK);
  ck_assert_uint_eq(tn_fusion_count(f), 1);
  const tn_fgroup *grp = tn_fusion_group(f, 0);
  ck_assert_uint_eq(grp->fg_nnodes, 3);
  ck_assert_uint_eq(grp->fg_ninputs, 3);
  ck_assert_uint_eq(grp->fg_noutputs, 1);
  ck_assert_int_eq(grp->fg_inputs[0], x);
  ck_assert_int_eq(grp->fg_inputs[1], y);
  ck_assert_int_eq(grp->fg_inputs[2], y2);
  ck_assert_int_eq(grp->fg_outputs[0], o);
  ck_assert_int_eq(grp->fg_odtypes[0], TN_DTYPE_INT32);
  ck_assert_int_eq(grp->fg_odtypes[1], TN_DTYPE_FLOAT32);
  ck_assert_int_eq(grp->fg_odtypes[2], TN_DTYPE_FLOAT32);
  ck_assert_int_eq(grp->fg_odtypes[3], TN_DTYPE_INT16);
  /* x's load: a buffer of int32 values (int64 blocks) */
  int xload = -1;
  for (uint32_t i = 0; i < grp->fg_nprog; i++)
    if (grp->fg_prog[i].fi_kind == TN_FI_LOAD && grp->fg_prog[i].fi_a == 0)
      xload = grp->fg_prog[i].fi_dst;
  ck_assert_int_ge(xload, 0);
  ck_assert_int_eq(grp->fg_bdtypes[xload], TN_DTYPE_INT32);

  char *src;
  ck_assert_int_eq(tn_codegen_kernel(grp, &src), TN_OK);
  ck_assert_msg(strstr(src, "tn_rt_compare_s_i64(") != NULL, "no integer compare in:\n%s", src);
  ck_assert_msg(strstr(src, "tn_rt_where_f32(") != NULL, "no float32 where in:\n%s", src);
  ck_assert_msg(strstr(src, "tn_rt_cast(2, 6") != NULL, "no int16 <- float32 cast in:\n%s", src);
  free(src);

  kfn fn = compile_group(grp, &u);
  static const int32_t xs[N] = {-5, 0, 3, 4, 100, 70000, 2, -70000};
  static const float ys[N] = {1.0f, 2.0f, 3.0f, 70000.7f, -129.9f, 65535.9f, 7.0f, 8.0f};
  static const float y2s[N] = {-32769.2f, NAN, 300.5f, 9.0f, 9.0f, 9.0f, 3e9f, -1.5f};
  /* x > 3 picks y at 3, 4, 5; by hand: -32769 -> 32767, NaN -> 0, 300,
  ** 70000 -> 4464, -129, 65535 -> -1, 3e9 (out of int32) -> 0, -1 */
  static const int16_t want[N] = {32767, 0, 300, 4464, -129, -1, 0, -1};
  int16_t out[N];
  memset(out, 0x5a, sizeof out);
  int64_t sizes[1] = {N}, st[4] = {1, 1, 1, 1};
  void *ptrs[4] = {(void *)xs, (void *)ys, (void *)y2s, out};
  fn(1, sizes, ptrs, st, 0, NULL);
  for (int i = 0; i < N; i++)
    ck_assert_msg(out[i] == want[i], "o[%d] (x %d, y %.9g, y2 %.9g): got %d, want %d", i, xs[i], ys[i], y2s[i],
                  out[i], want[i]);
  tn_tcc_free(u);
  tn_fusion_free(f);
  tn_graph_free(g);
}
END_TEST

int main(void)
{
  Suite *s = suite_create("fuse");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, NULL, reset_isa);
  tcase_add_test(tc, test_groups_and_outputs);
  tcase_add_test(tc, test_rows_whose_length_overflows_are_long);
  tcase_add_test(tc, test_a_group_of_more_operands_than_a_kernel_takes_is_not_made);
  tcase_add_test(tc, test_kernel_matches_reference_with_broadcast_and_strides);
  tcase_add_test(tc, test_kernel_tiles_and_rows);
  tcase_add_loop_test(tc, test_runtime_nan_rules, 0, 4);
  tcase_add_loop_test(tc, test_vector_math_accuracy, 0, 4);
  tcase_add_test(tc, test_math_specials_do_not_depend_on_the_isa);
  tcase_add_test(tc, test_pool_runs_every_part_once);
  tcase_add_test(tc, test_row_kernels);
  tcase_add_test(tc, test_rt_int_loads_widen);
  tcase_add_test(tc, test_rt_int_stores_wrap);
  tcase_add_test(tc, test_rt_int_fill_unary);
  tcase_add_test(tc, test_rt_int_binary);
  tcase_add_test(tc, test_rt_bool_load_store);
  tcase_add_test(tc, test_rt_bool_ops);
  tcase_add_test(tc, test_rt_compare);
  tcase_add_test(tc, test_rt_where);
  tcase_add_test(tc, test_rt_cast_float_to_int);
  tcase_add_test(tc, test_rt_cast_rounds_half_sources);
  tcase_add_test(tc, test_rt_half_conversions_round_to_nearest_even);
  tcase_add_test(tc, test_rt_cast_int_and_float);
  tcase_add_test(tc, test_rt_cast_bool);
  tcase_add_test(tc, test_rt_round);
  tcase_add_test(tc, test_rt_argreduce);
  tcase_add_test(tc, test_compare_where_cast_kernel);
  tcase_add_test(tc, test_gather_embedding_group);
  tcase_add_test(tc, test_element_gather_group);
  tcase_add_test(tc, test_gather_table_not_computed_in_group);
  tcase_add_test(tc, test_cycle_rule);
  tcase_add_test(tc, test_donor_is_the_input_at_its_last_use);
  tcase_add_test(tc, test_cat_slots);
  tcase_add_test(tc, test_permuted_output);
  tcase_add_test(tc, test_symbolic_dense_order);
  tcase_add_test(tc, test_mixed_dtype_group);
  suite_add_tcase(s, tc);
  return tn_check_run(s);
}
