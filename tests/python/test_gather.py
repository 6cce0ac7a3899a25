"""Gathers in fused kernels: embedding and index_select (dim 0) become loads
of the rows their index picks, checked against eager."""
import pytest
import torch

import torchneuron_jit
from torchneuron_jit import config

pytestmark = pytest.mark.usefixtures("fresh_backend")


def _run(compiled, f, *args, lowered=("aten.embedding.default",), exact=True):
    """Compiles and runs f; gathers and arithmetic must match eager exactly
    (transcendental functions, exact=False, to torch's tolerances)."""
    config.log = "compile"
    with torch.no_grad():
        got, want = torch.compile(f, backend="neuron")(*args), f(*args)
    torch.testing.assert_close(got, want, **({"rtol": 0, "atol": 0} if exact else {}))
    compiled.assert_lowered(*lowered)
    return got


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("idx_shape", [(), (7,), (3, 5), (2, 3, 4)])
def test_embedding_scaled_plus_position(compiled, idx_dtype, idx_shape):
    w = torch.randn(50, 24)
    ids = torch.randint(0, 50, idx_shape, dtype=idx_dtype)
    pos = torch.randn(24)
    _run(compiled, lambda w, ids, pos: torch.nn.functional.embedding(ids, w) * 4.0 + pos, w, ids, pos)


def test_strided_table_and_index(compiled):
    """A transposed table (rows at stride 1, elements at stride 50) and a
    sliced index."""
    w = torch.randn(24, 50).t()
    ids = torch.randint(0, 50, (6, 10))[:, ::2]
    _run(compiled, lambda w, ids: torch.nn.functional.embedding(ids, w) * 2 - 1, w, ids)


def test_rows_of_one_element_and_three_dim_tables(compiled):
    w1, w3 = torch.randn(9, 1), torch.randn(9, 3, 4)
    ids = torch.randint(0, 9, (5,))
    _run(compiled, lambda w, i: torch.nn.functional.embedding(i, w).exp() + 1, w1, ids, exact=False)
    _run(compiled, lambda w, i: torch.index_select(w, 0, i).sigmoid() * 3, w3, ids,
         lowered=("aten.index_select.default",), exact=False)


def test_tied_tables_and_a_gather_as_output(compiled):
    """Two lookups of one table in one kernel; the gathered rows returned too."""
    w = torch.randn(30, 16)
    a, b = torch.randint(0, 30, (4, 8)), torch.randint(0, 30, (4, 8))

    def f(w, a, b):
        e = torch.nn.functional.embedding(a, w)
        return e, e * 0.5 + torch.nn.functional.embedding(b, w)
    _run(compiled, f, w, a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64])
def test_table_dtypes(compiled, dtype):
    w = (torch.randn(20, 12) * 10).to(dtype)
    ids = torch.randint(0, 20, (3, 4))
    _run(compiled, lambda w, i: torch.nn.functional.embedding(i, w) * 2 + 1, w, ids)


def test_large_lookup_across_threads(compiled):
    w = torch.randn(1000, 256)
    ids = torch.randint(0, 1000, (8, 128))
    _run(compiled, lambda w, i: torch.nn.functional.embedding(i, w) * 16.0 + 1, w, ids)


@pytest.mark.parametrize("bad", [50, -1, 1000])
def test_index_out_of_range_raises_like_eager(bad):
    w = torch.randn(50, 8)
    ids = torch.randint(0, 50, (2, 5))
    ids[1, 3] = bad
    f = lambda w, i: torch.nn.functional.embedding(i, w) * 2 + 1  # noqa: E731
    with pytest.raises(IndexError) as want:
        f(w, ids)
    with torch.no_grad(), pytest.raises(IndexError) as got:
        torch.compile(f, backend="neuron")(w, ids)
    assert "index out of range" in str(got.value) and "index out of range" in str(want.value)


def test_gather_of_a_computed_table_stays_correct(compiled):
    """index_select of a tensor the group computes (same shape as the
    result): the table is not an input, so the gather stays outside."""
    x = torch.randn(6, 8)
    idx = torch.tensor([5, 0, 0, 3, 1, 2])
    f = lambda x, i: torch.index_select(x * 2, 0, i) + x  # noqa: E731
    config.log = "compile"
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(x, idx), f(x, idx))
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_embedding_model_with_dynamic_sequence(compiled):
    emb = torch.nn.Embedding(100, 32).eval()

    def f(ids):
        return emb(ids) * 5.65 + 1.0
    config.log = "compile"
    c = torch.compile(f, backend="neuron", dynamic=True)
    with torch.no_grad():
        for s in (5, 9, 17):
            ids = torch.randint(0, 100, (2, s))
            torch.testing.assert_close(c(ids), f(ids), rtol=0, atol=0)
    compiled.assert_lowered("aten.embedding.default")


