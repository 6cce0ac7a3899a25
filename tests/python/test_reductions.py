"""Row kernels (csrc/lowering/fuse.c form_row_group / emit_row,
csrc/neuron_backend/codegen.c cg_rows_body, kernel_py.c Kernel_call):
softmax, log_softmax, layer norm, sum, mean, amax, amin, var and logsumexp
over trailing dims, with their pointwise prologue (and, for the norms, their
epilogue), compared with eager.

Every test also checks that the op really ran in a generated kernel: the
compile log ("fused N ops into one kernel: ...") names it, it is absent from
backend.fallback_ops, kernels_compiled grew and nothing fell back to eager.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import torchneuron_jit
from torchneuron_jit import _C, backend, config

pytestmark = [pytest.mark.usefixtures("fresh_backend"),
              pytest.mark.filterwarnings("ignore:var\\(\\).*degrees of freedom:UserWarning")]

inf, nan = math.inf, math.nan

# ATen overloads as the compile log and backend.fallback_ops name them
SOFTMAX = "aten._softmax.default"
LOG_SOFTMAX = "aten._log_softmax.default"
LAYER_NORM = "aten.native_layer_norm.default"
SUM = "aten.sum.default"
SUM_DIM = "aten.sum.dim_IntList"
MEAN = "aten.mean.default"
MEAN_DIM = "aten.mean.dim"
AMAX = "aten.amax.default"
AMIN = "aten.amin.default"
VAR = "aten.var.correction"
LOGSUMEXP = "aten.logsumexp.default"

# torch.testing's default tolerances (rtol, atol) per dtype
TOL = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}

@pytest.fixture(autouse=True)
def _row_kernels_on():
    """Row fusion on and the compile log on; conftest puts every setting back
    afterwards."""
    config.row_fusion = True
    config.log = "compile"


def run_both(f, *args, dynamic=None):
    """(compiled result, eager result) of f on args, without gradients."""
    with torch.no_grad():
        expected = f(*args)
        got = torch.compile(f, backend="neuron", dynamic=dynamic)(*args)
    return got, expected


def assert_matches(got, expected, ref=None, name="", slack=0.0):
    """got equals the eager result within the dtype's default tolerance
    (NaN equal to NaN, infinities equal by sign). Where they differ, and a
    float64 reference ref is given, got must be no farther from ref than
    eager is, plus that tolerance (plus slack, for sums whose rounding
    depends on the order of the additions); non-finite reference values
    must come out as eager has them."""
    assert got.shape == expected.shape, (name, got.shape, expected.shape)
    assert got.dtype == expected.dtype, (name, got.dtype, expected.dtype)
    try:
        torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"{name}: {m}")
        return
    except AssertionError:
        if ref is None:
            raise
    rtol, atol = TOL[expected.dtype]
    g, e, r = got.double(), expected.double(), ref.double()
    odd = ~torch.isfinite(r) | ~torch.isfinite(e)
    torch.testing.assert_close(g[odd], e[odd], equal_nan=True, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    bound = (e - r).abs() + atol + rtol * r.abs() + slack
    err = (g - r).abs()
    bad = (err > bound) & ~odd
    assert not bad.any(), (f"{name}: {int(bad.sum())} elements farther from the float64 reference than eager; "
                           f"worst error {float((err - bound)[bad].max())} beyond eager's")


SUMS = (SUM, SUM_DIM, MEAN, MEAN_DIM)


def sum_slack(fn, *args):
    """Room for the order of a float32 sum's additions: 4e-6 times the sum
    (or mean) of the magnitudes it adds, as fn computes it on |args|."""
    with torch.no_grad():
        return 4e-6 * fn(*(a.double().abs() if a.is_floating_point() else a for a in args))


def check_bundle(compiled, fns, *args, dynamic=None):
    """Compiles one function returning every fns[name](*args), compares each
    output with eager (and, failing that, with the float64 reference), and
    checks that every op the entries name was lowered.

    fns: name -> (function, ATen op that must run in a kernel)."""
    names = list(fns)

    def f(*a):
        return tuple(fns[n][0](*a) for n in names)

    got, expected = run_both(f, *args, dynamic=dynamic)
    with torch.no_grad():
        ref = f(*(a.double() if a.is_floating_point() else a for a in args))
    for n, g, e, r in zip(names, got, expected, ref):
        fn, op = fns[n]
        assert_matches(g, e, r, name=n, slack=sum_slack(fn, *args) if op in SUMS else 0.0)
    compiled.assert_lowered(*{fns[n][1] for n in names})
    return got, expected


def _x(shape=(6, 7, 12), dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


# -- every op, float32: keepdim, one and several trailing dims, full reductions --

def _ln(shape):
    return lambda x: F.layer_norm(x, shape)


EACH_OP = {
    "softmax": (lambda x: torch.softmax(x, -1), SOFTMAX),
    "softmax_dim2": (lambda x: torch.softmax(x, 2), SOFTMAX),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), LOG_SOFTMAX),
    "layer_norm": (_ln((12,)), LAYER_NORM),
    "layer_norm_2d": (_ln((7, 12)), LAYER_NORM),
    "sum": (lambda x: x.sum(-1), SUM_DIM),
    "sum_keepdim": (lambda x: x.sum(-1, keepdim=True), SUM_DIM),
    "sum_2": (lambda x: x.sum((-1, -2)), SUM_DIM),
    "sum_2_keepdim": (lambda x: x.sum((-2, -1), keepdim=True), SUM_DIM),
    "sum_positive_dims": (lambda x: x.sum((1, 2)), SUM_DIM),
    "sum_all": (lambda x: x.sum(), SUM_DIM),
    "sum_all_keepdim": (lambda x: x.sum((0, 1, 2), keepdim=True), SUM_DIM),
    "mean": (lambda x: x.mean(-1), MEAN_DIM),
    "mean_keepdim": (lambda x: x.mean(-1, keepdim=True), MEAN_DIM),
    "mean_2": (lambda x: x.mean((-1, -2)), MEAN_DIM),
    "mean_2_keepdim": (lambda x: x.mean((-1, -2), keepdim=True), MEAN_DIM),
    "mean_all": (lambda x: x.mean(), MEAN),
    "amax": (lambda x: x.amax(-1), AMAX),
    "amax_2_keepdim": (lambda x: x.amax((-1, -2), keepdim=True), AMAX),
    "amax_all": (lambda x: x.amax((0, 1, 2)), AMAX),
    "amin": (lambda x: x.amin(-1), AMIN),
    "amin_keepdim": (lambda x: x.amin(-1, keepdim=True), AMIN),
    "amin_2": (lambda x: x.amin((-2, -1)), AMIN),
    "var_c0": (lambda x: torch.var(x, -1, correction=0), VAR),
    "var_c1": (lambda x: torch.var(x, -1), VAR),
    "var_c2_keepdim": (lambda x: torch.var(x, -1, correction=2, keepdim=True), VAR),
    "var_2_c0_keepdim": (lambda x: torch.var(x, (-1, -2), correction=0, keepdim=True), VAR),
    "var_2_c1": (lambda x: torch.var(x, (-2, -1), correction=1), VAR),
    "var_unbiased_false": (lambda x: torch.var(x, -1, unbiased=False), VAR),
    "var_all": (lambda x: torch.var(x), VAR),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), LOGSUMEXP),
    "logsumexp_keepdim": (lambda x: torch.logsumexp(x, -1, keepdim=True), LOGSUMEXP),
    "logsumexp_2": (lambda x: torch.logsumexp(x, (-1, -2)), LOGSUMEXP),
}


@pytest.mark.parametrize("name", list(EACH_OP))
def test_each_op_float32(name, compiled):
    f, op = EACH_OP[name]
    x = _x()
    got, expected = run_both(f, x)
    torch.testing.assert_close(got, expected)
    groups = compiled.assert_lowered(op)
    assert groups == [[op]], groups  # one kernel, the op alone
    assert torchneuron_jit.stats()["fallback_nodes"] == 0


def test_layer_norm_with_weight_and_bias_and_its_statistics(compiled):
    aten = torch.ops.aten
    x, w, b = _x((5, 6, 16)), _x((6, 16), seed=1), _x((6, 16), seed=2)

    def f(x, w, b):
        y, mean, rstd = aten.native_layer_norm(x, [6, 16], w, b, 1e-3)
        return y, mean, rstd, F.layer_norm(x, (16,), w[0], b[0], eps=1e-6)

    got, expected = run_both(f, x, w, b)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert got[1].shape == (5, 1, 1)
    compiled.assert_lowered(LAYER_NORM)


@pytest.mark.parametrize("f,op", [(lambda x: x.sum(), SUM), (lambda x: x.mean(), MEAN),
                                  (lambda x: torch.var(x), VAR), (lambda x: torch.amax(x, (0, 1)), AMAX)],
                         ids=["sum", "mean", "var", "amax"])
def test_full_reductions_of_undecomposed_graphs(f, op, compiled):
    """aten.sum.default and aten.mean.default as make_fx records them (no
    decomposition), through the back end's compiler."""
    x = _x((9, 13))
    gm = make_fx(f)(x)
    assert [str(n.target) for n in gm.graph.nodes if n.op == "call_function"] == [op]
    g = backend.compile_inference(gm, [x])
    with torch.no_grad():
        got = g([x])
    torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got, f(x))
    compiled.assert_lowered(op)


