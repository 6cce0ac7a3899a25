"""Fused pointwise kernels (csrc/lowering/fuse.c, csrc/neuron_backend/codegen.c):
results against eager, through torch.compile(backend="neuron") and directly."""
import math
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torchneuron_jit
from conftest import assert_matches_an_eager_path, close_elementwise, eager_answers, eager_paths
from torchneuron_jit import _C, backend, config
from torchneuron_jit.graph import from_fx


pytestmark = [pytest.mark.usefixtures("fresh_backend"), pytest.mark.isa_parity]


def _special(shape):
    """Random values with NaN, +-Inf, +-0 and large magnitudes sprinkled in."""
    torch.manual_seed(1)
    x = torch.randn(shape) * 3
    flat = x.view(-1)
    specials = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30, 1e-30])
    flat[: specials.numel()] = specials
    return x


CHAINS = {
    "arith": lambda x, y: ((x * 2 + y) * 0.5 - x / 3).clamp_min(0) + y * y,
    "sub_alpha": lambda x, y: torch.sub(x, y, alpha=2.5) + torch.add(y, 1, alpha=3),
    "unary": lambda x, y: (x.abs() + 1).log() + torch.sqrt(y.abs()) - torch.rsqrt(x.abs() + 2),
    "transcendental": lambda x, y: torch.sigmoid(x) * torch.tanh(y) + torch.exp(x * 0.1).sin().cos(),
    "activations": lambda x, y: torch.relu(x) + torch.nn.functional.silu(y) - torch.erf(x),
    "gelu": lambda x, y: torch.nn.functional.gelu(x + y) * 0.5 + x,
    "gelu_tanh": lambda x, y: torch.nn.functional.gelu(x - y, approximate="tanh") * y,
    "max_min_pow": lambda x, y: torch.maximum(x, y) - torch.minimum(x, y * 2) + torch.pow(x.abs(), 1.5),
    # expm1 and log1p each on inputs where they are well conditioned (their
    # composition amplifies 1-ulp differences between math libraries)
    "clamp": lambda x, y: torch.clamp(x * 2, -1, 1) + torch.clamp(y, max=0.5) - (x * 0.1).expm1()
    + y.abs().log1p(),
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_chain_matches_eager_with_special_values(name):
    f = CHAINS[name]
    x, y = _special((33, 70)), _special((33, 70)).flip(0)
    c = torch.compile(f, backend="neuron")
    with torch.no_grad():
        got = c(x, y)
    # eager's exact GELU of +inf is +inf or NaN by its kernel path (conftest.eager_paths)
    assert_matches_an_eager_path(got, eager_answers(f, x, y))
    st = torchneuron_jit.stats()
    assert st["kernels_compiled"] >= 1, st
    assert st["eager_fallbacks"] == 0


@pytest.mark.parametrize("xs,ys", [((4, 1, 5), (3, 1)), ((2, 3, 4), (4,)), ((), (5, 5)), ((6, 1), (1, 7))])
def test_broadcasting(xs, ys):
    f = CHAINS["arith"]
    x, y = torch.randn(xs), torch.randn(ys)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(x, y), f(x, y))
    assert torchneuron_jit.stats()["kernels_compiled"] >= 1


def test_non_contiguous_and_expanded_inputs():
    f = CHAINS["transcendental"]
    base = torch.randn(40, 30)
    x = base.t()                        # transposed
    y = torch.randn(30, 1).expand(30, 40)  # stride 0
    z = torch.randn(60, 80)[::2, ::2]   # sliced with steps
    with torch.no_grad():
        c = torch.compile(f, backend="neuron", dynamic=False)
        torch.testing.assert_close(c(x, y), f(x, y))
        torch.testing.assert_close(c(z, y), f(z, y))


def test_empty_and_zero_dim():
    f = CHAINS["arith"]
    with torch.no_grad():
        for shape in [(0, 5), (3, 0), ()]:
            torch._dynamo.reset()
            x, y = torch.randn(shape), torch.randn(shape)
            out = torch.compile(f, backend="neuron")(x, y)
            torch.testing.assert_close(out, f(x, y))
            assert out.shape == f(x, y).shape


def test_large_tensor_releases_gil_and_matches():
    f = CHAINS["gelu"]
    x, y = torch.randn(300, 1000), torch.randn(1000)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(x, y), f(x, y))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                                   torch.int16, torch.int8, torch.uint8])
