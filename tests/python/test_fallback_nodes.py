"""Per-node fallback: a node the IR cannot lower runs through PyTorch, and
the rest of its graph still compiles (no whole-graph eager fallback), through
both doors."""
import warnings

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import _C
from torchneuron_jit.graph import from_fx

pytestmark = pytest.mark.usefixtures("fresh_backend")


def _compiled_cleanly(fn, *calls):
    """Runs fn through torch.compile on each argument tuple of calls and
    asserts parity with eager, no warning and no whole-graph fallback."""
    c = torch.compile(fn, backend="neuron")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for args in calls:
            torch.testing.assert_close(c(*args), fn(*args))
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    st = torchneuron_jit.stats()
    assert ours == [] and st["eager_fallbacks"] == 0, ours
    assert st["graphs_compiled"] >= 1
    return st


def test_index_with_a_none_in_its_indices_is_a_fallback_node():
    # x[:, idx]: aten.index.Tensor(x, [None, idx]); the chains before and after it still fuse
    def f(x, idx):
        return torch.sin(torch.exp(x * 2.0)[:, idx] + 1.0)

    # inputs of moderate size: sin of exp(2x) + 1 for |x| up to 3 amplifies one ulp of exp beyond the tolerance
    st = _compiled_cleanly(f, (torch.randn(4, 6) * 0.25, torch.tensor([0, 2, 5])))
    assert st["kernels_compiled"] == 2


def test_import_keeps_the_none_of_an_optional_tensor_list():
    from torch.fx.experimental.proxy_tensor import make_fx
    with torch.no_grad():
        gm = make_fx(lambda x, i: x[:, i], tracing_mode="fake")(torch.randn(4, 6), torch.tensor([1, 3]))
    r = from_fx(gm)
    assert r.fallback_ops == ["aten::index.Tensor"]
    assert "[None, %1]" in r.graph.dump()
    enc = r.graph.encode()
    assert _C.decode_graph(enc).encode() == enc


def test_an_int_argument_dynamo_made_dynamic_is_a_number_of_the_graph():
    # the second value of k makes Dynamo trace k as a SymInt graph input: x * k is mul.Tensor(x, s)
    def f(x, k):
        return torch.relu(x * k) + 1

    x = torch.randn(8)
    _compiled_cleanly(f, (x, 2), (x, 3), (x, 5))


def test_a_symint_scalar_where_the_op_table_wants_a_constant_runs_through_pytorch():
    from torch.fx.experimental.proxy_tensor import make_fx
    with torch.no_grad():
        gm = make_fx(lambda x: x * x.shape[0], tracing_mode="symbolic")(torch.randn(5, 3))
    r = from_fx(gm)
    # mul.Scalar takes a symbol in its signature: it is in the op table, not a failure
    assert r.graph.num_nodes == 1


def test_jit_index_by_integer_tensor_compiles():
    w = torch.randn(10, 4)

    def f(x, idx):
        return torch.tanh(x[idx] * 2.0) + w[idx]

    j = torchneuron_jit.jit(f)
    x, idx = torch.randn(10, 4), torch.tensor([1, 7, 3])
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(j(x, idx), f(x, idx))
    assert [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)] == []
    assert torchneuron_jit.stats()["graphs_compiled"] == 1