@pytest.mark.parametrize("correction", [0, 0.5, 1, 2, 3])
def test_var_correction_down_to_rows_shorter_than_it(correction, compiled):
    """n <= correction: eager gives inf (sum of squares > 0) or NaN (0 / 0)."""
    xs = [_x((4, n), seed=n) for n in (1, 2, 3, 8)]
    xs[1][0] = 1.5  # a row of two equal values: 0 / 0 where correction = 2

    def f(a, b, c, d):
        return tuple(torch.var(t, -1, correction=correction) for t in (a, b, c, d)) + \
            (torch.var(d.view(4, 2, 4), (-1, -2), correction=correction, keepdim=True),)

    got, expected = run_both(f, *xs)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, equal_nan=True)
    compiled.assert_lowered(VAR)
    assert compiled.fallbacks()[VAR] == 0
    assert torchneuron_jit.stats()["kernels_compiled"] - compiled.kernels0 == 5


# -- row lengths: across the 1024-element blocks, length 1, many rows ---------

ROW_OPS = {
    "softmax": (lambda x: torch.softmax(x, -1), SOFTMAX),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), LOG_SOFTMAX),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), LOGSUMEXP),
    "amax": (lambda x: x.amax(-1), AMAX),
    "amin": (lambda x: x.amin(-1, keepdim=True), AMIN),
    "sum": (lambda x: x.sum(-1), SUM_DIM),
    "mean": (lambda x: x.mean(-1), MEAN_DIM),
    "var": (lambda x: x.var(-1), VAR),
    "layer_norm": (lambda x: F.layer_norm(x, x.shape[-1:]), LAYER_NORM),
}


