"""2-d max pooling without padding as the maximum of its window's strided
views (backend._max_pools_as_maxima): one generated kernel, eager's values
(NaN and -inf included) and strides, through both doors; what it cannot
take (padding, indices that are read) stays eager's max_pool2d."""
import pytest
import torch
import torch.nn.functional as F

import torchneuron_jit

pytestmark = pytest.mark.usefixtures("fresh_backend")

POOL = "aten::max_pool2d_with_indices"


def _run(door, f, *args):
    with torch.no_grad():
        g = torchneuron_jit.jit(f) if door == "jit" else torch.compile(f, backend="neuron", dynamic=False)
        g(*args)
        return g(*args)


def _specials(shape, layout):
    """Random values with NaN, -inf, +inf and -0.0 in places, in layout."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1)
    n = flat.numel()
    flat[torch.randint(0, n, (max(1, n // 50),), generator=g)] = float("nan")
    flat[torch.randint(0, n, (max(1, n // 50),), generator=g)] = float("-inf")
    flat[torch.randint(0, n, (max(1, n // 80),), generator=g)] = float("inf")
    flat[torch.randint(0, n, (max(1, n // 80),), generator=g)] = -0.0
    return x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x


def _ops():
    return torchneuron_jit.stats()["fallback_ops"]


@pytest.mark.parametrize("door", ["jit", "neuron"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("kernel, stride, shape", [
    (2, None, (2, 3, 8, 10)),          # the common 2x2 pool
    (2, 2, (2, 3, 9, 11)),             # odd sizes: the last row and column are left out
    (3, 2, (1, 4, 11, 9)),             # overlapping windows
    ((2, 3), (1, 2), (2, 2, 7, 12)),   # rectangular windows and strides
])
def test_a_max_pool_is_one_kernel_with_eagers_values_and_strides(door, layout, kernel, stride, shape):
    x = _specials(shape, layout)

    def f(t):
        return F.max_pool2d(t * 2.0, kernel, stride) + 1.0

    got, want = _run(door, f, x), f(x)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert got.stride() == want.stride()
    ops = _ops()
    assert POOL not in ops and "aten::maximum" not in ops, ops
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("door", ["jit", "neuron"])
def test_a_pool_after_a_convolution_and_an_unbatched_input(door):
    """SmallCNN's conv -> relu -> pool (the pool reads what oneDNN wrote,
    channels-last), and a 3-d (C, H, W) input."""
    conv = torch.nn.Conv2d(3, 8, 3, padding=1).eval()
    x, y = _specials((2, 3, 10, 12), "nchw").nan_to_num(), _specials((3, 10, 12), "nchw")

    def f(t, u):
        return F.max_pool2d(F.relu(conv(t)), 2), F.max_pool2d(u, 2)

    for g, w in zip(_run(door, f, x, y), f(x, y)):
        torch.testing.assert_close(g, w, equal_nan=True)
        assert g.stride() == w.stride()
    assert POOL not in _ops()


def test_a_result_whose_strides_would_differ_from_eagers_stays_eagers():
    """A (C, H, W) input laid out channels-first in memory: the maximum of
    its views keeps that order, eager's max_pool2d gives a contiguous
    result; the pool stays eager's rather than change the strides."""
    x = _specials((8, 10, 12), "nchw").permute(1, 2, 0).contiguous().permute(2, 0, 1)

    def f(t):
        return F.max_pool2d(t * 2.0, 2)

    got, want = _run("neuron", f, x), f(x)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert got.stride() == want.stride()
    assert _ops().get(POOL), _ops()


@pytest.mark.parametrize("case", ["padding", "indices", "ceil_mode", "dilation"])
def test_what_it_cannot_take_stays_eagers_max_pool(case):
    x = _specials((2, 3, 9, 9), "nchw")
    kwargs = {"padding": {"padding": 1}, "indices": {"return_indices": True}, "ceil_mode": {"ceil_mode": True},
              "dilation": {"dilation": 2}}[case]

    def f(t):
        return F.max_pool2d(t, 3, 2, **kwargs)

    got, want = _run("neuron", f, x), f(x)
    for g, w in zip(got, want) if case == "indices" else [(got, want)]:
        torch.testing.assert_close(g, w, equal_nan=True)
    assert _ops().get(POOL), _ops()


def _opinfo_samples():
    """The float32 samples of PyTorch's max_pool2d OpInfo that have no
    padding, dilation, ceil_mode or indices: the ones the rewrite takes
    when their sizes allow."""
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == "nn.functional.max_pool2d")
    out = []
    for s in op.sample_inputs("cpu", torch.float32):
        kw, args = dict(s.kwargs), list(s.args)
        names = ["kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"]
        kw.update(zip(names, args))
        pad, dil = kw.get("padding", 0), kw.get("dilation", 1)
        if pad in (0, (0, 0), [0, 0]) and dil in (1, (1, 1), [1, 1]) and not kw.get("ceil_mode") \
                and not kw.get("return_indices"):
            out.append((op.op, s))
    return out


def test_the_opinfo_samples_it_takes_match_eager(monkeypatch):
    """Every float32 sample of the max_pool2d OpInfo without padding,
    dilation, ceil_mode or indices (60 of 1440: odd sizes, overlapping
    windows, 3-d and channels-last inputs), compiled alone: eager's values
    and strides, and the rewrite ran."""
    from torchneuron_jit import backend
    rewritten = []
    rewrite = backend._max_pools_as_maxima
    monkeypatch.setattr(backend, "_max_pools_as_maxima", lambda g: rewritten.append(rewrite(g)) or rewritten[-1])
    samples = _opinfo_samples()
    for op, s in samples:
        torch._dynamo.reset()

        def f(t):
            return op(t, *s.args, **s.kwargs)

        with torch.no_grad():
            want, got = f(s.input), torch.compile(f, backend="neuron", dynamic=False)(s.input)
        torch.testing.assert_close(got, want, equal_nan=True)
        assert got.stride() == want.stride() or got.numel() <= 1, (s.input.shape, s.args, s.kwargs)
    assert len(samples) >= 40 and sum(rewritten) >= len(samples) // 2, (len(samples), sum(rewritten))
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0
