"""GEMM groups (csrc/lowering/fuse.c gemm_lowerable / form_gemm_group /
build_group, csrc/neuron_backend/kernel_py.c gemm_run / gemm_part / blas_layout /
Kernel_call, torchneuron_jit/backend.py _gemm_available): with
config.gemm_fusion on, a float32 aten.mm or aten.addmm (alpha = beta = 1) of
matrices is multiplied by torch's own sgemm_ and the pointwise ops that
consume the product run in one generated kernel over it.

Every test checks that the GEMM really ran in a generated kernel: the compile
log ("fused N ops into one kernel: ...") names aten.mm / aten.addmm, that op
is absent from backend.fallback_ops, kernels_compiled grew and no graph fell
back to eager. The tests of what is not lowered check the opposite.

A GEMM sums in another order than eager's, so results are compared with a
float64 reference: ours may be at most twice as far from it as eager is, plus
1e-6 of the result's magnitude (plus a sanity assert_close against eager).
"""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import torchneuron_jit
from torchneuron_jit import _C, backend, config

pytestmark = pytest.mark.usefixtures("fresh_backend")

inf, nan = math.inf, math.nan

MM = "aten.mm.default"
ADDMM = "aten.addmm.default"
ADD = "aten.add.Tensor"
MUL = "aten.mul.Tensor"
RELU = "aten.relu.default"
GELU = "aten.gelu.default"
SIGMOID = "aten.sigmoid.default"
BMM = "aten.bmm.default"
BADDBMM = "aten.baddbmm.default"
GEMMS = (MM, ADDMM, BMM, BADDBMM)
LINEAR = "aten.linear.default"  # what an eager mm/addmm of a linear layer is recomposed into
ONEDNN = "mkldnn._linear_pointwise.default"  # what a recomposed one may run as (torchneuron_jit/gemm.py)

@pytest.fixture(autouse=True)
def _gemm_on():
    """GEMM fusion and the compile log on (conftest restores every setting)."""
    assert backend._gemm_available(), "this torch exports no sgemm_: the GEMM path cannot run"
    config.gemm_fusion = True
    config.log = "compile"


def assert_gemm_eager(compiled, groups=None):
    """No mm / addmm ran in a kernel: each that ran went through PyTorch
    (as itself, or recomposed into aten.linear)."""
    groups = compiled.groups() if groups is None else groups
    assert not {op for gr in groups for op in gr} & set(GEMMS), groups
    assert sum(compiled.fallbacks()[op] for op in (*GEMMS, LINEAR, ONEDNN)) >= 1, dict(compiled.fallbacks())
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0
    return groups


def _double(a):
    return a.double() if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a


def _t(shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale


def assert_gemm_close(got, eager, ref, name=""):
    """got is as close to the float64 reference ref as eager (see the module
    doc); NaN where eager has NaN, the same infinities where eager has one."""
    assert got.shape == eager.shape, (name, got.shape, eager.shape)
    assert got.dtype == eager.dtype, (name, got.dtype, eager.dtype)
    assert torch.equal(got.isnan(), eager.isnan()), (name, "NaN masks differ", got, eager)
    einf = eager.isinf()
    assert torch.equal(got.isinf(), einf), (name, "infinity masks differ", got, eager)
    assert torch.equal(got[einf], eager[einf]), (name, "infinities of another sign")
    finite = eager.isfinite() & ref.isfinite()
    if not finite.any():
        return
    g, e, r = got.double()[finite], eager.double()[finite], ref.double()[finite]
    scale = float(r.abs().max())
    ours, eagers = float((g - r).abs().max()), float((e - r).abs().max())
    assert ours <= 2 * eagers + 1e-6 * scale, (f"{name}: max error {ours:.3g} vs float64, eager's {eagers:.3g}, "
                                               f"magnitude {scale:.3g}")
    torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4 * max(scale, 1e-30), equal_nan=True,
                               msg=lambda m: f"{name}: {m}")


def check(compiled, f, *args, ref_f=None, dynamic=None, ops=(), groups=None):
    """Compiles f, compares every output with eager and the float64
    reference (ref_f, default f, on the float32 args in float64), checks
    that ops (and at least one GEMM) ran in kernels and, when groups is
    given, that the fused groups are exactly those. Returns (got, eager)."""
    with torch.no_grad():
        eager = f(*args)
        got = torch.compile(f, backend="neuron", dynamic=dynamic)(*args)
        ref = (ref_f or f)(*map(_double, args))
    single = isinstance(eager, torch.Tensor)
    for i, (g, e, r) in enumerate(zip(*((t,) if single else t for t in (got, eager, ref)))):
        assert_gemm_close(g, e, r, name=f"output {i}")
    found = compiled.assert_lowered(*ops)
    assert {op for g in found for op in g} & set(GEMMS), f"no GEMM in a kernel: groups {found}"
    if groups is not None:  # in any order
        assert sorted(found) == sorted(groups), found
    return got, eager


# -- epilogues -----------------------------------------------------------------------------------

M, K, N = 24, 40, 48