def test_each_dtype_lowered_and_correct(dtype):
    f = lambda x, y: (x * 2 + y) * y  # noqa: E731
    x, y = (torch.randn(8, 8) * 10).to(dtype), (torch.randn(8, 8) * 10).to(dtype)
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, y)
    torch.testing.assert_close(got, f(x, y))
    assert got.dtype == dtype
    assert torchneuron_jit.stats()["kernels_compiled"] > 0


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_float64_chains_compute_in_double(name):
    """float64 kernels compute in double (not float32): results agree with
    eager to float64's own tolerances, special values included."""
    f = CHAINS[name]
    x, y = _special((33, 70)).double(), _special((33, 70)).flip(0).double()
    x[1, :4] = torch.tensor([1 + 2 ** -40, 1e-300, 1e300, 123456789.123456789], dtype=torch.float64)
    kernels = []
    real_kernel = _C.Kernel

    def spy(*args, **kwargs):
        kernels.append(real_kernel(*args, **kwargs))
        return kernels[-1]

    _C.Kernel = spy
    try:
        with torch.no_grad():
            got = torch.compile(f, backend="neuron")(x, y)
    finally:
        _C.Kernel = real_kernel
    want = f(x, y)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, equal_nan=True)
    assert kernels and all("double b0[" in k.source and "tn_rt_load_f64" in k.source for k in kernels)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_signed_zeros_as_eager(dtype):
    """relu keeps -0 (eager's clamp_min(x, 0) does), maximum(-0, 0) is +0,
    negation and products carry the sign. (A NaN's sign bit means nothing
    and differs between eager's kernels: not compared.)"""
    x = torch.tensor([-0.0, 0.0, -1.0, 1.0, math.nan, -math.inf] * 3).to(dtype)
    y = torch.tensor([0.0, -0.0, -0.0, 0.0, 0.0, 2.0] * 3).to(dtype)
    f = lambda x, y: (torch.relu(x) * 1.0, torch.maximum(x, y) + 0.0 * 0,  # noqa: E731
                      -(x * y), torch.clamp_min(x, 0.0) * 2)
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, y)
    for i, (g, w) in enumerate(zip(got, f(x, y))):
        torch.testing.assert_close(g, w, equal_nan=True, msg=lambda m: f"output {i}: {m}")
        number = ~w.isnan()
        assert torch.equal(torch.signbit(g[number]), torch.signbit(w[number])), (i, g, w)
    assert torchneuron_jit.stats()["kernels_compiled"] >= 1


def test_kernel_source_is_deterministic_and_shape_independent():
    f = CHAINS["gelu"]
    sources = []
    for shape in [(4, 8), (16, 3), (4, 8)]:
        gm = make_fx(f)(torch.randn(shape), torch.randn(shape))
        sources.append([g["source"] for g in _C.fuse(from_fx(gm).graph)])
    assert sources[0] == sources[1] == sources[2]
    assert "#include" not in sources[0][0]


def test_intermediates_used_outside_the_group_are_written():
    def f(x, y):
        a = torch.exp(x) * 2          # a feeds the group and a non-fusable op
        b = torch.cumsum(a, 0)
        return a + 1, b + a * y
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, y)
    for g, e in zip(got, f(x, y)):
        torch.testing.assert_close(g, e)