def test_jit_index_by_mask_still_runs_eagerly_with_its_reason():
    def f(x):
        return x[x > 0] * 2

    j = torchneuron_jit.jit(f)
    x = torch.randn(16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        torch.testing.assert_close(j(x), f(x))
        torch.testing.assert_close(j(x), f(x))
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(ours) == 1 and "data-dependent" in ours[0], ours


def test_stats_count_what_runs_through_pytorch_by_op_and_reason(capsys):
    from torchneuron_jit import config

    def f(x, idx):
        return torch.sin(torch.exp(x * 2.0)[:, idx] + 1.0).cumsum(0)

    with config.patch(log="fallback"):
        _compiled_cleanly(f, (torch.randn(4, 6) * 0.25, torch.tensor([0, 2, 5])))  # moderate, as above
    st = torchneuron_jit.stats()
    assert st["fallback_ops"] == {"aten::index.Tensor": {"no lowering": 1}, "aten::cumsum": {"no lowering": 1}}
    assert st["fallback_nodes"] == 2 and st["lowered_nodes"] == 4
    assert "aten::index.Tensor: no lowering (1 node)" in capsys.readouterr().err
    torchneuron_jit.reset_stats()
    assert torchneuron_jit.stats()["fallback_ops"] == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_a_complex_number_operand_is_a_fallback_nodes_argument(dtype):
    """x * 1j: the importer refused a complex Python number (neither a tensor
    nor a number of the IR's), and the whole graph ran eagerly with a
    warning; the op goes through PyTorch, and the chain before it fuses."""
    def f(x):
        return (torch.sin(x.abs() * 2.0) + 1.0) * 1j + 1

    st = _compiled_cleanly(f, (torch.randn(4, 5, dtype=dtype),))
    assert st["kernels_compiled"] >= 1


# -- higher-order ops: torch.cond, custom ops that write their arguments, flex_attention, map -------------

def test_torch_cond_is_a_fallback_node_and_the_graph_around_it_compiles():
    """torch.cond's subgraphs are arguments no kernel of ours takes: the
    whole graph ran eagerly, with a warning. The op is a fallback node,
    which PyTorch runs (either branch, as the predicate says on each
    call), the chains before and after it are kernels, and each branch is
    a compiled graph of its own."""
    torch.manual_seed(0)  # some draws put exp's answer in the last bits a GEMM's order of sums moves (default ISA)
    w = torch.randn(16, 16)

    def f(x):
        y = torch.sin(x @ w) * 2.0
        z = torch.cond(y.sum() > 0, lambda t: t.cos() + 1, lambda t: t.exp() - 1, (y,))
        return torch.relu(z) * 3.0 + 1.0

    x = torch.randn(8, 16)
    preds = {bool((torch.sin(a @ w) * 2.0).sum() > 0) for a in (x, -x)}
    assert preds == {True, False}  # both branches run
    st = _compiled_cleanly(f, (x,), (-x,), (x * 0.5,), (-x * 0.5,))
    assert st["graphs_compiled"] == 3 and st["kernels_compiled"] >= 4, st  # the graph and its two branches
    assert st["fallback_ops"]["higher_order::cond"] == {"no lowering": 1}


def test_a_custom_op_that_writes_its_argument_is_a_fallback_node():
    """A torch.library custom op with mutates_args comes as
    auto_functionalized_v2, which the importer refused ("only ATen
    operators"): the graph ran eagerly. It is a fallback node now, and its
    write reaches the caller's tensor as it does eagerly."""
    @torch.library.custom_op("tn_test::scale_", mutates_args=("x",))
    def scale_(x: torch.Tensor, k: float) -> None:
        x.mul_(k)

    @scale_.register_fake
    def _(x, k):
        return None

    def f(x, y):
        h = torch.sin(y) + 1.0
        scale_(h, 3.0)
        scale_(x, 2.0)  # the caller's tensor
        return torch.relu(h) * x

    x, y = torch.randn(6, 5), torch.randn(6, 5)
    c = torch.compile(f, backend="neuron")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            xc, xe = x.clone(), x.clone()
            torch.testing.assert_close(c(xc, y), f(xe, y))
            torch.testing.assert_close(xc, xe)
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    st = torchneuron_jit.stats()
    assert ours == [] and st["eager_fallbacks"] == 0 and st["graphs_compiled"] == 1, ours
    assert "higher_order::auto_functionalized_v2" in st["fallback_ops"]


def test_flex_attention_and_map_are_fallback_nodes():
    from functorch.experimental.control_flow import map as control_map
    from torch.nn.attention.flex_attention import flex_attention

    def causal(score, b, h, q, kv):
        return torch.where(q >= kv, score, -float("inf"))

    def attend(q, k, v):
        return torch.relu(flex_attention(torch.sin(q), k, v, score_mod=causal)) + 1.0

    def mapped(xs, y):
        return torch.relu(control_map(lambda x, y: x.sin() + y, xs * 2.0, y)) - 1.0

    q = torch.randn(1, 2, 16, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's eager "without torch.compile()" note
        st = _compiled_cleanly(attend, (q, q.cos(), q.exp()), (q * 2, q.sin(), q))
    assert "higher_order::flex_attention" in st["fallback_ops"]
    torch._dynamo.reset()
    st = _compiled_cleanly(mapped, (torch.randn(3, 4), torch.randn(4)), (torch.randn(3, 4), torch.randn(4)))
    assert "higher_order::map_impl" in st["fallback_ops"]


def test_graphs_that_differ_inside_a_subgraph_have_different_keys():
    """The fallback node of a higher-order op names its subgraphs by their
    code: the graph's key (what the persistent cache keys its lowering by)
    tells two branches apart."""
    from torch.fx.experimental.proxy_tensor import make_fx
    keys = set()
    for branch in (torch.cos, torch.sin):
        def f(x):
            return torch.cond(x.sum() > 0, lambda t: branch(t) + 1, lambda t: t - 1, (x * 2,))
        with torch.no_grad():
            gm = make_fx(f, tracing_mode="fake")(torch.randn(4))
        keys.add(from_fx(gm).graph.key(b""))
    assert len(keys) == 2


def test_nested_compile_region_calls_are_inlined_and_fused():
    """torch.compiler.nested_compile_region (the recipe for compiling a
    repeated layer once) makes invoke_subgraph calls: as fallback nodes each
    layer would run eagerly. Their bodies are inlined into the graph."""
    layer = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()

    @torch.compiler.nested_compile_region
    def block(x):
        return torch.sin(layer(x)) * 2.0 + x

    def f(x):
        return block(block(x)).relu()

    st = _compiled_cleanly(f, (torch.randn(4, 16),), (torch.randn(4, 16),))
    assert not any(op.startswith("higher_order::") for op in st["fallback_ops"]), st["fallback_ops"]
    assert st["kernels_compiled"] >= 2


def test_jit_runs_a_function_with_torch_cond_eagerly_and_eager_cond_still_works_after():
    """jit's recorder is a dispatch mode, which refused higher-order ops:
    torch.cond inside a jitted function raised NotImplementedError in the
    user's call. It runs eagerly with one warning naming the op. Eager
    torch.cond compiles itself with Dynamo, which marked its frames skipped
    for good under the mode: every torch.cond after it, jitted or not,
    raised Unsupported."""
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t.cos() + 1, lambda t: t.exp() - 1, (x * 2,))

    j = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in (torch.randn(8), -torch.randn(8).abs(), torch.randn(8).abs(), torch.randn(5)):
            torch.testing.assert_close(j(x), f(x))
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(ours) == 1 and "torch.ops.higher_order.cond" in ours[0], ours


def test_istft_and_a_static_interpolate_keep_eagers_kernels():
    """Decomposed, istft's unfold_backward became 512 index_add, select and
    slice nodes (13-22x eager's time), and F.interpolate's nearest mode an
    index.Tensor gather (5x): both stay whole, eager's kernels as fallback
    nodes, with eager's answers."""
    window = torch.hann_window(64)

    def denoise(wave):
        spec = torch.stft(wave, 64, 16, window=window, return_complex=True)
        return torch.istft(spec * torch.sigmoid(spec.abs()), 64, 16, window=window, length=wave.shape[-1])

    st = _compiled_cleanly(denoise, (torch.randn(2, 4000),), (torch.randn(2, 4000),))
    assert "aten::unfold_backward" in st["fallback_ops"] and "aten::index_add" not in st["fallback_ops"], st
    torchneuron_jit.reset_stats()

    def upsample(x):
        return torch.nn.functional.interpolate(x * 2.0, scale_factor=2, mode="nearest") + 1.0

    jf = torchneuron_jit.jit(upsample)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 16, 16)
            torch.testing.assert_close(jf(x), upsample(x))
    ops = torchneuron_jit.stats()["fallback_ops"]
    assert "aten::upsample_nearest2d" in ops and "aten::index.Tensor" not in ops, ops