EPILOGUES = {
    # name: (function of x (M, K), w (N, K), b (N,), y (M, N); the fused groups)
    "linear_bias": (lambda x, w, b, y: F.linear(x, w, b), [[ADDMM]]),
    "linear_relu": (lambda x, w, b, y: F.relu(F.linear(x, w, b)), [[ADDMM, RELU]]),
    "linear_gelu": (lambda x, w, b, y: F.gelu(F.linear(x, w, b)), [[ADDMM, GELU]]),
    "linear_gelu_tanh": (lambda x, w, b, y: F.gelu(F.linear(x, w, b), approximate="tanh"), [[ADDMM, GELU]]),
    "linear_sigmoid": (lambda x, w, b, y: torch.sigmoid(F.linear(x, w, b)), [[ADDMM, SIGMOID]]),
    "linear_tanh": (lambda x, w, b, y: torch.tanh(F.linear(x, w, b)), [[ADDMM, "aten.tanh.default"]]),
    "linear_silu": (lambda x, w, b, y: F.silu(F.linear(x, w, b)), [[ADDMM, "aten.silu.default"]]),
    "linear_residual": (lambda x, w, b, y: F.linear(x, w, b) + y, [[ADDMM, ADD]]),
    "linear_relu_residual": (lambda x, w, b, y: y + F.relu(F.linear(x, w, b)), [[ADDMM, RELU, ADD]]),
    "linear_scaled": (lambda x, w, b, y: F.linear(x, w, b) * 0.125, [[ADDMM, MUL]]),
    "linear_clamp": (lambda x, w, b, y: torch.clamp(F.linear(x, w, b), -0.5, 0.5),
                     [[ADDMM, "aten.clamp.default"]]),
    "mm_scale_residual": (lambda x, w, b, y: x @ w.t() * 0.5 + y, [[MM, MUL, ADD]]),
    "mm_bias_relu": (lambda x, w, b, y: torch.relu(x @ w.t() + b), [[MM, ADD, RELU]]),
    "mm_div_sub": (lambda x, w, b, y: (x @ w.t()) / 3.0 - y * 2, [[MM, "aten.div.Tensor", MUL, "aten.sub.Tensor"]]),
    "mm_gelu_mul": (lambda x, w, b, y: F.gelu(x @ w.t()) * y, [[MM, GELU, MUL]]),
}


@pytest.mark.parametrize("name", list(EPILOGUES))
def test_epilogue_runs_in_the_gemm_kernel(name, compiled):
    f, groups = EPILOGUES[name]
    x, w, b, y = _t((M, K)), _t((N, K), 1, 0.2), _t((N,), 2), _t((M, N), 3)
    check(compiled, f, x, w, b, y, ops=(ADDMM if name.startswith("linear") else MM,), groups=groups)
    assert torchneuron_jit.stats()["kernels_compiled"] - compiled.kernels0 == 1


def test_product_used_by_two_epilogues_and_returned(compiled):
    def f(x, w, y):
        h = x @ w
        return h, torch.relu(h) + y, torch.sigmoid(h) * 2

    x, w, y = _t((M, K)), _t((K, N), 1, 0.2), _t((M, N), 2)
    check(compiled, f, x, w, y, ops=(MM, RELU, SIGMOID))


def test_mlp_of_two_layers_is_two_gemm_groups(compiled):
    def f(x, w1, b1, w2, b2):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2) + x

    x = _t((16, 32))
    args = (x, _t((64, 32), 1, 0.2), _t((64,), 2), _t((32, 64), 3, 0.2), _t((32,), 4))
    check(compiled, f, *args, ops=(ADDMM, GELU, ADD), groups=[[ADDMM, GELU], [ADDMM, ADD]])
    assert torchneuron_jit.stats()["kernels_compiled"] - compiled.kernels0 == 2
    assert compiled.fallbacks()[ADDMM] == 0


def test_two_products_summed(compiled):
    """x @ w1 + x @ w2: the add joins the second product's kernel, whose
    input is the first product (a plain mm, a GEMM kernel of its own)."""
    x, w1, w2 = _t((M, K)), _t((K, N), 1, 0.2), _t((K, N), 2, 0.2)
    check(compiled, lambda x, w1, w2: torch.relu(x @ w1 + x @ w2), x, w1, w2, groups=[[MM], [MM, ADD, RELU]])
    assert compiled.fallbacks()[MM] == 0


def test_operand_also_read_by_the_epilogue(compiled):
    """The same square matrix as both factors and as the residual."""
    x = _t((32, 32), scale=0.3)
    check(compiled, lambda x: x @ x + x, x, groups=[[MM, ADD]])
    compiled.mark()
    check(compiled, lambda x, b: torch.addmm(b, x, x.t()) * x, x, _t((32,), 1), groups=[[ADDMM, MUL]])


def test_addmm_alone_and_explicit_unit_alpha_beta(compiled):
    x, w, b = _t((M, K)), _t((K, N), 1, 0.2), _t((N,), 2)
    check(compiled, lambda x, w, b: torch.addmm(b, x, w, beta=1, alpha=1.0), x, w, b, groups=[[ADDMM]])