def test_run_time_failure_of_compiled_graph_falls_back_once(monkeypatch):
    """A step of the plan fails at run time (its kernels are made to raise):
    the graph's eager original answers, one warning names the cause, and
    the graph runs eagerly from then on (the failing step is not called
    again)."""
    real, calls = backend._op_callable, []

    def boom(*args):
        calls.append(1)
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(backend, "_op_callable", lambda t: boom if isinstance(t, _C.Kernel) else real(t))
    f = CHAINS["arith"]
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    c = torch.compile(f, backend="neuron")
    with pytest.warns(RuntimeWarning, match="kernel exploded"):
        with torch.no_grad():
            out = c(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert torchneuron_jit.stats()["eager_fallbacks"] == 1 and calls == [1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            torch.testing.assert_close(c(x, y), f(x, y))
    assert calls == [1]


def test_user_errors_still_raise_like_eager():
    def f(x, y):
        return torch.exp(x) * 2 + y
    c = torch.compile(f, backend="neuron")
    with torch.no_grad():
        c(torch.randn(3, 4), torch.randn(3, 4))
        with pytest.raises(RuntimeError):
            c(torch.randn(3, 4), torch.randn(5, 4))  # shapes do not broadcast: eager raises too


CACHE_CHILD = """
import json, torch, torchneuron_jit
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)).eval()
def f(x):
    h = m(x)
    return torch.sigmoid(h * 1.702) * h + torch.tanh(h) * 0.5
x = torch.randn(8, 32)
with torch.no_grad():
    torch.testing.assert_close(torch.compile(f, backend="neuron")(x), f(x))
print(json.dumps(torchneuron_jit.stats()))
"""


@pytest.mark.isa_independent
def test_second_process_uses_the_cached_artifact(run_python):
    import json
    runs = []
    for _ in range(2):
        out = run_python("-c", CACHE_CHILD)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["cache_misses"] == 1 and first["graphs_lowered"] == 1 and first["kernels_compiled"] >= 1
    assert second["cache_hits"] == 1 and second["graphs_lowered"] == 0
    assert second["kernels_compiled"] == first["kernels_compiled"]


def test_cached_artifact_maps_onto_a_reordered_program():
    def f1(x, y):
        a = torch.exp(x) * 2
        b = torch.tanh(y) + 1
        return a + b, a * b

    def f2(x, y):  # the same dataflow, statements in another order
        b = torch.tanh(y) + 1
        a = torch.exp(x) * 2
        return a + b, a * b

    x, y = torch.randn(5, 7), torch.randn(5, 7)
    with torch.no_grad():
        for f in (f1, f2):
            gm = make_fx(f)(x, y)
            compiled = backend.compile_inference(gm, [x, y])
            got = compiled([x, y])
            for g, e in zip(got, f(x, y)):
                torch.testing.assert_close(g, e)
    st = torchneuron_jit.stats()
    assert st["cache_misses"] == 1 and st["cache_hits"] == 1, st
    assert st["kernels_compiled"] == 2


def test_changing_shapes_compile_dynamic_graphs_without_fallback():
    import warnings

    def f(x, y):
        return torch.tanh(x.view(x.shape[0] * 2, -1) * 3).exp() + torch.sigmoid(y).repeat(2, 1)

    c = torch.compile(f, backend="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not compile" warning
        with torch.no_grad():
            for n in (8, 12, 16, 5):
                x, y = torch.randn(n, 32), torch.randn(n, 16)
                torch.testing.assert_close(c(x, y), f(x, y))
    st = torchneuron_jit.stats()
    assert st["eager_fallbacks"] == 0
    assert st["graphs_compiled"] >= 2 and st["kernels_compiled"] >= 2  # a static and a dynamic graph


def test_dynamic_inner_dims_still_fuse(capsys):
    """A dynamic sequence length makes the outer stride 256*s: still contiguous."""
    from torchneuron_jit import config
    config.log = "compile"
    f = CHAINS["transcendental"]
    c = torch.compile(f, backend="neuron")
    with torch.no_grad():
        for s in (8, 9, 11):
            x, y = torch.randn(4, s, 256), torch.randn(4, s, 256)
            torch.testing.assert_close(c(x, y), f(x, y))
    fused = capsys.readouterr().err.count("into one kernel")
    assert fused == 2, fused  # the static graph and the dynamic one
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_large_launches_share_torch_threads_and_survive_fork(in_child):
    """Parts of a large launch run on PyTorch's OpenMP threads; a forked
    child (which has none of the parent's threads) still runs them, and
    the MKL functions they call for eager's bits (vmsTanh ...) run serially
    there: with MKL's count above 1 (torch.set_num_threads(2) sets it;
    left at its default it follows the physical cores, 1 on a 2-vCPU
    machine) they opened a parallel region of 200 values or more, which
    waited forever for the parent's OpenMP threads."""
    import numpy

    from torchneuron_jit import backend
    f = CHAINS["transcendental"]
    c = torch.compile(f, backend="neuron")
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        x, y = torch.randn(512, 512), torch.randn(512, 512)  # 16 parts' worth
        torch.testing.assert_close(c(x, y), f(x, y))
        assert backend._share_torch_threads()
        small = x[:3, :100].clone(), y[:3, :100].clone()  # one launch on the calling thread, in no parts
        torch.testing.assert_close(c(*small), f(*small))
        x2, small2 = x * 2, (small[0] * 2, small[1])
        want, want_small = f(x2, y).numpy(), f(*small2).numpy()
        # no eager op in the child: those of 200 values or more hang in a child forked after running in parallel
        in_child(lambda: numpy.allclose(c(x2, y).numpy(), want, rtol=1.3e-6, atol=1e-5)
                 and numpy.allclose(c(*small2).numpy(), want_small, rtol=1.3e-6, atol=1e-5))
    finally:
        torch.set_num_threads(threads)


def test_threads_calling_one_compiled_function(in_threads):
    f = CHAINS["transcendental"]
    c = torch.compile(f, backend="neuron")
    x, y = torch.randn(300, 400), torch.randn(300, 400)  # large: launches use the pool
    want = f(x, y)
    with torch.no_grad():
        c(x, y)

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        a, b = torch.randn(300, 400, generator=g), torch.randn(300, 400, generator=g)
        with torch.no_grad():
            for _ in range(20):
                torch.testing.assert_close(c(a, b), f(a, b))
                torch.testing.assert_close(c(x, y), want)

    in_threads(worker)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["arith", "transcendental", "gelu", "max_min_pow"])
def test_half_precision_chains_match_eager(name, dtype):
    f = CHAINS[name]
    x, y = _special((33, 70)).to(dtype), _special((33, 70)).flip(0).to(dtype)
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, y)
    assert got.dtype == dtype
    # computed in float32 and rounded once, where eager rounds after every op:
    # compare against a float32 evaluation, allowing eager's own error too;
    # each element as eager gives it along one of its kernel paths (exact
    # GELU of +inf is +inf or NaN by path: conftest.eager_paths)
    ok = torch.zeros(got.shape, dtype=torch.bool)
    for path in eager_paths():
        with path():
            want, ref = f(x, y), f(x.float(), y.float())
        ours = (got.float() - ref).abs()
        eagers = (want.float() - ref).abs()
        tol = torch.finfo(dtype).eps * ref.abs() + 1e-3
        ok |= (got.isnan() == (want.isnan() | (ref.isnan() & got.isnan()))) & ((ours <= eagers + tol) | ~ref.isfinite())
    assert bool(ok.all()), (x[~ok], y[~ok], got[~ok])
    assert torchneuron_jit.stats()["kernels_compiled"] >= 1


def test_bfloat16_rounding_and_nan_on_store():
    f = lambda x: x * 1.0 + 0.0  # noqa: E731  (one fused group, values pass through)
    vals = torch.tensor([1.0, 1.00390625, 1.01171875, -2.5, math.nan, math.inf, -0.0, 3.0e38])
    x = vals.to(torch.bfloat16)
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x)
    torch.testing.assert_close(got, f(x), equal_nan=True)