@pytest.mark.parametrize("length", [1, 1023, 1024, 1025, 3000, 5000])
def test_row_lengths_across_blocks(length, compiled):
    x = _x((5, length), scale=3.0)
    if length > 1:  # extremes in the last block, where a blocked pass must still see them
        x[0, -1], x[1, -2] = 15.0, -15.0
    check_bundle(compiled, ROW_OPS, x)


def test_long_rows_of_several_dims(compiled):
    """Rows of 2 x 1500 (two blocks and a half, over two dims)."""
    x = _x((3, 2, 1500), scale=2.0)
    fns = {"sum_2": (lambda x: x.sum((-1, -2)), SUM_DIM),
           "amax_2": (lambda x: x.amax((-1, -2), keepdim=True), AMAX),
           "lse_2": (lambda x: torch.logsumexp(x, (-1, -2)), LOGSUMEXP),
           "var_2": (lambda x: x.var((-1, -2), correction=0), VAR),
           "layer_norm_2": (lambda x: F.layer_norm(x, (2, 1500)), LAYER_NORM)}
    check_bundle(compiled, fns, x)


@pytest.mark.parametrize("shape,dtype", [((512, 1024), torch.float32), ((16, 32, 1024), torch.float32),
                                         ((512, 1024), torch.float16), ((8, 70000), torch.float32)],
                         ids=["512x1024", "16x32x1024", "512x1024_f16", "8x70000"])
def test_many_rows_split_across_threads(shape, dtype, compiled):
    """Enough elements that the launch is split into parts run by the pool
    (kernel_threads above the machine's cores: the split happens on any)."""
    config.kernel_threads = 8
    x = _x(shape, dtype=dtype)
    fns = dict(ROW_OPS)
    fns["softmax_epilogue"] = (lambda x: torch.softmax(x * 0.5, -1) * 2 + 1, SOFTMAX)
    fns["sum_all"] = (lambda x: x.sum(), SUM_DIM)
    check_bundle(compiled, fns, x)


def test_transposed_rows_split_across_threads(compiled):
    """Rows whose leading dims do not coalesce: the launch is split along an
    outer dim whose stride is not rows * cols."""
    config.kernel_threads = 8
    x = _x((1024, 8, 64)).transpose(0, 1)
    fns = {k: ROW_OPS[k] for k in ("softmax", "amax", "var", "layer_norm", "logsumexp")}
    fns["ln_stats"] = (lambda x: torch.ops.aten.native_layer_norm(x, [64], None, None, 1e-5)[2], LAYER_NORM)
    check_bundle(compiled, fns, x, dynamic=False)


SHORT_OPS = dict(ROW_OPS)
SHORT_OPS.update({
    "softmax_epilogue": (lambda x: torch.softmax(x * 0.5, -1) * 2 + 1, SOFTMAX),
    "ln_stats": (lambda x: torch.ops.aten.native_layer_norm(x, x.shape[-1:], None, None, 1e-5)[1], LAYER_NORM),
    "var_c0_keepdim": (lambda x: x.var(-1, correction=0, keepdim=True), VAR),
})