def test_in_place_epilogue(compiled):
    def f(x, w, b):
        h = x @ w
        h += b
        h.relu_()
        return h.mul_(2)

    x, w, b = _t((M, K)), _t((K, N), 1, 0.2), _t((N,), 2)
    check(compiled, f, x, w, b, groups=[[MM, ADD, RELU, MUL]])


def test_epilogue_operand_computed_after_the_product(compiled):
    """y * 3 comes after the mm in program order: it joins the kernel too."""
    def f(x, w, y):
        h = x @ w
        y3 = y * 3
        return h + y3

    x, w, y = _t((M, K)), _t((K, N), 1, 0.2), _t((M, N), 2)
    check(compiled, f, x, w, y, groups=[[MM, MUL, ADD]])


def test_product_feeds_an_epilogue_and_the_next_gemm(compiled):
    """The raw product is both read by its kernel's epilogue and the left
    factor of the next addmm (it is written out by the first kernel)."""
    def f(x, w, b):
        h = x @ w
        return torch.relu(h), torch.addmm(b, h, w) * 2

    x, w, b = _t((M, 32)), _t((32, 32), 1, 0.2), _t((32,), 2)
    check(compiled, f, x, w, b, groups=[[MM, RELU], [ADDMM, MUL]])


def test_product_as_second_operand_with_alpha(compiled):
    x, w, y = _t((M, K)), _t((K, N), 1, 0.2), _t((M, N), 2)
    check(compiled, lambda x, w, y: torch.sub(y, x @ w, alpha=0.5), x, w, y, groups=[[MM, "aten.sub.Tensor"]])
    torch._dynamo.reset()
    compiled.mark()
    check(compiled, lambda x, w, y: torch.maximum(y, x @ w) / (x @ w).abs().add(1), x, w, y, ops=(MM,))


def test_inference_mode(compiled):
    with torch.inference_mode():
        x, w, b = _t((M, K)), _t((N, K), 1, 0.2), _t((N,), 2)
        check(compiled, lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b, groups=[[ADDMM, GELU]])


LAYER_NORM = "aten.native_layer_norm.default"
SOFTMAX = "aten._softmax.default"


@pytest.mark.parametrize("name", ["layer_norm_of_residual", "softmax_of_linear", "linear_of_layer_norm"])
def test_with_row_fusion(name, compiled):
    """Row groups form first; a GEMM next to them keeps its own kernel."""
    config.row_fusion = True
    f, groups = {
        "layer_norm_of_residual": (lambda x, w, b: F.layer_norm(F.linear(x, w, b) + x, (32,)),
                                   [[ADD, LAYER_NORM], [ADDMM]]),
        "softmax_of_linear": (lambda x, w, b: torch.softmax(F.linear(x, w, b), -1), [[SOFTMAX], [ADDMM]]),
        "linear_of_layer_norm": (lambda x, w, b: torch.relu(F.linear(F.layer_norm(x, (32,)), w, b)),
                                 [[LAYER_NORM], [ADDMM, RELU]]),
    }[name]
    x, w, b = _t((12, 32)), _t((32, 32), 1, 0.2), _t((32,), 2)
    check(compiled, f, x, w, b, ops=(ADDMM,), groups=groups)


def test_threads_calling_one_compiled_gemm(compiled, in_threads):
    def f(x, w, b):
        return F.gelu(F.linear(x, w, b)) + x

    w, b = _t((96, 96), 1, 0.1), _t((96,), 2)
    c = torch.compile(f, backend="neuron")
    x0 = _t((128, 96))
    with torch.no_grad():
        want = c(x0, w, b)
    compiled.assert_lowered(ADDMM, GELU, ADD)

    def worker(seed):
        x = _t((128, 96), seed)
        with torch.no_grad():
            expected = f(x, w, b)
            ref = f(x.double(), w.double(), b.double())
            for _ in range(10):
                assert_gemm_close(c(x, w, b), expected, ref, name=f"thread {seed}")
                assert torch.equal(c(x0, w, b), want)

    in_threads(worker)
    st = torchneuron_jit.stats()
    assert st["eager_fallbacks"] == 0 and st["kernels_compiled"] >= 1, st


# -- layouts -------------------------------------------------------------------------------------