@pytest.mark.parametrize("kwargs,dims,op", [
    pytest.param(kw, dims, op, id=f"{kw['mode']}{dims}d") for kw, dims, op in [
        ({"scale_factor": 2, "mode": "nearest"}, 2, "upsample_nearest2d"),
        ({"scale_factor": 1.5, "mode": "nearest-exact"}, 2, "_upsample_nearest_exact2d"),
        ({"scale_factor": 2, "mode": "bilinear", "align_corners": False}, 2, "upsample_bilinear2d"),
        ({"scale_factor": 0.6, "mode": "bicubic", "align_corners": True}, 2, "upsample_bicubic2d"),
        ({"scale_factor": 2.0, "mode": "linear"}, 1, "upsample_linear1d"),
        ({"scale_factor": 2, "mode": "trilinear"}, 3, "upsample_trilinear3d")]])
def test_interpolate_through_torch_compile_is_eagers_kernel(kwargs, dims, op):
    """aot_autograd traces with the Python dispatcher on, which ran torch's
    Python kernels of F.interpolate's ops before our table kept them whole:
    index and arithmetic chains 5-13x eager's time. Each is one fallback
    node, eager's kernel, in Dynamo's static graph and its dynamic one (the
    second size), and torch's Python kernels are back after the compile."""
    def f(x):
        return torch.nn.functional.interpolate(x * 2.0, **kwargs) + 1.0

    packets = [getattr(torch.ops.aten, name) for name in ("upsample_nearest2d", "upsample_bilinear2d")]
    kernels = {(p, o): dict(getattr(p, o).py_kernels) for p in packets for o in ("vec", "default")}
    sizes = [(10,) * dims, (13,) * dims, (17,) * dims]
    st = _compiled_cleanly(f, *[(torch.randn(2, 3, *s),) for s in sizes])
    ops = set(st["fallback_ops"])
    assert f"aten::{op}" in ops and ops <= {f"aten::{op}", "aten::mul.Tensor", "aten::add.Tensor"}, ops
    assert {k: dict(getattr(p, o).py_kernels) for k in kernels for p, o in [k]} == kernels