@pytest.mark.parametrize("shape,kind", [
    ((1000, 7), "contiguous"), ((4097, 1), "contiguous"), ((333, 3), "contiguous"), ((64, 512), "contiguous"),
    ((64, 513), "contiguous"),
    ((37, 29, 5), "contiguous"), ((257, 4), "transposed"), ((40, 9, 6), "transposed"), ((600, 8), "sliced"),
    ((500, 6), "expanded"), ((70000, 3), "contiguous"), ((999, 10), "float16"), ((999, 10), "bfloat16"),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
def test_many_short_rows(shape, kind, compiled):
    """Many rows much shorter than a block, row counts that are no multiple
    of any power of two, and rows whose stride is not their length."""
    config.kernel_threads = 4
    if kind == "contiguous":
        x = _x(shape)
    elif kind == "transposed":  # rows of stride 1 apart, elements of stride rows
        x = _x(shape[:-2] + shape[-1:] + shape[-2:-1]).transpose(-1, -2)
    elif kind == "sliced":  # every other row, every other element
        x = _x((2 * shape[0], 2 * shape[1]))[::2, 1::2]
    elif kind == "expanded":  # rows repeat one another (row stride 0)
        x = _x(shape[1:]).expand(shape)
    else:
        x = _x(shape, dtype=getattr(torch, kind), scale=2.0)
    assert x.shape == shape
    check_bundle(compiled, SHORT_OPS, x, dynamic=False)


# -- prologue and epilogue fusion -----------------------------------------------

def test_layer_norm_of_residual_add_with_epilogue_is_one_kernel(compiled):
    x, r = _x((4, 10, 32)), _x((4, 10, 32), seed=1)
    w, b = _x((32,), seed=2), _x((32,), seed=3)

    def f(x, r, w, b):
        return F.layer_norm(x + r, (32,), w, b) * 2 + 1

    got, expected = run_both(f, x, r, w, b)
    torch.testing.assert_close(got, expected)
    groups = compiled.assert_lowered(LAYER_NORM)
    assert groups == [["aten.add.Tensor", LAYER_NORM, "aten.mul.Tensor", "aten.add.Tensor"]], groups
    st = torchneuron_jit.stats()
    assert st["kernels_compiled"] == 1 and st["fallback_nodes"] == 0, st


@pytest.mark.parametrize("mask_shape", [(16, 16), (2, 1, 1, 16), (2, 4, 16, 16)], ids=["causal", "padding", "full"])
def test_attention_softmax_with_scale_and_broadcast_mask_is_one_kernel(mask_shape, compiled):
    s = _x((2, 4, 16, 16))
    mask = torch.zeros(mask_shape)
    if mask_shape == (16, 16):
        mask = torch.triu(torch.full((16, 16), -inf), 1)
    else:
        mask[..., 11:] = -inf
        if mask_shape == (2, 1, 1, 16):
            mask[1] = -inf  # rows that are all -inf: NaN, as eager
    got, expected = run_both(lambda s, m: torch.softmax(s * 0.125 + m, -1), s, mask)
    torch.testing.assert_close(got, expected, equal_nan=True)
    groups = compiled.assert_lowered(SOFTMAX)
    assert groups == [["aten.mul.Tensor", "aten.add.Tensor", SOFTMAX]], groups


PROLOGUES = {
    "sum": (lambda x, r: (x * r + 1).sum(-1), SUM_DIM),
    "mean_2_keepdim": (lambda x, r: (x - r).abs().mean((-1, -2), keepdim=True), MEAN_DIM),
    "amax": (lambda x, r: torch.maximum(x, r).amax(-1), AMAX),
    "amin": (lambda x, r: torch.minimum(x * 2, r).amin(-1, keepdim=True), AMIN),
    "var": (lambda x, r: (x * 3 + r).var(-1, correction=0), VAR),
    "logsumexp": (lambda x, r: torch.logsumexp(x * 2 - r, -1), LOGSUMEXP),
    "log_softmax": (lambda x, r: torch.log_softmax(torch.tanh(x) + r, -1), LOG_SOFTMAX),
    "softmax": (lambda x, r: torch.softmax(x.exp() - r, -1), SOFTMAX),
}


@pytest.mark.parametrize("name", list(PROLOGUES))
def test_pointwise_prologue_runs_inside_the_row_kernel(name, compiled):
    f, op = PROLOGUES[name]
    x, r = _x((4, 10, 32)), _x((4, 10, 32), seed=1)
    got, expected = run_both(f, x, r)
    torch.testing.assert_close(got, expected)
    groups = compiled.assert_lowered(op)
    assert len(groups) == 1 and groups[0][-1] == op and len(groups[0]) >= 2, groups
    assert torchneuron_jit.stats()["fallback_nodes"] == 0


EPILOGUES = {
    "log_softmax": (lambda x, s: torch.log_softmax(x, -1) * -1 + 3, LOG_SOFTMAX, 3),
    "softmax_row_scale": (lambda x, s: torch.softmax(x, -1) * s, SOFTMAX, 2),
    "softmax_residual": (lambda x, s: (lambda h: h + torch.softmax(h, -1))(x + s), SOFTMAX, 3),
    "layer_norm_stats": (lambda x, s: (lambda y: y[0] * y[2] + y[1])(
        torch.ops.aten.native_layer_norm(x, [32], None, None, 1e-5)), LAYER_NORM, 3),
    "layer_norm_gelu": (lambda x, s: F.gelu(F.layer_norm(x, (32,)) * 1.5), LAYER_NORM, 3),
}


@pytest.mark.parametrize("name", list(EPILOGUES))
def test_pointwise_epilogue_runs_inside_the_norm_kernel(name, compiled):
    f, op, nops = EPILOGUES[name]
    x, s = _x((4, 10, 32)), _x((4, 10, 1), seed=1)
    got, expected = run_both(f, x, s)
    torch.testing.assert_close(got, expected)
    groups = compiled.assert_lowered(op)
    assert len(groups) == 1 and len(groups[0]) == nops, groups


def test_prologue_value_is_also_an_output_and_read_by_the_epilogue(compiled):
    def f(x, r):
        h = x + r
        return F.layer_norm(h, (48,)) * 2 + h, h, torch.softmax(h, -1)
    x, r = _x((3, 5, 48)), _x((3, 5, 48), seed=1)
    got, expected = run_both(f, x, r)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    compiled.assert_lowered(LAYER_NORM, SOFTMAX)


# -- strides: non-contiguous, transposed, expanded inputs; broadcast weights ----

STRIDE_OPS = {
    "softmax": (lambda x: torch.softmax(x, -1), SOFTMAX),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), LOG_SOFTMAX),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), LOGSUMEXP),
    "amax": (lambda x: x.amax(-1), AMAX),
    "amin_2": (lambda x: x.amin((-1, -2)), AMIN),
    "sum_2": (lambda x: x.sum((-1, -2)), SUM_DIM),
    "mean": (lambda x: x.mean(-1, keepdim=True), MEAN_DIM),
    "var": (lambda x: x.var(-1), VAR),
    "var_2": (lambda x: x.var((-1, -2), correction=0), VAR),
    "layer_norm": (lambda x: F.layer_norm(x, x.shape[-1:]), LAYER_NORM),
    "layer_norm_2": (lambda x: F.layer_norm(x, x.shape[-2:]), LAYER_NORM),
}