def _layout_args(kind):
    """(x, w, b) of a product x @ w + b of 21 x 19 @ 19 x 30 in the given layout."""
    m, k, n = 21, 19, 30
    x, w, b = _t((m, k)), _t((k, n), 1, 0.3), _t((n,), 2)
    if kind == "contiguous":
        return x, w, b
    if kind == "w_transposed":          # w stored (n, k), used as w.t(): BLAS 'T'
        return x, _t((n, k), 1, 0.3).t(), b
    if kind == "x_transposed":          # x stored (k, m)
        return _t((k, m)).t(), w, b
    if kind == "both_transposed":
        return _t((k, m)).t(), _t((n, k), 1, 0.3).t(), b
    if kind == "x_column_step":         # x[:, ::2]: column stride 2, BLAS cannot read it
        return _t((m, 2 * k))[:, ::2], w, b
    if kind == "x_row_step":            # x[::2]: rows 2k apart, BLAS reads it with ld = 2k
        return _t((2 * m, k))[::2], w, b
    if kind == "w_column_slice":        # w[:, 5:5+n] of a wider matrix: ld > n
        return x, _t((k, n + 11), 1, 0.3)[:, 5:5 + n], b
    if kind == "w_transposed_column_step":  # transposed, then every other column: readable with a large ld
        return x, _t((2 * n, k), 1, 0.3).t()[:, ::2], b
    if kind == "x_transposed_row_step":  # transposed, then every other row: neither stride is 1, copied
        return _t((k, 2 * m)).t()[::2], w, b
    if kind == "w_transposed_row_step":
        return x, _t((n, 2 * k), 1, 0.3).t()[::2], b
    if kind == "x_expanded":            # rows of stride 0: copied
        return _t((1, k)).expand(m, k), w, b
    if kind == "w_expanded_columns":    # columns of stride 0
        return x, _t((k, 1), 1, 0.3).expand(k, n), b
    if kind == "x_offset_view":         # a view starting inside its storage
        return _t((m + 3, k + 4))[3:, 4:], w, b
    raise ValueError(kind)


LAYOUTS = ["contiguous", "w_transposed", "x_transposed", "both_transposed", "x_column_step", "x_row_step",
           "w_column_slice", "w_transposed_column_step", "x_transposed_row_step", "w_transposed_row_step",
           "x_expanded", "w_expanded_columns", "x_offset_view"]


@pytest.mark.parametrize("kind", LAYOUTS)
def test_operand_layouts(kind, compiled):
    x, w, b = _layout_args(kind)
    assert x.shape == (21, 19) and w.shape == (19, 30)

    def f(x, w, b):
        return torch.relu(torch.addmm(b, x, w)), torch.sigmoid(x @ w) - 0.5

    check(compiled, f, x, w, b, dynamic=False, ops=(ADDMM, MM, RELU, SIGMOID))
    assert torchneuron_jit.stats()["kernels_compiled"] - compiled.kernels0 == 2


def test_linear_with_transposed_input(compiled):
    """F.linear(x.t(), w, b): the activation is a transposed view."""
    xt, w, b = _t((40, 24)), _t((32, 40), 1, 0.2), _t((32,), 2)
    check(compiled, lambda xt, w, b: F.relu(F.linear(xt.t(), w, b)), xt, w, b, groups=[[ADDMM, RELU]])


@pytest.mark.parametrize("bias", ["vector", "row", "full", "column", "scalar", "expanded", "transposed",
                                  "expanded_column"])
def test_bias_shapes(bias, compiled):
    m, k, n = 17, 23, 29
    x, w = _t((m, k)), _t((k, n), 1, 0.3)
    b = {"vector": lambda: _t((n,), 2), "row": lambda: _t((1, n), 2), "full": lambda: _t((m, n), 2),
         "column": lambda: _t((m, 1), 2), "scalar": lambda: _t((), 2),
         "expanded": lambda: _t((n,), 2).expand(m, n), "transposed": lambda: _t((n, m), 2).t(),
         "expanded_column": lambda: _t((m, 1), 2).expand(m, n)}[bias]()
    check(compiled, lambda x, w, b: torch.relu(torch.addmm(b, x, w)) * 3, x, w, b, dynamic=False,
          groups=[[ADDMM, RELU, MUL]])


# -- shapes --------------------------------------------------------------------------------------

SHAPES = [(1, 16, 24), (24, 1, 16), (16, 24, 1), (1, 24, 1), (1, 1, 1), (37, 53, 29), (64, 128, 96),
          (3, 1000, 5), (130, 7, 260)]


@pytest.mark.parametrize("m,k,n", SHAPES, ids=lambda v: str(v))
def test_shapes(m, k, n, compiled):
    x, w, b, y = _t((m, k)), _t((n, k), 1, k ** -0.5), _t((n,), 2), _t((m, n), 3)

    def f(x, w, b, y):
        return F.gelu(F.linear(x, w, b)), x @ w.t() * 0.5 + y

    check(compiled, f, x, w, b, y, dynamic=False, ops=(ADDMM, MM, GELU))


def test_large(compiled):
    x, w, b = _t((512, 768)), _t((3072, 768), 1, 768 ** -0.5), _t((3072,), 2)
    check(compiled, lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b, groups=[[ADDMM, GELU]])


def test_large_split_across_kernel_threads(compiled):
    config.kernel_threads = 8
    x, w, y = _t((300, 200)), _t((200, 700), 1, 200 ** -0.5), _t((300, 700), 2)
    check(compiled, lambda x, w, y: torch.tanh(x @ w) + y, x, w, y, groups=[[MM, "aten.tanh.default", ADD]])