def test_group_takes_inputs_computed_after_its_first_node(compiled):
    """A group may read a tensor the graph computes after the group's first
    node when that tensor does not depend on the group: the broadcast mask
    (computed after the scaling) joins the scale, masked_fill and add in one
    kernel; its comparison, of another shape, stays with eager."""
    config.log = "compile"
    f = lambda s, m: (s * 0.125).masked_fill(m == 0, float("-inf")) + 1  # noqa: E731
    s, m = torch.randn(2, 4, 8, 8), (torch.rand(2, 1, 8, 8) > 0.3).long()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(s, m), f(s, m))
    groups = compiled.assert_lowered("aten.mul.Tensor", "aten.masked_fill.Scalar", "aten.add.Tensor")
    assert ["aten.mul.Tensor", "aten.masked_fill.Scalar", "aten.add.Tensor"] in groups


def test_no_group_reads_its_own_result(compiled):
    """cumsum (eager) reads the group's result and the group's last add
    reads cumsum: that add must not join (it would wait for itself)."""
    config.log = "compile"
    f = lambda x: (lambda a: a.cumsum(-1) + a * 3)(x * 2 + 1)  # noqa: E731
    x = torch.randn(4, 33)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(x), f(x))
    for grp in compiled.groups():
        assert not ("aten.mul.Tensor" in grp and grp.count("aten.add.Tensor") == 2), grp


@pytest.mark.parametrize("case", ["t", "permute3", "t_with_contiguous", "t_of_int"])
def test_permuted_layouts_fuse_with_eager_strides(compiled, case):
    """Elementwise results of transposed or permuted inputs keep eager's
    (permuted) strides, and the chain still fuses into one kernel."""
    config.log = "compile"
    a, b = torch.randn(33, 70), torch.randn(70, 33)
    f, args = {
        "t": (lambda a: (a.t() * 2) * 3 + 1, (a,)),
        "permute3": (lambda x: torch.sigmoid(x.permute(2, 0, 1)) * 2 - x.permute(2, 0, 1),
                     (torch.randn(5, 6, 7),)),
        "t_with_contiguous": (lambda a, b: (a.t() + b) * 2, (a, b)),
        "t_of_int": (lambda a: ((a.t() * 3) > 4) & (a.t() < 50), (torch.randint(-99, 99, (33, 70)),)),
    }[case]
    with torch.no_grad():
        got, want = torch.compile(f, backend="neuron")(*args), f(*args)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()
    compiled.assert_lowered("aten.mul.Tensor")


