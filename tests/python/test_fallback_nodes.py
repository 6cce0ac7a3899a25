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