def _ops_through_both_doors(fn, inputs):
    """The ops that ran through PyTorch when fn took each input through
    torch.compile (_compiled_cleanly), then through jit (parity with eager
    on every call): a set per door."""
    doors = [set(_compiled_cleanly(fn, *[(x,) for x in inputs])["fallback_ops"])]
    torchneuron_jit.reset_stats()
    jf = torchneuron_jit.jit(fn)
    with torch.no_grad():
        for x in inputs:
            torch.testing.assert_close(jf(x), fn(x))
    return doors + [set(torchneuron_jit.stats()["fallback_ops"])]


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_reflect_and_replicate_padding_is_eagers_kernel_through_both_doors(mode, dims):
    """F.pad's reflect and replicate modes (Conv2d's padding_mode="reflect",
    a vocoder's ReflectionPad1d, stft's center=True): our table decomposed
    them into index gathers, 3.6-12x eager's time through either door. Each
    is one node now, eager's kernel, at every size."""
    def f(x):
        return torch.nn.functional.pad(x * 2.0, (2, 1) * dims, mode=mode) + 1.0

    op = f"aten::{'reflection' if mode == 'reflect' else 'replication'}_pad{dims}d"
    for ops in _ops_through_both_doors(f, [torch.randn(2, 3, *(n,) * dims) for n in (9, 12, 15)]):
        assert op in ops and "aten::index.Tensor" not in ops, ops


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_circular_padding_is_eagers_kernel_through_both_doors(dims):
    """F.pad's circular mode (Conv2d's padding_mode="circular"): its C++
    composite writes each wrapped border into a slice of an empty tensor,
    which the functional graph made into a copy of the whole result per
    slice (6x eager's time through either door). It is one node now,
    torchneuron::pad_circular, eager's kernel, at every size; the swaps
    that make it are undone after the trace."""
    def f(x):
        return torch.nn.functional.pad(x * 2.0, (2, 1) * dims, mode="circular") + 1.0

    nn_pad = torch._C._nn.pad
    for ops in _ops_through_both_doors(f, [torch.randn(2, 3, *(n,) * dims) for n in (5, 7, 9)]):
        assert "torchneuron::pad_circular" in ops and "aten::slice_scatter" not in ops, ops
    assert torch._C._nn.pad is nn_pad and not torch.ops.aten._pad_circular.default.py_kernels


def test_std_of_a_row_whose_variance_overflows_float32_is_eagers():
    """torch.std decomposed to sqrt(var) held its variance in float32: a
    standard deviation above ~1.8e19 was inf where eager, which keeps the
    variance in double, gives 5.77e28. std stays whole (eager's kernel)."""
    x = torch.randn(2, 300)
    x[1, 9] = 1e30

    def f(t):
        return t.std(-1) * 1.0, torch.std_mean(t, -1)[0] + 0.0

    _compiled_cleanly(f, (x,), (x * 0.5,))
    jf = torchneuron_jit.jit(f)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jf(x), f(x))
    assert torch.isfinite(f(x)[0]).all()