def test_per_row_operands_are_scalars(compiled):
    """An operand broadcast along the innermost dim (a per-channel bias, a
    per-row threshold) is read as one scalar per row, never filled into a
    block; results match eager, also where the same kernel meets it at
    other strides."""
    sources = []
    real_kernel = _C.Kernel

    def spy(*args, **kwargs):
        sources.append(args[0])
        return real_kernel(*args, **kwargs)

    f = lambda x, m, s, t: torch.where(x > t, torch.relu((x - m) * s), x * 0.5)  # noqa: E731
    _C.Kernel = spy
    try:
        c = torch.compile(f, backend="neuron", dynamic=False)
        with torch.no_grad():
            for x, m, s, t in [(torch.randn(2, 8, 5, 6), torch.randn(8, 1, 1), torch.rand(8, 1, 1), torch.randn(8, 1, 1)),
                               (torch.randn(4, 33), torch.randn(4, 1), torch.rand(4, 1), torch.randn(33))]:
                torch.testing.assert_close(c(x, m, s, t), f(x, m, s, t))
    finally:
        _C.Kernel = real_kernel
    assert sources and any("tn_rt_binary_s_f32" in src and "*(float *)p[" in src for src in sources)
    assert any("tn_rt_compare_s_f32" in src and "*(float *)p[" in src for src in sources)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_number_first_operands_fuse(compiled, dtype):
    """`1.0 - mask` (aot: sub.Tensor(1.0, x)) fuses: the number becomes a
    0-dim tensor of the result's dtype, a constant of the kernel; values as
    eager's, for an attention mask made the way Hugging Face models make it."""
    config.log = "compile"

    def f(mask, x):
        m = (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        return m, 2.5 / (x + 3.0) - 0.5 * x

    mask, x = (torch.rand(2, 16) > 0.2).long(), torch.rand(4, 16).to(dtype)
    with torch.no_grad():
        got, want = torch.compile(f, backend="neuron")(mask, x), f(mask, x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)  # 0 or the dtype's lowest
    if dtype in (torch.float16, torch.bfloat16):  # rounded once, where eager rounds per op: near the exact value
        torch.testing.assert_close(got[1].float(), f(mask, x.float())[1], rtol=2 * torch.finfo(dtype).eps, atol=1e-3)
    else:
        torch.testing.assert_close(got[1], want[1])
    compiled.assert_lowered("aten.sub.Tensor", "aten._to_copy.default", "aten.reciprocal.default")


# -- views at a kernel's inputs (backend._input_view, kernel_py.c apply_view) ---------------

INPUT_VIEWS = {
    "unsqueeze_of_input_and_const": (lambda x, n: ((torch.arange(8) < n[:, None]) & (x > 0)) * x,
                                     lambda: (torch.randn(4, 8), torch.tensor([1, 3, 5, 8]))),
    "transpose": (lambda x, y: (x.t() * 2 + y).relu(), lambda: (torch.randn(6, 5), torch.randn(5, 6))),
    "slice": (lambda x, y: x[:, 2:7] * y + 1, lambda: (torch.randn(4, 10), torch.randn(4, 5))),
    "strided_slice": (lambda x, y: x[1:, ::3] * y + 1, lambda: (torch.randn(5, 10), torch.randn(4, 4))),
    "select": (lambda x, y: x[1] * y - 2, lambda: (torch.randn(3, 7), torch.randn(7))),
    "expand": (lambda x, y: x.expand(4, 6) * y + 1, lambda: (torch.randn(1, 6), torch.randn(4, 6))),
    "between_kernels": (lambda x, y: ((x * 2 + 1).view(4, 3, 2).permute(2, 0, 1) + y).sigmoid() * 3,
                        lambda: (torch.randn(4, 6), torch.randn(2, 4, 3))),
    "split": (lambda x: (lambda a, b: (a * b + 1).exp())(*x.split(3, dim=1)), lambda: (torch.randn(4, 6),)),
    "contiguous_copy": (lambda x, y: x.t().contiguous() * 2 + y, lambda: (torch.randn(6, 5), torch.randn(5, 6))),
    "clone_read_twice": (lambda x, y: (lambda c: (c * 2 + y, c.exp() - y))(x.clone()),
                         lambda: (torch.randn(5, 6), torch.randn(5, 6))),
    "int_and_bool": (lambda i, m: (i.t() * 3 + 1) * m[:, :1], lambda: (torch.randint(-9, 9, (5, 4)),
                                                                        torch.rand(4, 3) > 0.5)),
}


@pytest.mark.parametrize("case", sorted(INPUT_VIEWS))
def test_views_of_inputs_and_kernel_results_are_read_in_place(compiled, case):
    """A view op between a graph input (a constant, a kernel's result) and a
    kernel does not run: the kernel reads its root at the view's sizes,
    strides and offset. Same values and strides as eager; nothing through
    PyTorch."""
    f, make = INPUT_VIEWS[case]
    args = make()
    with torch.no_grad():
        got, want = torch.compile(f, backend="neuron")(*args), f(*args)
    for g, w in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
        torch.testing.assert_close(g, w, rtol=1.3e-6, atol=1e-5)
        assert g.stride() == w.stride()
    assert not compiled.fallbacks(), dict(compiled.fallbacks())
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_a_clone_read_by_an_eager_op_too_still_runs(compiled):
    """x.clone() read by a kernel and by cumsum: the copy must exist for
    cumsum, and the kernel reads it (or its source: the same values)."""
    f = lambda x: (lambda c: (c * 2 + 1, torch.cumsum(c, 0)))(x.t().clone())  # noqa: E731
    x = torch.randn(5, 4)
    with torch.no_grad():
        for g, w in zip(torch.compile(f, backend="neuron")(x), f(x)):
            torch.testing.assert_close(g, w)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_a_view_of_an_eager_result_still_runs():
    """The root must have a layout the compiled graph fixes: a view of what
    an op left to PyTorch returns (cumsum here) runs as a view op."""
    f = lambda x: torch.cumsum(x, 0).t() * 2 + 1  # noqa: E731
    x = torch.randn(5, 4)
    before = dict(backend.fallback_ops)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(x), f(x))
    assert backend.fallback_ops["aten.t.default"] + backend.fallback_ops["aten.permute.default"] \
        > before.get("aten.t.default", 0) + before.get("aten.permute.default", 0)


