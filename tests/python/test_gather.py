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