# A GEMM of more than 2M multiply-adds splits across kernel_threads: by
# rows of the result (each thread runs the epilogue over its rows as soon as
# they are done) or, for few rows, by columns (the epilogue runs afterwards).
# Part boundaries fall on multiples of 8 rows / 16 columns, so sizes that
# divide unevenly leave a short last part. (m, k, n): parts
SPLITS = {
    "rows": (256, 96, 200),             # 2 parts of 128 rows
    "rows, uneven": (250, 64, 301),     # 128 + 122
    "rows, short last": (100, 240, 300),  # 3 parts: 40 + 40 + 20
    "columns": (8, 640, 1000),          # 2 parts: 512 + 488 columns
    "columns, uneven": (33, 300, 777),  # 3 parts: 272 + 272 + 233
}


@pytest.mark.parametrize("layout", ["a b", "a^T b", "a b^T", "a^T b^T"])
@pytest.mark.parametrize("split", list(SPLITS))
def test_split_gemm_each_operand_layout(split, layout, compiled):
    """Each part reads its rows of a (or columns of b) at the right offset
    whichever way BLAS reads the operand: rows contiguous or columns."""
    config.kernel_threads = 4
    m, k, n = SPLITS[split]
    a = _t((m, k)) if layout.startswith("a b") else _t((k, m)).t()
    b = _t((k, n), 1, k ** -0.5) if not layout.endswith("b^T") else _t((n, k), 1, k ** -0.5).t()
    bias, y = _t((n,), 2), _t((m, n), 3)
    check(compiled, lambda a, b, bias, y: torch.relu(a @ b + bias) * y, a, b, bias, y, dynamic=False,
          groups=[[MM, ADD, RELU, MUL]])


def test_split_gemm_epilogue_broadcast_beyond_the_product(compiled):
    """An epilogue whose space is larger than the product (the product
    broadcast over a batch) cannot follow the product's row parts: it runs
    over the whole space afterwards."""
    config.kernel_threads = 4
    x, w, y = _t((128, 128)), _t((128, 256), 1, 128 ** -0.5), _t((3, 128, 256), 2)
    check(compiled, lambda x, w, y: torch.sigmoid(x @ w) * y, x, w, y, dynamic=False)


def test_split_gemm_dynamic_rows(compiled):
    """Row counts that change between calls of one compiled graph split
    their own way each time."""
    config.kernel_threads = 3
    w, b = _t((96, 160), 1, 96 ** -0.5), _t((160,), 2)
    f = torch.compile(lambda x, w, b: F.gelu(torch.addmm(b, x, w)), backend="neuron", dynamic=True)
    with torch.no_grad():
        for m in (64, 200, 517, 9):
            x = _t((m, 96), m)
            got, eager, ref = f(x, w, b), F.gelu(torch.addmm(b, x, w)), F.gelu(torch.addmm(b.double(), x.double(), w.double()))
            assert_gemm_close(got, eager, ref, name=f"m={m}")
    assert "aten.addmm.default" not in compiled.fallbacks()


@pytest.mark.parametrize("bias", [True, False])
def test_k_zero(bias, compiled):
    """An empty inner dimension: the product is zeros, addmm gives the bias."""
    x, w, b, y = torch.randn(6, 0), torch.randn(0, 5), _t((5,), 2), _t((6, 5), 3)
    if bias:
        f, groups = (lambda x, w, b, y: torch.addmm(b, x, w) * 2, [[ADDMM, MUL]])
    else:
        f, groups = (lambda x, w, b, y: (x @ w) + y, [[MM, ADD]])
    got, eager = check(compiled, f, x, w, b, y, dynamic=False, groups=groups)
    torch.testing.assert_close(got, (b * 2).expand(6, 5) if bias else y, rtol=0, atol=0)


def test_k_zero_with_nan_and_inf_garbage_free_output(compiled):
    """K = 0 many times over: the product must be zeros every time, not
    whatever torch.empty handed out (no NaN or garbage from reused memory)."""
    f = lambda x, w, y: torch.relu(x @ w) + y  # noqa: E731
    c = torch.compile(f, backend="neuron", dynamic=False)
    x, w, y = torch.randn(64, 0), torch.randn(0, 64), torch.zeros(64, 64)
    with torch.no_grad():
        for _ in range(5):
            torch.full((64, 64), nan)  # leave NaN in freed memory
            assert torch.equal(c(x, w, y), y)
    compiled.assert_lowered(MM, RELU)


@pytest.mark.parametrize("empty", ["m", "n", "mn", "mkn"])
def test_empty_results(empty, compiled):
    m, k, n = (0 if "m" in empty else 7), (0 if "k" in empty else 9), (0 if "n" in empty else 11)
    x, w, b, y = _t((m, k)), _t((k, n), 1), _t((n,), 2), _t((m, n), 3)

    def f(x, w, b, y):
        return torch.relu(torch.addmm(b, x, w)), x @ w - y

    got, eager = check(compiled, f, x, w, b, y, dynamic=False, ops=(ADDMM, MM))
    assert got[0].shape == got[1].shape == (m, n)