def test_kernel_refuses_a_root_laid_out_otherwise():
    """Kernel(views=...) checks the tensor it is given against the layout it
    was compiled for (ValueError, which sends the graph to eager), and reads
    the view otherwise."""
    gm = make_fx(lambda x, y: x * 2 + y)(torch.randn(3, 4), torch.randn(3, 4))
    grp = _C.fuse(from_fx(gm).graph)[0]
    view = ((4, 3), (3, 1), (3, 4), (1, 3), 0)  # x = root.t() of a contiguous 4x3 root
    k = _C.Kernel(grp["source"], 2, 1, torch.empty, [getattr(torch, d) for d in grp["dtypes"]],
                  views=[view, None])
    root, y = torch.randn(4, 3), torch.randn(3, 4)
    torch.testing.assert_close(k(root, y)[0], root.t() * 2 + y)
    with pytest.raises(ValueError, match="laid out unlike"):
        k(torch.randn(3, 4).t(), y)
    with pytest.raises(ValueError, match="one entry per input"):
        _C.Kernel(grp["source"], 2, 1, torch.empty, [getattr(torch, d) for d in grp["dtypes"]], views=[view])


def test_kernel_lays_out_an_ordered_output_by_each_calls_sizes():
    """out_strides entries of -1 - place (a dynamic variant's transposed
    result) give the output the dense layout of that order at the sizes of
    each call: eager's for x.transpose(1, 2) * 2 + y at every size; a form
    that is neither strides nor an order is refused."""
    gm = make_fx(lambda x, y: x * 2 + y)(torch.randn(3, 4), torch.randn(3, 4))
    grp = _C.fuse(from_fx(gm).graph)[0]
    dtypes = [getattr(torch, d) for d in grp["dtypes"]]
    k = _C.Kernel(grp["source"], 2, 1, torch.empty, dtypes, out_strides=[(-4, -2, -3, -1)])
    for b, s in [(2, 5), (3, 9), (1, 4)]:
        x = torch.randn(b, s, 3, 8).transpose(1, 2)
        y = torch.randn(b, 3, s, 8).transpose(1, 2).contiguous().transpose(1, 2)
        got, want = k(x, y)[0], x * 2 + y
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride(), (got.stride(), want.stride())
    for bad in [(-1, -1, -2, -3), (-1, 2, -3, -4), (-1, -2, -3, -5)]:
        with pytest.raises(ValueError, match="out_strides"):
            _C.Kernel(grp["source"], 2, 1, torch.empty, dtypes, out_strides=[bad])


# -- buffers: an output written into a dead input's (tn_fgroup.fg_donor) -----------------

def _donor_graph(x, y):
    a = torch.exp(x) * 2          # group 1: a, and u for the cumsum
    u = a * 3 + y
    w = torch.cumsum(u, 1)        # run by PyTorch: group 2 depends on it, so the two cannot merge
    return (a + w) * 0.5 - a      # group 2: a's last reader


def _kernels(gm):
    groups = _C.fuse(from_fx(gm).graph)
    return groups, [_C.Kernel(g["source"], len(g["inputs"]), len(g["outputs"]), torch.empty,
                              [getattr(torch, d) for d in g["dtypes"]], donors=g["donors"]) for g in groups]