# -- aten.gather: an element per index element, along one dim -------------------------

GATHER = ("aten.gather.default",)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_along_each_dim(compiled, dim):
    x = torch.randn(6, 10)
    idx = torch.randint(0, x.shape[dim], (4, 7))
    _run(compiled, lambda x, i: torch.gather(x, dim, i) * 2 + 1, x, idx, lowered=GATHER)


def test_gather_of_three_dim_tables_picks_labels(compiled):
    """The classifier pattern: log-probabilities of the labels, and a 3-D
    table along its middle dim."""
    logits = torch.randn(8, 5)
    labels = torch.randint(0, 5, (8, 1))
    x3 = torch.randn(3, 9, 4)
    i3 = torch.randint(0, 9, (2, 6, 4))
    _run(compiled, lambda x, i: -torch.gather(x, 1, i) * 0.5 + 3, logits, labels, lowered=GATHER)
    _run(compiled, lambda x, i: torch.gather(x, 1, i).abs() - 1, x3, i3, lowered=GATHER)


@pytest.mark.parametrize("layout", ["transposed_table", "sliced_table", "transposed_index", "expanded_index"])
def test_gather_strided_operands(compiled, layout):
    x, idx = torch.randn(6, 10), torch.randint(0, 10, (6, 10))
    if layout == "transposed_table":
        x, idx = torch.randn(10, 6).t(), torch.randint(0, 10, (6, 3))
    elif layout == "sliced_table":
        x, idx = torch.randn(6, 20)[:, ::2], torch.randint(0, 10, (5, 4))
    elif layout == "transposed_index":
        idx = torch.randint(0, 10, (10, 6)).t()
    else:
        idx = torch.randint(0, 10, (1, 10)).expand(6, 10)
    _run(compiled, lambda x, i: torch.gather(x, 1, i) * 3 - x[: i.shape[0], :1], x, idx, lowered=GATHER)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                                   torch.int8, torch.uint8, torch.bool])
def test_gather_table_dtypes(compiled, dtype):
    x = (torch.randn(5, 12) * 50).to(dtype)
    idx = torch.randint(0, 12, (5, 6))
    f = (lambda x, i: torch.logical_and(torch.gather(x, 1, i), torch.logical_not(x[:, :6]))) if dtype == torch.bool \
        else (lambda x, i: torch.gather(x, 1, i) * 2 + x[:, :6])
    _run(compiled, f, x, idx, lowered=GATHER)


def test_gather_large_across_threads_and_dynamic_shapes(compiled):
    x = torch.randn(512, 1000)
    idx = torch.randint(0, 1000, (512, 300))
    _run(compiled, lambda x, i: torch.gather(x, 1, i) * 2 + 1, x, idx, lowered=GATHER)
    config.log = "compile"
    f = lambda x, i: torch.gather(x, 1, i) * 2 + 1  # noqa: E731
    c = torch.compile(f, backend="neuron", dynamic=True)
    with torch.no_grad():
        for rows, cols, k in ((3, 7, 2), (5, 9, 4), (8, 4, 4)):
            xs, ids = torch.randn(rows, cols), torch.randint(0, cols, (rows, k))
            torch.testing.assert_close(c(xs, ids), f(xs, ids), rtol=0, atol=0)
    compiled.assert_lowered(*GATHER)


def test_gather_of_an_empty_index(compiled):
    x = torch.randn(4, 6)
    idx = torch.zeros(4, 0, dtype=torch.long)
    f = lambda x, i: torch.gather(x, 1, i) * 2 + 1  # noqa: E731
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, idx)
    assert got.shape == (4, 0)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("bad", [10, -1, 1 << 40])
def test_gather_index_out_of_range_raises_like_eager(bad):
    x = torch.randn(3, 10)
    idx = torch.randint(0, 10, (3, 4))
    idx[2, 1] = bad
    f = lambda x, i: torch.gather(x, 1, i) * 2 + 1  # noqa: E731
    with pytest.raises(RuntimeError) as want:
        f(x, idx)
    with torch.no_grad(), pytest.raises(RuntimeError) as got:
        torch.compile(f, backend="neuron")(x, idx)
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]
    assert "out of bounds for dimension 1 with size 10" in str(got.value)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_gather_of_a_computed_table_is_not_fused_into_its_group(compiled):
    """gather(x * 2, ...) of a table the same group would compute: the
    table must be a real operand, so the gather is not in that group."""
    x = torch.randn(6, 8)
    idx = torch.randint(0, 8, (6, 8))
    f = lambda x, i: torch.gather(x * 2, 1, i) + x  # noqa: E731
    config.log = "compile"
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(x, idx), f(x, idx), rtol=0, atol=0)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_gather_is_a_lowered_op():
    assert "aten::gather" in torchneuron_jit.lowered_ops()