def _strided_inputs():
    base = _x((12, 10, 14))
    return {
        "transpose01": base.transpose(0, 1),
        "transpose12": base.transpose(1, 2),
        "permute": base.permute(2, 0, 1),
        "step_last": base[:, :, ::2],
        "step_middle": base[:, ::3, :],
        "offset": base[1:, 2:, 3:],
        "expand_leading": _x((10, 1, 14), seed=4).expand(10, 6, 14),
        "expand_scalar": torch.tensor(0.5).expand(4, 5, 6),
    }


@pytest.mark.parametrize("kind", list(_strided_inputs()))
def test_non_contiguous_inputs(kind, compiled):
    x = _strided_inputs()[kind]
    fns = dict(STRIDE_OPS)
    if kind == "expand_scalar":  # rows of equal values: layer norm has its own test
        del fns["layer_norm"], fns["layer_norm_2"]
    check_bundle(compiled, fns, x, dynamic=False)


def test_rows_of_equal_values_keep_var_zero_like_eager(compiled):
    x = _x((10, 6, 1), seed=4).expand(10, 6, 14)
    fns = {"var": STRIDE_OPS["var"], "var_2": STRIDE_OPS["var_2"], "amax": STRIDE_OPS["amax"],
           "softmax": STRIDE_OPS["softmax"]}
    check_bundle(compiled, fns, x, dynamic=False)


@pytest.mark.parametrize("length", [256, 1000, 4097])
def test_var_of_rows_far_from_zero_is_eagers(length, compiled):
    """Rows around 1e6 of spread 1 (raw sensor values, timestamps): x -
    mean in float32 was off by the mean's rounding, whose square, n times,
    the sum of squares took in (var 1.0673 for eager's 1.0664: eager's
    Welford runs in double)."""
    x = _x((4, length), seed=length) + 1e6
    x[3] = 1e6 + 0.5  # a row of one value: its variance stays 0, not a rounding below it
    got, expected = run_both(lambda t: (t.var(-1), t.var(-1, correction=0)), x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert (got[0][3] == 0).item()
    compiled.assert_lowered(VAR)


@pytest.mark.parametrize("kind", ["full_768_3.7", "full_768_1000.1", "expand_last"])
def test_layer_norm_of_rows_of_equal_values_is_zero_like_eager(kind, compiled):
    if kind == "expand_last":
        x = _x((10, 6, 1), seed=4).expand(10, 6, 14)
    else:
        x = torch.full((2, 768), float(kind.split("_")[-1]))
    got, expected = run_both(lambda x: F.layer_norm(x, x.shape[-1:]), x, dynamic=False)
    compiled.assert_lowered(LAYER_NORM)
    assert bool((expected == 0).all())
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_transposed_and_expanded_operands_inside_prologues(compiled):
    x, y = _x((20, 16)), _x((16, 20), seed=1)
    b = _x((16, 1), seed=2)
    fns = {"softmax_t": (lambda y, x, b: torch.softmax(y + x.t(), -1), SOFTMAX),
           "ln_t": (lambda y, x, b: F.layer_norm(y * x.t() + 1, (20,)), LAYER_NORM),
           "sum_expand": (lambda y, x, b: (y + b.expand(16, 20)).sum(-1), SUM_DIM),
           "amax_row_bcast": (lambda y, x, b: (y - b).amax(-1, keepdim=True), AMAX)}
    got, expected = run_both(lambda *a: tuple(f(*a) for f, _ in fns.values()), y, x, b)
    for n, g, e in zip(fns, got, expected):
        torch.testing.assert_close(g, e, msg=lambda m, n=n: f"{n}: {m}")
    compiled.assert_lowered(SOFTMAX, LAYER_NORM, SUM_DIM, AMAX)


def test_broadcast_weights_and_bias(compiled):
    """A layer-norm weight of stride 0 (expanded), a bias broadcast over rows
    of two dims, and epilogue operands that broadcast over rows and columns."""
    x = _x((4, 10, 32))
    w_row = _x((32,), seed=1)
    w = w_row.expand(10, 32)          # stride (0, 1): materialised for the 2-dim row
    b = _x((10, 1), seed=2).expand(10, 32)  # stride (1, 0)
    g_col, g_row = _x((32,), seed=3), _x((4, 10, 1), seed=4)

    def f(x, w, b, g_col, g_row):
        return (F.layer_norm(x, (10, 32), w, b),
                F.layer_norm(x, (32,), w[0], None) * g_col + g_row,
                torch.log_softmax(x, -1) * g_row - g_col)

    got, expected = run_both(f, x, w, b, g_col, g_row)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    groups = compiled.assert_lowered(LAYER_NORM, LOG_SOFTMAX)
    assert sum(LAYER_NORM in g for g in groups) == 2, groups


# -- NaN and infinities inside rows ------------------------------------------------

def _special_rows(dtype=torch.float32):
    x = _x((8, 9), scale=2.0)
    x[0, 3] = -inf                       # one -inf
    x[1, :] = -inf                       # all -inf
    x[2, 4] = inf                        # one +inf
    x[3, 1] = nan                        # NaN
    x[4, 2], x[4, 5] = inf, -inf         # both infinities
    x[5, 0], x[5, 1] = inf, inf          # two +inf
    x[6, :4] = -inf                      # -inf at the start, finite after
    x[7, 2], x[7, 7] = 1e30, -1e30       # huge finite values
    return x.to(dtype)


SPECIAL_OPS = {
    "softmax": (lambda x: torch.softmax(x, -1), SOFTMAX),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), LOG_SOFTMAX),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), LOGSUMEXP),
    "amax": (lambda x: x.amax(-1), AMAX),
    "amin": (lambda x: x.amin(-1), AMIN),
    "sum": (lambda x: x.sum(-1), SUM_DIM),
    "mean": (lambda x: x.mean(-1), MEAN_DIM),
    "var": (lambda x: x.var(-1), VAR),
    "layer_norm": (lambda x: F.layer_norm(x, (9,)), LAYER_NORM),
    "softmax_epilogue": (lambda x: torch.softmax(x, -1) * 2 + 1, SOFTMAX),
}