def test_an_output_takes_the_buffer_of_an_input_at_its_last_use():
    x, y = torch.randn(16, 40), torch.randn(16, 40)
    groups, (k1, k2) = _kernels(make_fx(_donor_graph)(x, y))
    assert [g["donors"] for g in groups] == [[-1, -1], [0]]
    a, u = k1(x, y)
    w = torch.cumsum(u, 1)
    ptr = a.data_ptr()
    (out,) = k2(a, w)
    assert out.data_ptr() == ptr  # written in place of a
    torch.testing.assert_close(out, _donor_graph(x, y))
    # a donor laid out otherwise is left alone: the output gets a buffer of its own
    a2 = (torch.exp(x.t().contiguous()) * 2).t()
    (out2,) = k2(a2, w)
    assert out2.data_ptr() != a2.data_ptr()
    torch.testing.assert_close(out2, _donor_graph(x, y))


def test_no_donor_where_the_input_lives_on():
    """A graph output, or a value read by an op left to PyTorch after the
    kernel, keeps its buffer."""
    def returned(x, y):
        a = torch.exp(x) * 2
        w = torch.cumsum(a * 3 + y, 1)
        return (a + w) * 0.5 - a, a

    def read_later(x, y):
        a = torch.exp(x) * 2
        w = torch.cumsum(a * 3 + y, 1)
        b = (a + w) * 0.5 - a
        return b, torch.cumsum(a, 0)

    x, y = torch.randn(8, 12), torch.randn(8, 12)
    for f in (returned, read_later):
        groups, _ = _kernels(make_fx(f)(x, y))
        assert all(d == -1 for g in groups for d in g["donors"]), (f.__name__, groups)
        with torch.no_grad():
            for g, e in zip(torch.compile(f, backend="neuron")(x, y), f(x, y)):
                torch.testing.assert_close(g, e)


def test_in_place_outputs_match_eager_over_calls_and_threads(in_threads):
    c = torch.compile(_donor_graph, backend="neuron")
    inputs = [(torch.randn(64, 300), torch.randn(64, 300)) for _ in range(4)]
    with torch.no_grad():
        want = [_donor_graph(*a) for a in inputs]
        c(*inputs[0])

    def body(i):
        with torch.no_grad():
            for _ in range(20):
                torch.testing.assert_close(c(*inputs[i]), want[i])

    in_threads(body)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", ["floor", "ceil", "trunc", "round", "pow"])
def test_half_values_at_a_step_of_the_op_are_rounded_first(op, dtype):
    """(a * 3).floor() and pow(b, a * 3) in a half dtype: eager rounds a * 3
    to the dtype before the op, and a step of the op may lie between the
    float32 product and its rounding (floor(2.9995) vs floor(3.0);
    pow(-2.5, -1.9995) is NaN, pow(-2.5, -2.0) is not). The product is exact
    in float32, so the rounded value is eager's to the bit. Found by the
    fuzzer (through gelu(x).floor() and pow(x, tanh(x)))."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(3, 70, 9, generator=g) * 4).to(dtype)
    b = -(torch.rand(3, 70, 9, generator=g) * 4 + 0.5).to(dtype)
    if op == "pow":
        f = lambda a, b: torch.pow(b, a * 3)
    else:
        f = lambda a, b: getattr(a * 3, op)()
    torch._dynamo.reset()
    got = torch.compile(f, backend="neuron")(a, b)
    torch.testing.assert_close(got, f(a, b), equal_nan=True, rtol=0, atol=0)
    assert torchneuron_jit.stats()["kernels_compiled"] >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 40])
def test_exact_gelu_of_infinities_is_the_formulas(dtype, n):
    """gelu(+inf) = +inf and gelu(-inf) = NaN (0 * -inf), as the formula
    gives, in every float dtype and wherever the value lies. Eager is not
    consistent here: its ATen kernels (and oneDNN's AVX2 one) give +inf for
    +inf, oneDNN's AVX-512 kernel NaN, and which runs depends on the CPU, the
    dtype and the tensor's size; so eager is accepted along any path, and
    ours must be the formula's."""
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, 70000.0, 3.0, -3.0, -1e30] * 5)[:n].to(dtype)
    f = lambda a: torch.nn.functional.gelu(a * 1) + 0  # noqa: E731
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x)
    assert torchneuron_jit.stats()["kernels_compiled"] >= 1
    assert_matches_an_eager_path(got, eager_answers(f, x))
    formula = f(x.double()).to(dtype)  # float64 GELU is ATen's own kernel everywhere
    assert bool(close_elementwise(got, formula).all()), (got, formula)
    assert got[0] == float("inf")
    if n > 1:
        assert got[1].isnan()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["exp", "log", "sigmoid", "tanh", "erf", "sin", "gelu"])