@pytest.mark.parametrize("m,k,n", [
    (0, 9, 11),
    (7, 9, 0),
    (0, 0, 0),
    (7, 0, 11), (1, 1, 1), (3, 5, 2),
], ids=lambda v: str(v))
def test_gemm_kernel_called_directly_with_other_sizes(m, k, n, compiled):
    """The kernel of a graph lowered for 7 x 9 @ 9 x 11 (its source is shape
    independent), called straight (no eager fallback around it) on other
    sizes, the empty ones included."""
    def f(x, w, b):
        return torch.relu(torch.addmm(b, x, w)) - 1

    gm = make_fx(f)(_t((7, 9)), _t((9, 11), 1), _t((11,), 2))
    guarded = backend.compile_inference(gm, [_t((7, 9)), _t((9, 11), 1), _t((11,), 2)])
    kernels = [c for kind, c in guarded.steps() if kind == "kernel"]
    assert len(kernels) == 1, guarded.dump()
    compiled.assert_lowered(ADDMM, RELU)
    args = (_t((m, k), 3), _t((k, n), 4), _t((n,), 5))
    with torch.no_grad():
        got = guarded.call(*args)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert got.shape == (m, n)
    assert_gemm_close(got, f(*args), f(*map(_double, args)))


# -- modules -------------------------------------------------------------------------------------

def _linear(k, n, seed, bias=True):
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n, bias=bias).eval()


def test_linear_module_on_3d_input(compiled):
    """nn.Linear on (B, S, K): view + addmm + view."""
    m = _linear(32, 48, 0)
    x = _t((4, 10, 32))
    got, _ = check(compiled, m, x, ref_f=copy.deepcopy(m).double(), ops=(ADDMM,))
    assert got.shape == (4, 10, 48)


def test_sequential_linear_relu_linear(compiled):
    seq = torch.nn.Sequential(_linear(32, 64, 0), torch.nn.ReLU(), _linear(64, 16, 1)).eval()
    ref = copy.deepcopy(seq).double()
    check(compiled, seq, _t((20, 32)), ref_f=ref, groups=[[ADDMM, RELU], [ADDMM]])
    torch._dynamo.reset()
    compiled.mark()
    got, _ = check(compiled, seq, _t((3, 7, 32)), ref_f=ref, ops=(ADDMM,))
    assert got.shape == (3, 7, 16)


def test_linear_without_bias_and_epilogue(compiled):
    lin = _linear(32, 40, 0, bias=False)
    ref = copy.deepcopy(lin).double()
    check(compiled, lambda x: torch.relu(lin(x)) * 2, _t((12, 32)), ref_f=lambda x: torch.relu(ref(x)) * 2,
          groups=[[MM, RELU, MUL]])


# -- non-finite values ---------------------------------------------------------------------------

def _with_specials(t, positions, values):
    t = t.clone()
    for (i, j), v in zip(positions, values):
        t[i, j] = v
    return t


@pytest.mark.parametrize("where", ["x", "w", "bias", "x_and_w"])
def test_nan_and_inf_propagate_like_eager(where, compiled):
    x, w, b, y = _t((20, 16)), _t((16, 24), 1, 0.25), _t((24,), 2), _t((20, 24), 3)
    if "x" in where:
        x = _with_specials(x, [(0, 0), (3, 5), (7, 1), (7, 2)], [nan, inf, -inf, 1e30])
    if "w" in where:
        w = _with_specials(w, [(2, 3), (4, 10), (9, 9)], [nan, inf, -inf])
    if where == "bias":
        b = b.clone()
        b[1], b[4], b[6] = nan, inf, -inf

    def f(x, w, b, y):
        return torch.relu(torch.addmm(b, x, w)), torch.sigmoid(x @ w) + y

    got, eager = check(compiled, f, x, w, b, y, dynamic=False, ops=(ADDMM, MM))
    assert eager[0].isnan().any() and got[0].isnan().any()  # the inputs did make NaN


def test_overflow_to_infinity_like_eager(compiled):
    x = torch.full((4, 8), 1e20)
    w = torch.full((8, 4), 1e20)
    w[:, 1] = -1e20
    check(compiled, lambda x, w: (x @ w) * 0.5 + 1, x, w, dynamic=False, groups=[[MM, MUL, ADD]])


# -- what stays eager ----------------------------------------------------------------------------

def test_gemm_fusion_off_by_default_keeps_gemm_eager(compiled):
    row = {s.name: s for s in config.table()}["gemm_fusion"]
    assert (row.type, row.default) == ("choice", "off"), row
    config.gemm_fusion = False
    x, w, b, y = _t((M, K)), _t((N, K), 1, 0.2), _t((N,), 2), _t((M, N), 3)

    def f(x, w, b, y):
        return F.relu(F.linear(x, w, b)) + y, x @ w.t() * 0.5 + y

    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, w, b, y)
        eager = f(x, w, b, y)
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e)
    groups = assert_gemm_eager(compiled)
    # both recomposed, run by PyTorch (aten.linear or oneDNN's, whichever measured faster)
    assert compiled.fallbacks()[LINEAR] + compiled.fallbacks()[ONEDNN] == 2, dict(compiled.fallbacks())
    # the epilogues still run as pointwise kernels of their own, but for the
    # relu that alone reads a linear: it is left to the linear (oneDNN's post-op)
    assert sorted(groups) == sorted([[MUL, ADD]]), groups
    with config.patch(onednn_linear=False):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(f, backend="neuron")(x, w, b, y)
        assert sorted(compiled.groups()) == sorted([[RELU, ADD], [MUL, ADD]])