@pytest.mark.isa_parity
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_nan_and_infinities_inside_rows(dtype, compiled):
    x = _special_rows(dtype)
    if dtype != torch.float32:
        x[7] = 3.0  # 1e30 is out of float16's range
    check_bundle(compiled, SPECIAL_OPS, x)


@pytest.mark.isa_parity
def test_nan_and_infinities_in_rows_of_several_dims(compiled):
    x = _special_rows().view(8, 3, 3)
    fns = {"amax_2": (lambda x: x.amax((-1, -2)), AMAX),
           "amin_2_keepdim": (lambda x: x.amin((-1, -2), keepdim=True), AMIN),
           "logsumexp_2": (lambda x: torch.logsumexp(x, (-2, -1)), LOGSUMEXP),
           "sum_2": (lambda x: x.sum((-1, -2)), SUM_DIM),
           "softmax_t": (lambda x: torch.softmax(x.transpose(0, 1), -1), SOFTMAX)}
    check_bundle(compiled, fns, x)


@pytest.mark.isa_parity
def test_nan_in_later_blocks_of_long_rows_propagates(compiled):
    x = _x((4, 3000))
    x[0, 2500] = nan   # third block
    x[1, 1500] = nan   # second block
    x[2, 2999] = nan   # last element
    x[3, 1100:2900] = -inf
    fns = {k: ROW_OPS[k] for k in ("amax", "amin", "softmax", "logsumexp", "log_softmax", "sum", "var")}
    got, expected = check_bundle(compiled, fns, x)
    amax = dict(zip(fns, got))["amax"]
    assert torch.isnan(amax[:3]).all() and not torch.isnan(amax[3])


# -- float16 and bfloat16 ------------------------------------------------------------

HALF_OPS = dict(ROW_OPS)
HALF_OPS.update({
    "sum_all": (lambda x: x.sum(), SUM_DIM),
    "mean_all": (lambda x: x.mean(), MEAN),
    "var_c0": (lambda x: x.var(-1, correction=0), VAR),
    "layer_norm_prologue": (lambda x: F.layer_norm(x * 2 + 1, x.shape[-1:]), LAYER_NORM),
    "softmax_epilogue": (lambda x: torch.softmax(x, -1) * 2 + 1, SOFTMAX),
    "log_softmax_prologue": (lambda x: torch.log_softmax(x * 0.7 - 1, -1), LOG_SOFTMAX),
    # epilogues that read the row result rounded to the half dtype (a cast inside the row kernel)
    "softmax_rsqrt_epilogue": (lambda x: torch.softmax(x, -1).rsqrt(), SOFTMAX),
    "log_softmax_exp_epilogue": (lambda x: torch.log_softmax(x, -1).exp(), LOG_SOFTMAX),
    "layer_norm_tanh_epilogue": (lambda x: F.layer_norm(x, x.shape[-1:]).tanh(), LAYER_NORM),
})