def test_a_value_gives_one_result_wherever_it_lies(op, dtype):
    """Elements past the last whole vector go through the same vector code
    as the others (libm's scalar functions differ from libmvec's in the last
    bit): exp(1) at position 35 of 37 equals exp(1) at position 0, so
    exp(x) < gather(exp(x)) of equal elements is false everywhere. Found by
    the fuzzer."""
    f = getattr(torch, op, None) or getattr(torch.nn.functional, op)
    for n in (1, 5, 17, 37, 1030):
        torch._dynamo.reset()
        out = torch.compile(lambda a: f(a) * 1, backend="neuron")(torch.full((n,), 0.7, dtype=dtype))
        assert out.unique().numel() == 1, (n, out.unique())


@pytest.mark.parametrize("op", ["log", "rsqrt", "reciprocal", "sqrt", "div"])
def test_half_values_at_a_pole_of_the_op_are_rounded_first(op):
    """log(a * b) in float16 with a * b = 1e-8: eager rounds the product to
    0 (float16's smallest is 6e-8), so log gives -inf, rsqrt and 1/x inf,
    sqrt(-1e-8) -0 instead of NaN. Ours rounds the operand of an op with a
    pole as eager has it."""
    a = torch.tensor([1e-4, -1e-4, 1e-4, 2.0, -3.0], dtype=torch.float16)
    b = torch.tensor([1e-4, 1e-4, 1e-3, 0.5, 1.0], dtype=torch.float16)
    f = (lambda a, b: torch.div(1.0 + a, a * b)) if op == "div" else (lambda a, b: getattr(torch, op)(a * b))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="neuron")(a, b), f(a, b), equal_nan=True, rtol=0, atol=0)


@pytest.mark.isa_independent
def test_a_very_long_chain_is_several_kernels_not_a_stack_overflow(run_python):
    """A generated kernel keeps a block per buffer on its stack: 1500 fused
    adds were one kernel with a 12 MB frame, and the call died with a
    segmentation fault. Run in a child, so a crash is this test's failure."""
    out = run_python("-c", (
        "import torch, torchneuron_jit\n"
        "def long(x):\n"
        "    for _ in range(1500):\n"
        "        x = x + 1\n"
        "    return x\n"
        "x = torch.randn(8)\n"
        "with torch.no_grad():\n"
        "    got = torch.compile(long, backend='neuron')(x)\n"
        "torch.testing.assert_close(got, long(x))\n"
        "print(torchneuron_jit.stats()['kernels_compiled'])\n"), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) >= 1500 // 128


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("exponent", [2, 3, -2, 0.5, -0.5, -1, 1, 0, 3.0, 2.0])
def test_pow_of_a_special_cased_exponent_is_eagers_to_the_bit(exponent, dtype):
    """Eager's pow(x, 3) is x*x*x and pow(x, -2) 1/(x*x) (its kernels
    special-case these exponents, and 2, 0.5, -0.5, -1, 1, 0), which differ
    from the math library's pow in the last bit; a fused pow of them
    computes what eager does. The fused powf also made GPT-2's gelu_new 17x
    slower than eager."""
    x = _special((37, 70)).to(dtype)
    f = lambda a: torch.pow(a * 1, exponent) * 1  # noqa: E731  (a lone op stays eager's)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x)
    assert torchneuron_jit.stats()["kernels_compiled"] >= 1
    if exponent in (0.5, -0.5):  # eager's own float32 sqrt is 1 ulp off the rounded root for some values
        torch.testing.assert_close(got, f(x), equal_nan=True)
    else:
        torch.testing.assert_close(got, f(x), equal_nan=True, rtol=0, atol=0)
    real = ~got.isnan()  # (a NaN's sign is not a value's)
    assert torch.equal(torch.signbit(got[real]), torch.signbit(f(x)[real]))


@pytest.mark.parametrize("door", ["jit", "neuron"])
def test_a_factory_read_by_a_node_of_no_tensor_output_fuses_without_a_crash(door):
    """F.one_hot(torch.where(m != 0, 1, 0), 3) at a second size (transformers'
    LongT5: its global aggregates): the fusion pass asked a reader of the
    where's constant for the space of an output it does not have, and the
    process died of a segfault while its dynamic variant was built (a
    helper's sweep)."""
    from torchneuron_jit import config

    def f(m):
        return torch.nn.functional.one_hot(torch.where(m != 0, 1, 0), 3)

    g = torchneuron_jit.jit(f) if door == "jit" else torch.compile(f, backend="neuron", dynamic=True)
    with torch.no_grad(), config.patch(compile_blocking=True):
        for b, s in [(1, 8), (1, 9), (2, 13), (3, 21)]:
            m = torch.ones(b, s)
            torch.testing.assert_close(g(m), f(m))