def test_plain_mm_is_the_gemm_alone(compiled):
    """A product with nothing to fuse is the kernel's result itself (no
    epilogue pass copies it)."""
    x, w = _t((M, K)), _t((K, N), 1)
    got, _ = check(compiled, lambda x, w: x @ w, x, w, groups=[[MM]])
    assert got.is_contiguous()


@pytest.mark.parametrize("alpha,beta", [(2.0, 1.0), (1.0, 0.5), (1.0, 0.0)])
def test_addmm_with_other_alpha_or_beta_stays_eager(alpha, beta, compiled):
    x, w, b = _t((M, K)), _t((K, N), 1), _t((N,), 2)
    b[3] = nan  # beta = 0 ignores the bias, NaN included

    def f(x, w, b):
        return torch.relu(torch.addmm(b, x, w, alpha=alpha, beta=beta))

    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, w, b)
    torch.testing.assert_close(got, f(x, w, b), equal_nan=True)
    assert_gemm_eager(compiled)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes_stay_eager(dtype, compiled):
    x, w, b, y = (t.to(dtype) for t in (_t((M, K)), _t((N, K), 1, 0.2), _t((N,), 2), _t((M, N), 3)))

    def f(x, w, b, y):
        return F.relu(F.linear(x, w, b)), x @ w.t() * 0.5 + y, torch.tanh(x @ w.t() + b) * 0.5 - b

    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, w, b, y)
        eager = f(x, w, b, y)
    for g, e in zip(got, eager):
        assert g.dtype == dtype
        torch.testing.assert_close(g, e)
    # the epilogue kernel rounds each op to float16/bfloat16 as eager does:
    # eager's bits (kept in float32 between ops, 3012 of 4096 differed)
    if dtype != torch.float64:
        assert torch.equal(got[2], eager[2])
    groups = assert_gemm_eager(compiled)
    assert compiled.fallbacks()[ADDMM] == 1 and compiled.fallbacks()[MM] == 1, groups  # one x @ w.t() (CSE)


def test_batched_matmul_is_a_gemm_group(compiled):
    """bmm (rank 3) takes its epilogue like mm does."""
    a, b = _t((3, 8, 16)), _t((3, 16, 12), 1)
    check(compiled, lambda a, b: torch.relu(torch.bmm(a, b)) + 1, a, b, groups=[[BMM, RELU, ADD]])


# -- dynamic shapes ------------------------------------------------------------------------------

def test_dynamic_batch_sizes(compiled):
    w, b, w2 = _t((48, 32), 1, 0.2), _t((48,), 2), _t((32, 48), 3, 0.2)

    def f(x, y):
        h = F.gelu(F.linear(x, w, b))
        return F.linear(h, w2) + y

    def ref(x, y):
        return F.linear(F.gelu(F.linear(x, w.double(), b.double())), w2.double()) + y

    c = torch.compile(f, backend="neuron")
    sizes = [4, 9, 16, 33, 1, 7]
    for n in sizes:
        x, y = _t((n, 32), seed=n), _t((n, 32), seed=100 + n)
        with torch.no_grad():
            got, eager = c(x, y), f(x, y)
        assert_gemm_close(got, eager, ref(x.double(), y.double()), name=f"batch {n}")
    st = torchneuron_jit.stats()
    assert 2 <= st["graphs_compiled"] < len(sizes), st  # a dynamic graph served several sizes
    groups = compiled.assert_lowered(ADDMM, MM, GELU, ADD)
    assert all(g in ([ADDMM, GELU], [MM, ADD]) for g in groups), groups


def test_dynamic_3d_linear(compiled):
    lin = _linear(16, 24, 0)
    ref = copy.deepcopy(lin).double()

    def f(x):
        return torch.relu(lin(x)) * 2

    c = torch.compile(f, backend="neuron", dynamic=True)
    for shape in [(2, 5, 16), (3, 7, 16), (1, 1, 16), (4, 9, 16)]:
        x = _t(shape, seed=shape[1])
        with torch.no_grad():
            got, eager, want = c(x), f(x), torch.relu(ref(x.double())) * 2
        assert_gemm_close(got, eager, want, name=str(shape))
    compiled.assert_lowered(ADDMM)


def test_dynamic_inner_and_output_dims(compiled):
    """K and N change too (dynamic=True from the start)."""
    c = torch.compile(lambda x, w, b: torch.sigmoid(torch.addmm(b, x, w)), backend="neuron", dynamic=True)
    for m, k, n in [(5, 7, 9), (8, 3, 17), (2, 20, 4), (6, 7, 9)]:
        x, w, b = _t((m, k), m), _t((k, n), k), _t((n,), n)
        with torch.no_grad():
            got = c(x, w, b)
        eager = torch.sigmoid(torch.addmm(b, x, w))
        assert_gemm_close(got, eager, torch.sigmoid(torch.addmm(b.double(), x.double(), w.double())),
                          name=str((m, k, n)))
    compiled.assert_lowered(ADDMM, SIGMOID)