@pytest.mark.isa_parity
@pytest.mark.parametrize("shape", [(6, 37), (4, 3000)], ids=["short", "long"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_against_eager_and_float64(dtype, shape, compiled):
    x = _x(shape, dtype=dtype, scale=2.0)
    got, _ = check_bundle(compiled, HALF_OPS, x)
    assert all(g.dtype == dtype for g in got)


@pytest.mark.isa_parity
def test_half_precision_layer_norm_with_weight_bias_and_stats(compiled):
    for dtype in (torch.float16, torch.bfloat16):
        torch._dynamo.reset()
        compiled.mark()
        x, w, b = _x((8, 64), dtype=dtype), _x((64,), dtype=dtype, seed=1), _x((64,), dtype=dtype, seed=2)
        fns = {"ln": (lambda x, w, b: F.layer_norm(x, (64,), w, b), LAYER_NORM),
               "rstd": (lambda x, w, b: torch.ops.aten.native_layer_norm(x, [64], w, b, 1e-5)[2], LAYER_NORM),
               "ln_epilogue": (lambda x, w, b: F.layer_norm(x, (64,), w, b) * 0.5 - b, LAYER_NORM)}
        check_bundle(compiled, fns, x, w, b)


# -- empty tensors --------------------------------------------------------------------

EMPTY_OPS = {
    **ROW_OPS,
    "layer_norm": (lambda x: F.layer_norm(x, (5,)), LAYER_NORM),
    "sum_all": (lambda x: x.sum(), SUM_DIM),
    "mean_all": (lambda x: x.mean(), MEAN),
}


def test_zero_rows(compiled):
    got, expected = check_bundle(compiled, EMPTY_OPS, torch.randn(0, 5))
    assert got[list(EMPTY_OPS).index("sum")].shape == (0,)


def test_zero_length_rows(compiled):
    """sum over an empty row is 0, mean and var NaN, logsumexp -inf."""
    fns = {k: EMPTY_OPS[k] for k in ("sum", "mean", "var", "logsumexp", "sum_all", "mean_all")}
    fns["sum_2"] = (lambda x: x.sum((-1, -2)), SUM_DIM)
    got, _ = check_bundle(compiled, fns, torch.randn(5, 0))
    out = dict(zip(fns, got))
    assert bool((out["sum"] == 0).all()) and out["sum"].shape == (5,)
    assert bool(torch.isnan(out["mean"]).all()) and bool(torch.isnan(out["var"]).all())
    assert bool((out["logsumexp"] == -inf).all())


def _compile_graph(f, example):
    """The back end's compiled callable of f traced (make_fx) on example: the
    kernels are shape-independent, so it can then run other shapes."""
    gm = make_fx(f)(example)
    g = backend.compile_inference(gm, [example])
    assert isinstance(g, _C.Plan)

    def call(x):
        with torch.no_grad():
            out = g([x])
        return out[0] if isinstance(out, (list, tuple)) else out

    kernels = [c for kind, c in g.steps() if kind == "kernel"]
    return call, kernels


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "sum", "mean", "logsumexp"])
def test_zero_length_rows_reach_the_kernel(name, compiled):
    """Dynamo specialises empty dims (softmax over a zero-length row is not
    lowered there), so the compiled graph of a non-empty trace is run on
    empty rows: the kernel must return what eager does."""
    f = EMPTY_OPS[name][0] if name != "layer_norm" else (lambda x: F.layer_norm(x, x.shape[-1:]))
    call, kernels = _compile_graph(f, torch.randn(3, 4))
    assert len(kernels) == 1
    for shape in [(5, 0), (0, 0), (0, 4), (2, 4), (2, 6)]:
        if name == "layer_norm" and shape[-1] != 4:
            continue  # the normalized shape is part of the traced graph
        x = torch.randn(shape)
        torch.testing.assert_close(call(x), f(x), equal_nan=True)
    compiled.assert_lowered(EMPTY_OPS[name][1])


@pytest.mark.parametrize("f,shape,op", [(lambda x: x.amax(-1), (5, 0), AMAX), (lambda x: x.amin(-1), (0, 0), AMIN),
                                        (lambda x: x.amax((-1, -2)), (3, 0, 4), AMAX)], ids=["amax", "amin", "amax_2"])
def test_amax_amin_over_an_empty_dim_raise_like_eager(f, shape, op, compiled):
    x = torch.randn(shape)
    with pytest.raises((IndexError, RuntimeError)) as eager_exc:
        f(x)
    eager_type = type(eager_exc.value)
    # through the back end, with kernels built from a non-empty trace
    example = torch.randn(tuple(s or 3 for s in shape))
    call, kernels = _compile_graph(f, example)
    torch.testing.assert_close(call(example), f(example))
    with pytest.raises(eager_type):
        call(x)
    with pytest.raises(eager_type):  # the generated kernel itself, not only the eager retry
        kernels[0](x)
    # through torch.compile: Dynamo's fake-tensor pass meets the empty dim
    # before any back end does; it must raise as with Dynamo's own "eager" back end
    with pytest.raises(Exception) as ours:
        torch.compile(f, backend="neuron")(x)
    torch._dynamo.reset()
    with pytest.raises(Exception) as dynamo_eager:
        torch.compile(f, backend="eager")(x)
    assert type(ours.value) is type(dynamo_eager.value)
    assert isinstance(ours.value, (eager_type, RuntimeError))
    compiled.assert_lowered(op)


# -- dynamic shapes ---------------------------------------------------------------------

DYN_OPS = {
    "softmax": (lambda x: torch.softmax(x, -1), SOFTMAX),
    "log_softmax_epilogue": (lambda x: torch.log_softmax(x, -1) * 2, LOG_SOFTMAX),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), LOGSUMEXP),
    "amax": (lambda x: x.amax(-1), AMAX),
    "amin_keepdim": (lambda x: x.amin(-1, keepdim=True), AMIN),
    "sum": (lambda x: x.sum(-1), SUM_DIM),
    "mean": (lambda x: x.mean(-1), MEAN_DIM),
    "mean_all": (lambda x: x.mean(), MEAN),
    "var": (lambda x: x.var(-1), VAR),
    "layer_norm_prologue": (lambda x: F.layer_norm(x * 2 + 1, x.shape[-1:]), LAYER_NORM),
    "sum_2": (lambda x: x.sum((-1, -2)), SUM_DIM),
}


def test_dynamic_shapes(compiled):
    """Sizes change (Dynamo then compiles graphs with symbolic sizes); every
    result is checked, and every graph, dynamic ones included, lowers every op."""
    names = list(DYN_OPS)

    def f(x):
        return tuple(DYN_OPS[n][0](x) for n in names)

    c = torch.compile(f, backend="neuron")
    shapes = [(4, 8), (6, 8), (6, 20), (3, 1500), (7, 3000), (5, 13)]
    for shape in shapes:
        x = _x(shape, seed=shape[1])
        with torch.no_grad():
            got, expected = c(x), f(x)
        ref = f(x.double())
        for n, g, e, r in zip(names, got, expected, ref):
            fn, op = DYN_OPS[n]
            assert_matches(g, e, r, name=f"{n} {shape}", slack=sum_slack(fn, x) if op in SUMS else 0.0)
    st = torchneuron_jit.stats()
    assert 2 <= st["graphs_compiled"] < len(shapes), st  # a dynamic graph served several sizes
    compiled.assert_lowered(*{op for _, op in DYN_OPS.values()})
    assert not any(compiled.fallbacks()[op] for _, op in DYN_OPS.values()), dict(compiled.fallbacks())


