"""argmax / argmin kernels (csrc/lowering/fuse.c argreduce_lowerable,
codegen.c cg_argreduce, runtime.c tn_rt_argreduce_*): over the last dim or
every dim, with the default settings, compared with eager
exactly: the same index, dtype int64, shape (keepdim) and errors.

Each test also checks that the op ran in a generated kernel (the compile log
names it) and nothing fell back to eager.
"""
import math

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import config

pytestmark = pytest.mark.usefixtures("fresh_backend")

inf, nan = math.inf, math.nan
ARGMAX, ARGMIN = "aten.argmax.default", "aten.argmin.default"


def _check(compiled, f, *args, lowered=(ARGMAX,), dynamic=False, calls=None):
    config.log = "compile"
    c = torch.compile(f, backend="neuron", dynamic=dynamic)
    with torch.no_grad():
        for call in calls or [args]:
            got, want = c(*call), f(*call)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
                assert torch.equal(g, w), (g, w)
    compiled.assert_lowered(*lowered)


def _values(rows, cols, seed=0):
    """Random rows with ties, NaN, infinities and signed zeros placed in some."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x[1, :] = 2.0                                   # all tied: the first wins
    x[2, cols // 2] = nan                           # NaN beats everything
    x[3, 5], x[3, cols - 2] = nan, nan              # the first NaN wins
    x[4, cols - 1], x[4, 0] = inf, -inf
    x[5, :] = -0.0
    x[5, 7] = 0.0                                   # -0.0 and 0.0 tie
    x[6, cols - 1] = 50.0                           # the last element of a long row
    return x


@pytest.mark.isa_parity
@pytest.mark.parametrize("cols", [1, 7, 1000, 1024, 2500])
def test_last_dim_with_ties_nan_inf_and_signed_zeros(compiled, cols):
    x = _values(8, max(cols, 8))[:, :cols].contiguous()
    _check(compiled, lambda x: (x.argmax(-1), x.argmin(dim=1)), x, lowered=(ARGMAX, ARGMIN))


@pytest.mark.parametrize("keepdim", [False, True])
def test_every_dim_and_keepdim(compiled, keepdim):
    x = _values(8, 300)[2:].reshape(2, 3, 300)
    _check(compiled, lambda x: (torch.argmax(x, keepdim=keepdim), torch.argmin(x, -1, keepdim),
                                torch.argmax(x, dim=2, keepdim=keepdim)), x, lowered=(ARGMAX, ARGMIN))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                                   torch.int16, torch.int8, torch.uint8])
def test_dtypes(compiled, dtype):
    x = _values(8, 600)
    if not dtype.is_floating_point:
        x = torch.nan_to_num(x * 40, nan=3, posinf=120, neginf=-120).to(dtype)
    else:
        x = x.to(dtype)
    _check(compiled, lambda x: (x.argmax(-1), x.argmin(-1)), x, lowered=(ARGMAX, ARGMIN))


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "computed"])
def test_layouts_and_a_computed_input(compiled, layout):
    x = _values(12, 400)
    if layout == "transposed":
        x = x.t().contiguous().t()
    elif layout == "sliced":
        x = _values(12, 800)[:, ::2]
    elif layout == "expanded":
        x = x[:1].expand(12, 400)
    f = (lambda x: (x * 2 - 1).argmax(-1)) if layout == "computed" else (lambda x: x.argmax(-1))
    _check(compiled, f, x)


def test_large_across_threads_and_dynamic_shapes(compiled):
    _check(compiled, lambda x: x.argmax(-1), _values(4096, 512))
    calls = [(_values(r, c, seed=r),) for r, c in ((8, 100), (9, 33), (16, 2000))]
    _check(compiled, lambda x: x.argmin(-1), dynamic=True, calls=calls, lowered=(ARGMIN,))


def test_greedy_decoding_over_a_vocabulary(compiled):
    logits = torch.randn(4, 50257)
    _check(compiled, lambda x: torch.argmax(torch.log_softmax(x, -1), -1), logits)


def test_no_rows_gives_an_empty_result(compiled):
    _check(compiled, lambda x: x.argmax(-1), torch.randn(0, 5))


def test_an_empty_row_raises_like_eager():
    f = lambda x: x.argmax(-1)  # noqa: E731
    x = torch.randn(3, 0)
    with pytest.raises(IndexError) as want:
        f(x)
    with torch.no_grad(), pytest.raises(IndexError) as got:
        torch.compile(f, backend="neuron")(x)
    assert "Expected reduction dim 1 to have non-zero size" in str(got.value)
    assert "Expected reduction dim 1 to have non-zero size" in str(want.value)


def test_a_leading_dim_stays_with_eager(compiled):
    x = _values(8, 50)
    f = lambda x: x.argmax(0)  # noqa: E731
    with torch.no_grad():
        assert torch.equal(torch.compile(f, backend="neuron")(x), f(x))
    assert compiled.fallbacks()[ARGMAX] == 1
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_bool_input_stays_with_eager_and_raises_the_same():
    f = lambda x: x.argmax(-1)  # noqa: E731
    x = torch.tensor([[True, False]])
    with pytest.raises(RuntimeError) as want:
        f(x)
    with torch.no_grad(), pytest.raises(Exception) as got:
        torch.compile(f, backend="neuron")(x)
    assert "bool" in str(got.value) and "bool" in str(want.value)


def test_argmax_and_argmin_are_lowered_ops():
    assert {"aten::argmax", "aten::argmin"} <= set(torchneuron_jit.lowered_ops())