# -- the artifact cache --------------------------------------------------------------------------

def _cache_graph(x, w, b, y):
    return F.gelu(F.linear(x, w, b)) * 0.5 + y


def test_gemm_groups_come_back_from_the_artifact_cache(compiled):
    args = (_t((M, K)), _t((N, K), 1, 0.2), _t((N,), 2), _t((M, N), 3))
    first, eager = check(compiled, _cache_graph, *args, groups=[[ADDMM, GELU, MUL, ADD]])
    assert torchneuron_jit.stats()["cache_misses"] == 1
    torch._dynamo.reset()
    torchneuron_jit.reset_stats()
    compiled.mark()
    again, _ = check(compiled, _cache_graph, *args, groups=[[ADDMM, GELU, MUL, ADD]])
    st = torchneuron_jit.stats()
    assert st["cache_hits"] == 1 and st["graphs_lowered"] == 0, st
    assert torch.equal(first, again)
    # other inputs through the kernel built from the cached artifact
    other = (_t((M, K), 7), _t((N, K), 8, 0.2), _t((N,), 9), _t((M, N), 10))
    with torch.no_grad():
        c = torch.compile(_cache_graph, backend="neuron")
        assert_gemm_close(c(*other), _cache_graph(*other), _cache_graph(*map(_double, other)))


def test_switching_gemm_fusion_does_not_reuse_the_other_artifact(compiled):
    args = (_t((M, K)), _t((N, K), 1, 0.2), _t((N,), 2), _t((M, N), 3))
    config.gemm_fusion = False
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(_cache_graph, backend="neuron")(*args), _cache_graph(*args))
    assert_gemm_eager(compiled)
    config.gemm_fusion = True
    torch._dynamo.reset()
    compiled.mark()
    check(compiled, _cache_graph, *args, groups=[[ADDMM, GELU, MUL, ADD]])
    st = torchneuron_jit.stats()
    assert st["cache_misses"] == 2 and st["cache_hits"] == 0, st
    # and back: the artifact without GEMM groups is found again
    config.gemm_fusion = False
    torch._dynamo.reset()
    compiled.mark()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(_cache_graph, backend="neuron")(*args), _cache_graph(*args))
    assert_gemm_eager(compiled)
    assert torchneuron_jit.stats()["cache_hits"] == 1



# -- batched: bmm and baddbmm ----------------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "transposed_b", "strided_a"])
def test_bmm_with_its_epilogue(compiled, layout):
    """Attention scores: q @ k^T scaled and masked, one kernel after the
    products (one BLAS call per product, batches split across threads)."""
    q, kk = _t((6, 32, 16), 1), _t((6, 16, 32), 2)
    if layout == "transposed_b":
        kk = _t((6, 32, 16), 2).transpose(1, 2)
    elif layout == "strided_a":
        q = _t((6, 32, 32), 1)[:, :, ::2]
    mask = torch.rand(32, 32, generator=torch.Generator().manual_seed(3)) > 0.3

    def f(q, k, m):
        return (torch.bmm(q, k) * 0.25).masked_fill(~m, -1e4)

    check(compiled, f, q, kk, mask, ops=(BMM,))


def test_baddbmm_adds_its_input_once(compiled):
    b, x, y = _t((1, 20, 24), 4), _t((5, 20, 12), 5), _t((5, 12, 24), 6)
    check(compiled, lambda b, x, y: torch.relu(torch.baddbmm(b, x, y)), b, x, y, ops=(BADDBMM,))


def test_baddbmm_with_alpha_stays_eager(compiled):
    b, x, y = _t((5, 20, 24), 4), _t((5, 20, 12), 5), _t((5, 12, 24), 6)
    f = lambda b, x, y: torch.baddbmm(b, x, y, alpha=0.5) + 1  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(b, x, y), f(b, x, y))
    assert compiled.fallbacks()[BADDBMM] == 1


@pytest.mark.parametrize("shape", [(0, 8, 8, 8), (3, 0, 8, 8), (3, 8, 0, 8), (3, 8, 8, 0), (1, 8, 8, 8)])
def test_bmm_edge_sizes(compiled, shape):
    bsz, m, kk, n = shape
    x, y = _t((bsz, m, kk), 7), _t((bsz, kk, n), 8)
    with torch.no_grad():
        got = torch.compile(lambda x, y: torch.bmm(x, y) + 1, backend="neuron")(x, y)
    torch.testing.assert_close(got, torch.bmm(x, y) + 1)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_hand_written_attention_with_gemm_fusion(compiled):
    q, kk, v = _t((2, 4, 16, 8), 1), _t((2, 4, 16, 8), 2), _t((2, 4, 16, 8), 3)

    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), -1) @ v

    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(q, kk, v)
    torch.testing.assert_close(got, f(q, kk, v), rtol=1e-5, atol=1e-5)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0