# -- modules and models ----------------------------------------------------------------------

@pytest.mark.parametrize("make,op", [
    (lambda: torch.nn.LayerNorm(32), LAYER_NORM),
    (lambda: torch.nn.LayerNorm(32, bias=False), LAYER_NORM),
    (lambda: torch.nn.LayerNorm(32, elementwise_affine=False, eps=1e-3), LAYER_NORM),
    (lambda: torch.nn.LayerNorm((10, 32)), LAYER_NORM),
    (lambda: torch.nn.Softmax(dim=-1), SOFTMAX),
    (lambda: torch.nn.LogSoftmax(dim=2), LOG_SOFTMAX),
], ids=["layer_norm", "layer_norm_no_bias", "layer_norm_plain", "layer_norm_2d", "softmax", "log_softmax"])
def test_modules(make, op, compiled):
    torch.manual_seed(0)
    m = make().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = _x((4, 10, 32))
    got, expected = run_both(m, x)
    torch.testing.assert_close(got, expected)
    compiled.assert_lowered(op)


class _AttentionBlock(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5 + mask, -1)
        return x + self.out((a @ v).transpose(1, 2).reshape(b, s, d))


def test_attention_block(compiled):
    torch.manual_seed(0)
    m = _AttentionBlock().eval()
    x = _x((2, 10, 32))
    mask = torch.triu(torch.full((10, 10), -inf), 1)
    got, expected = run_both(m, x, mask)
    torch.testing.assert_close(got, expected)
    groups = compiled.assert_lowered(LAYER_NORM, SOFTMAX)
    assert ["aten.mul.Tensor", "aten.add.Tensor", SOFTMAX] in groups, groups


def test_plain_attention(compiled):
    config.flash_attention = "off"  # the softmax between the matmuls (on, the three are one call: test_attention.py)
    q, k, v = _x((2, 4, 10, 16)), _x((2, 4, 10, 16), seed=1), _x((2, 4, 10, 16), seed=2)
    got, expected = run_both(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v, q, k, v)
    torch.testing.assert_close(got, expected)
    compiled.assert_lowered(SOFTMAX)


# -- what is not lowered ---------------------------------------------------------------------

@pytest.mark.parametrize("f,op", [
    (lambda x: torch.softmax(x, 0), SOFTMAX),
    (lambda x: torch.log_softmax(x, 1), LOG_SOFTMAX),
    (lambda x: x.sum(0), SUM_DIM),
    (lambda x: x.mean((0, 2)), MEAN_DIM),
    (lambda x: x.amax(1), AMAX),
    (lambda x: torch.var(x, 0), VAR),
    (lambda x: torch.logsumexp(x, -2), LOGSUMEXP),
    (lambda x: torch.nn.Softmax(dim=1)(x), SOFTMAX),
], ids=["softmax0", "log_softmax1", "sum0", "mean02", "amax1", "var0", "logsumexp-2", "module_softmax1"])
def test_non_trailing_dims_run_eagerly(f, op, compiled):
    x = _x((5, 6, 7))
    got, expected = run_both(f, x)
    torch.testing.assert_close(got, expected)
    assert compiled.fallbacks()[op] == 1, dict(compiled.fallbacks())
    assert op not in {o for g in compiled.groups() for o in g}
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_other_dtypes_run_eagerly_and_correctly(compiled):
    for x in (_x((4, 9), dtype=torch.float64), torch.arange(36).view(4, 9)):
        torch._dynamo.reset()
        compiled.mark()
        f = (lambda x: (torch.softmax(x, -1), x.sum(-1))) if x.is_floating_point() else (lambda x: x.sum(-1))
        got, expected = run_both(f, x)
        torch.testing.assert_close(got, expected)
        assert compiled.fallbacks()[SUM_DIM] == 1
        assert torchneuron_jit.stats()["kernels_compiled"] == 0


# -- the artifact cache ------------------------------------------------------------------------

def test_row_kernels_come_back_from_the_artifact_cache(compiled):
    def f(x, r, w, b):
        h = F.layer_norm(x + r, (24,), w, b) * 2
        return torch.softmax(h, -1), h.amax(-1), torch.var(h, -1, keepdim=True)
    args = (_x((3, 7, 24)), _x((3, 7, 24), seed=1), _x((24,), seed=2), _x((24,), seed=3))
    first, expected = run_both(f, *args)
    compiled.assert_lowered(LAYER_NORM, SOFTMAX, AMAX, VAR)
    assert torchneuron_jit.stats()["cache_misses"] == 1
    torch._dynamo.reset()
    torchneuron_jit.reset_stats()
    compiled.mark()
    again, _ = run_both(f, *args)
    st = torchneuron_jit.stats()
    assert st["cache_hits"] == 1 and st["graphs_lowered"] == 0, st
    compiled.assert_lowered(LAYER_NORM, SOFTMAX, AMAX, VAR)
    for a, b, e in zip(first, again, expected):
        torch.testing.assert_close(a, e)
        assert torch.equal(a, b)
