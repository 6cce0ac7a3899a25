"""aten.cat lowered by writing into its result (csrc/lowering/fuse.c
cat_slot; backend._fuse, _finish_cats, _cat_finish) and pointwise
kernels over tiles of short rows (csrc/neuron_backend/codegen.c): results
against eager, through torch.compile(backend="neuron")."""
import math

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import backend, config


pytestmark = pytest.mark.usefixtures("fresh_backend")

CAT = "aten.cat.default"


@pytest.fixture
def built(monkeypatch):
    """The plans backend._build returned, in order."""
    made = []
    real = backend._build

    def spy(gm, example_inputs, eager=None):
        out = real(gm, example_inputs, eager)
        made.append(out)
        return out

    monkeypatch.setattr(backend, "_build", spy)
    return made


def _targets(gms):
    """Every call_function target of the plans' fused graphs (a step each), by name."""
    names = []
    for plan in gms:
        for node in plan.source.graph.nodes:
            if node.op == "call_function":
                names.append(getattr(node.target, "__name__", str(node.target)))
    return names


def _same(got, want, equal_nan=False, strides=False):
    """got equals eager's want: dtype, shape, values (exact for integers and
    bool), and strides too when asked."""
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w, equal_nan, strides)
        return
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, equal_nan=equal_nan)
    else:
        assert torch.equal(got, want), (got, want)
    if strides and want.numel() > 1:
        assert got.stride() == want.stride(), (got.stride(), want.stride())


def _run(f, *args, equal_nan=False, strides=False, **compile_kw):
    """f compiled and eager on args, compared; returns the compiled function."""
    c = torch.compile(f, backend="neuron", **compile_kw)
    with torch.no_grad():
        got = c(*args)
    _same(got, f(*args), equal_nan, strides)
    return c


def _assert_cat_rewritten(built, fallback0):
    """Some kernel wrote into a cat's result: _cat_finish in the graph, no
    aten.cat left, none counted as run through PyTorch, no graph fell back."""
    names = _targets(built)
    assert "_cat_finish" in names, names
    assert CAT not in names, names
    assert (backend.fallback_ops - fallback0)[CAT] == 0, dict(backend.fallback_ops)
    st = torchneuron_jit.stats()
    assert st["eager_fallbacks"] == 0 and st["kernels_compiled"] >= 1, st


def _special(shape, dtype=torch.float32, seed=1):
    """Random values with NaN, +-Inf, +-0 and large magnitudes sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    flat = x.view(-1)
    specials = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30, 1e-30])
    flat[: min(flat.numel(), specials.numel())] = specials[: flat.numel()]
    flat[-min(flat.numel(), 3):] = torch.tensor([math.inf, math.nan, -math.inf])[: flat.numel()]
    return x.to(dtype)


# -- cat: kernels writing into the cat's result ------------------------------------

@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cat_of_kernel_results_along_each_dim(built, dim, parts):
    """Parts from different fused chains land at their offsets along dim
    (the outer dim, a middle one of a 4-D result, and the last)."""
    fallback0 = backend.fallback_ops.copy()

    def f(x, y, z):
        chunks = [x.exp() + 1, y.sin() * 2]
        if parts == 3:
            chunks.append((z * x).abs() - 0.5)
        return torch.cat(chunks, dim=dim)

    shape = [3, 5, 7, 6]
    args = []
    for i in range(3):  # each part of another length along dim
        s = list(shape)
        s[dim] += i
        args.append(torch.randn(s))
    if parts == 3:  # z * x needs x's shape: the third part reads a z of x's shape
        args[2] = torch.randn(args[0].shape)
    _run(f, *args)
    _assert_cat_rewritten(built, fallback0)


ROPE_SHAPES = [(2, 4, 16, 64), (1, 2, 3, 8)]


def _rotate(q, cos, sin):
    h = q.shape[-1] // 2
    return q * cos + torch.cat((-q[..., h:], q[..., :h]), -1) * sin


@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=str)
def test_rotate_half(built, compiled, shape):
    """LLaMA's rotate_half: the lone negation becomes a kernel (one op)
    writing the first half of the cat, the input's other half is copied in,
    and the rotary combination reads the cat's result."""
    config.log = "compile"
    fallback0 = backend.fallback_ops.copy()
    torch.manual_seed(0)
    q = torch.randn(shape)
    cos, sin = torch.randn(shape[-2:]), torch.randn(shape[-2:])
    _run(_rotate, q, cos, sin)
    groups = compiled.assert_lowered("aten.neg.default", "aten.mul.Tensor", "aten.add.Tensor")
    assert ["aten.neg.default"] in groups, groups
    _assert_cat_rewritten(built, fallback0)


ROPE_VARIANTS = {
    # q and k of one layer, each rotated
    "q_and_k": (lambda q, k, cos, sin: (_rotate(q, cos, sin), _rotate(k, cos, sin)),
                lambda: (torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)[:, :, :3], torch.randn(3, 8),
                         torch.randn(3, 8))),
    # heads split off a projection: q a transposed view of a matmul's result
    "from_linear": (lambda h, w, cos, sin: _rotate((h @ w).view(2, 3, 4, 8).transpose(1, 2), cos, sin),
                    lambda: (torch.randn(2, 3, 32), torch.randn(32, 32), torch.randn(3, 8), torch.randn(3, 8))),
    # half precision
    "bfloat16": (lambda q, cos, sin: _rotate(q, cos, sin),
                 lambda: (torch.randn(2, 4, 16, 64).bfloat16(), torch.randn(16, 64).bfloat16(),
                          torch.randn(16, 64).bfloat16())),
}


@pytest.mark.parametrize("name", sorted(ROPE_VARIANTS))
def test_rotate_half_variants(name):
    f, make = ROPE_VARIANTS[name]
    args = make()
    c = torch.compile(f, backend="neuron")
    with torch.no_grad():
        got = c(*args)
    want = f(*args)
    if name == "bfloat16":  # one rounding per kernel, not one per op: compared with float32
        ref = f(*(a.float() for a in args))
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        assert bool(((got.float() - ref).abs() <= (want.float() - ref).abs() + 2 ** -7 * ref.abs() + 1e-3).all())
    else:
        _same(got, want)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_rotate_half_with_gradients():
    """Inputs that need gradients: the graphs run for training (eagerly);
    values and gradients as eager's."""
    q = torch.randn(1, 2, 3, 16, requires_grad=True)
    cos, sin = torch.randn(3, 16), torch.randn(3, 16)
    out = torch.compile(_rotate, backend="neuron")(q, cos, sin)
    (out * out).sum().backward()
    got_grad, q.grad = q.grad, None
    want = _rotate(q, cos, sin)
    (want * want).sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(got_grad, q.grad)


def test_rotate_half_from_the_cache():
    """A second compile of the graph takes its kernels from the cache: the
    cat is rewritten the same way and the result is still eager's."""
    q, cos, sin = torch.randn(2, 4, 16, 64), torch.randn(16, 64), torch.randn(16, 64)
    for _ in range(2):
        torch._dynamo.reset()
        _run(_rotate, q, cos, sin)
    st = torchneuron_jit.stats()
    assert st["cache_misses"] == 1 and st["cache_hits"] == 1 and st["eager_fallbacks"] == 0, st


def test_kv_cache_append(built):
    fallback0 = backend.fallback_ops.copy()
    k, new = torch.randn(2, 4, 10, 16), torch.randn(2, 4, 1, 16)
    _run(lambda k, new: torch.cat([k, new * 0.5], dim=2), k, new)
    _assert_cat_rewritten(built, fallback0)


OTHER_PARTS = {
    "input": (lambda x, y: torch.cat([x.exp() + 1, y], 1), (5, 3)),
    "transposed_view": (lambda x, y: torch.cat([y.t(), x.exp() + 1], 1), (3, 5)),
    "strided_view": (lambda x, y: torch.cat([x.exp() + 1, y[:, ::2]], 1), (5, 8)),
    "cumsum": (lambda x, y: torch.cat([torch.cumsum(y, 1), x.exp() + 1, y.sin() * 2], 1), (5, 4)),
    "between_kernels": (lambda x, y: torch.cat([x.exp() + 1, y[:, 1:], x.cos() * 3], 1), (5, 4)),
}


@pytest.mark.parametrize("name", sorted(OTHER_PARTS))
def test_cat_copies_parts_not_from_kernels(built, name):
    """Graph inputs, views of them and results of ops run through PyTorch
    are copied into the cat's result at their offsets."""
    fallback0 = backend.fallback_ops.copy()
    f, yshape = OTHER_PARTS[name]
    _run(f, torch.randn(5, 6), torch.randn(yshape))
    _assert_cat_rewritten(built, fallback0)


KERNEL_PARTS = {
    "two_outputs_of_one_kernel": lambda x, y: (lambda a: torch.cat([a + 1, y, a * 2], 1))(x.exp()),
    "one_kernel_two_cats": lambda x, y: (lambda a: (torch.cat([a * 2, y], 1), torch.cat([y, (a + x).abs()], 1)))(
        x.exp()),
    "reduction": lambda x, y: torch.cat([x.sum(1, keepdim=True), x.exp() + 1, y.amax(1, keepdim=True) * 2], 1),
    "softmax": lambda x, y: torch.cat([x.softmax(-1), y * 2], 1),
    "matmul_epilogue": lambda x, y: torch.cat([torch.relu(x @ x.t()[:, :3] + 1), y * 2], 1),
    "factories": lambda x, y: torch.cat([torch.full_like(x, 2.0) * x, torch.ones(5, 2) * 3,
                                         torch.arange(5).float().unsqueeze(1) * y], 1),
    "where_masked_fill": lambda x, y: torch.cat([torch.where(x > 0, x, 0.0), (y * 2).masked_fill(y > 1, -1.0)], 1),
    "nested_cats": lambda x, y: torch.cat([torch.cat([x.exp() + 1, y * 3], 1) * 2, x.cos() * 2], 1),
    "stack": lambda x, y: torch.stack([x[:, :3].exp() + 1, y.sin() * 2], 1),
    "single_part": lambda x, y: torch.cat([x.exp() + 1], 1) * 2 + torch.cat([-y], 0).sum(),
}


@pytest.mark.parametrize("name", sorted(KERNEL_PARTS))
def test_cat_of_other_kernel_kinds(name):
    """Parts from multi-output kernels (into one cat and into two), row
    reductions, softmax, GEMM epilogues, factories, masks, nested cats."""
    _run(KERNEL_PARTS[name], torch.randn(5, 6), torch.randn(5, 3))
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("legacy", [False, True])
def test_cat_with_empty_parts(legacy):
    """An empty part (size 0 along dim) takes no room; the legacy 1-D empty
    tensor, skipped by eager whatever the others' rank, too, as an input
    and as a kernel's result."""
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    e = torch.empty(0) if legacy else torch.randn(4, 0)
    _run(lambda x, y, e: torch.cat([x.exp() + 1, e, y.sin() * 2, e * 2, x[:, :2] * y[:, :2]], 1), x, y, e)


def test_cat_promotes_dtypes():
    """An int32 part with float32 ones: the result is float32, as eager's."""
    a, x = torch.randint(-50, 50, (4, 5), dtype=torch.int32), torch.randn(4, 3)
    _run(lambda a, x: torch.cat([a * 3 + 1, x.exp() + 1, x.int() * 2], 1), a, x)
    _run(lambda a, x: torch.cat([x.double() * 2, x.exp() + 1]), a, x)


@pytest.mark.parametrize("dtypes", [(torch.int8, torch.int16), (torch.float16, torch.float32),
                                    (torch.bool, torch.int64)])
def test_cat_of_parts_of_two_dtypes_compiles(dtypes):
    """The graph takes a cat whose parts' dtypes differ (the result's is
    their promotion): no eager fallback of the whole graph, eager's values."""
    a = (torch.randn(3, 4) * 50).to(dtypes[0])
    b = (torch.randn(2, 4) * 50).to(dtypes[1])
    _run(lambda a, b: torch.cat([a, b * 2]) + 1, a, b)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_same_kernel_result_twice_in_one_cat():
    def f(x):
        y = x.exp() + 1
        return torch.cat([y, y, x.sin() * 2])
    _run(f, torch.randn(3, 4))


def test_part_also_returned_and_read_elsewhere():
    def f(x, z):
        y = x.exp() + 1
        w = z.sin() * 2
        c = torch.cat([y, w], 1)
        return c, y, w.sum(1), w.cumsum(0)
    _run(f, torch.randn(4, 5), torch.randn(4, 3))


def test_cat_result_feeds_later_chains(built):
    fallback0 = backend.fallback_ops.copy()

    def f(x, y, z):
        c = torch.cat([x.exp() + 1, y.sin() * 2], 1)
        return (c * 3).tanh() + z, (c.transpose(0, 1) * 2 - 1).abs(), c[:, 1:] * 0.5 + 1

    _run(f, torch.randn(6, 4), torch.randn(6, 5), torch.randn(6, 9))
    _assert_cat_rewritten(built, fallback0)


READ_ORDERS = {
    "whole_then_view": lambda c: ((c * 2 + 1).abs(), c[:, 1:] * 3 - 1),
    "view_then_whole": lambda c: (c[:, 1:] * 3 - 1, (c * 2 + 1).abs()),
    "kernel_then_eager": lambda c: ((c * 2 + 1).abs(), c.t().cumsum(0), c),
    "returned_as_view": lambda c: ((c * 2 + 1).abs(), c.view(2, 2, 9)),
    "reduction_after": lambda c: (c * 2 + 1).abs() + c.sum(1, keepdim=True),
    "into_second_cat": lambda c: ((lambda c2: (c2 * c2).abs())(torch.cat([c * 2, c[:, :3] + 1], 1)), c[:, 2:]),
}


@pytest.mark.parametrize("name", sorted(READ_ORDERS))
def test_cat_result_read_by_several(name):
    """The cat's result read whole, through views and by eager ops, in
    either order: no reader sees it overwritten (a kernel reading it last
    may take its buffer)."""
    g = READ_ORDERS[name]
    _run(lambda x, y: g(torch.cat([x.exp() + 1, y], 1)), torch.randn(4, 6), torch.randn(4, 3))


def test_cat_result_view_then_cat_again():
    """A cat's result read through a view by a kernel writing another cat."""
    def f(x, y):
        c = torch.cat([x.exp() + 1, y * 2], -1)
        return torch.cat([c[..., 1:] * 3, c.transpose(-1, -2).reshape(c.shape) - 1], -1)
    _run(f, torch.randn(2, 3, 4), torch.randn(2, 3, 4))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool], ids=str)
def test_cat_dtypes(built, dtype):
    fallback0 = backend.fallback_ops.copy()
    torch.manual_seed(0)
    if dtype == torch.bool:
        x, y = torch.randn(5, 6), torch.randn(3, 6)
        f = lambda x, y: torch.cat([x > 0, y < 1])  # noqa: E731
    elif dtype.is_floating_point:
        x, y = torch.randn(5, 6).to(dtype), torch.randn(3, 6).to(dtype)
        f = lambda x, y: torch.cat([x * 2 + 1, (y - 1).abs() * 3])  # noqa: E731
    else:
        x, y = torch.randint(-1000, 1000, (5, 6), dtype=dtype), torch.randint(-1000, 1000, (3, 6), dtype=dtype)
        f = lambda x, y: torch.cat([x * 2 + 1, (y - 1).abs() * 3])  # noqa: E731
    _run(f, x, y)
    _assert_cat_rewritten(built, fallback0)


def test_cat_dynamic_shapes():
    """Sizes change between calls (Dynamo makes the graph dynamic on the
    second one): every call as eager."""
    c = torch.compile(lambda x, y: torch.cat([x.exp() + 1, y.sin() * 2, x[:, :1]], 1) * 2, backend="neuron")
    with torch.no_grad():
        for n, m in [(4, 6), (7, 6), (9, 11)]:
            x, y = torch.randn(n, m), torch.randn(n, 3)
            _same(c(x, y), torch.cat([x.exp() + 1, y.sin() * 2, x[:, :1]], 1) * 2)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_rotate_half_dynamic_sequence_length():
    c = torch.compile(_rotate, backend="neuron")
    with torch.no_grad():
        for s in (5, 9, 12):
            q, cos, sin = torch.randn(1, 2, s, 16), torch.randn(s, 16), torch.randn(s, 16)
            _same(c(q, cos, sin), _rotate(q, cos, sin))
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_cat_of_channels_last_inputs():
    """Eager's cat of channels_last parts is channels_last: ours too, or at
    the least the same values, dtype and shape."""
    x = torch.randn(2, 3, 5, 4).to(memory_format=torch.channels_last)
    y = torch.randn(2, 2, 5, 4).to(memory_format=torch.channels_last)
    f = lambda x, y: torch.cat([x.exp() + 1, y * 2], 1)  # noqa: E731
    want = f(x, y)
    assert want.is_contiguous(memory_format=torch.channels_last)
    _run(f, x, y, strides=True)
    # contiguous parts: contiguous result
    _run(f, x.contiguous(), y.contiguous(), strides=True)


def test_stats_and_fallback_ops():
    """With a kernel part, aten.cat is not counted among the ops run through
    PyTorch and no graph falls back; a cat of inputs only stays with eager."""
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    backend.fallback_ops.clear()
    before = torchneuron_jit.stats()["eager_fallbacks"]
    _run(lambda x, y: torch.cat([x.exp() + 1, y], 1), x, y)
    assert CAT not in backend.fallback_ops, dict(backend.fallback_ops)
    assert torchneuron_jit.stats()["eager_fallbacks"] == before

    torch._dynamo.reset()
    backend.fallback_ops.clear()
    _run(lambda x, y: torch.cat([x, y], 1), x, y)
    assert backend.fallback_ops[CAT] == 1, dict(backend.fallback_ops)
    assert torchneuron_jit.stats()["eager_fallbacks"] == before


def test_threads_calling_compiled_rotate_half(in_threads):
    shape = (2, 4, 16, 64)
    c = torch.compile(_rotate, backend="neuron")
    with torch.no_grad():
        c(torch.randn(shape), torch.randn(shape[-2:]), torch.randn(shape[-2:]))

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(shape, generator=g)
        cos, sin = torch.randn(shape[-2:], generator=g), torch.randn(shape[-2:], generator=g)
        want = _rotate(q, cos, sin)
        with torch.no_grad():
            for _ in range(30):
                torch.testing.assert_close(c(q, cos, sin), want)

    in_threads(worker)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


# -- tiles of short rows ----------------------------------------------------------

TILE_SHAPES = [(8, 12, 128, 64), (4, 6, 20), (3, 70, 9)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


def _values(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype == torch.uint8:
        return torch.randint(0, 10, shape, generator=g, dtype=dtype)
    if not dtype.is_floating_point:
        return torch.randint(-10, 10, shape, generator=g, dtype=dtype)
    return (torch.randn(shape, generator=g) * 4).to(dtype)


def _chain(dtype):
    if dtype == torch.bool:
        return lambda x, y, b: torch.where(x, y ^ b, ~b) | (x & ~y)
    return lambda x, y, b: (x * 2 + y * b).abs() - 1


def _close(got, want, dtype, ref=None):
    """Half types: a kernel computes in float32 and rounds once, where eager
    rounds after every op: both are compared with the float32 evaluation
    ref, ours allowed eager's error and one rounding more."""
    if dtype not in (torch.float16, torch.bfloat16):
        _same(got, want)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    ours, eagers = (got.float() - ref).abs(), (want.float() - ref).abs()
    assert bool((ours <= eagers + torch.finfo(dtype).eps * ref.abs() + 1e-3).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", TILE_SHAPES, ids=str)
def test_tiles_of_sliced_rows_with_broadcast_bias(shape, dtype):
    """x[..., 1:] (rows not one run) and a last-dim bias: rows of the
    iteration space stay apart, short ones, in every dtype."""
    x = _values(shape[:-1] + (shape[-1] + 1,), dtype, 1)
    y, b = _values(shape, dtype, 2), _values(shape[-1:], dtype, 3)
    f = _chain(dtype)
    g = lambda x, y, b: f(x[..., 1:], y, b)  # noqa: E731
    with torch.no_grad():
        got = torch.compile(g, backend="neuron")(x, y, b)
    half = dtype in (torch.float16, torch.bfloat16)
    _close(got, g(x, y, b), dtype, g(x.float(), y.float(), b.float()) if half else None)
    st = torchneuron_jit.stats()
    assert st["kernels_compiled"] >= 1 and st["eager_fallbacks"] == 0, st


TILE_LAYOUTS = {
    # name: (function, inputs)
    "transposed": (lambda x, y, b: (x.transpose(-1, -2) * 2 + y * b).abs() - 1,
                   lambda: (torch.randn(4, 20, 6), torch.randn(4, 6, 20), torch.randn(20))),
    "permuted": (lambda x, y, b: (x.permute(2, 0, 1) * 2 + y * b).abs() - 1,
                 lambda: (torch.randn(70, 9, 3), torch.randn(3, 70, 9), torch.randn(9))),
    "middle_broadcast": (lambda x, y, b: (x * 2 + y * b).abs() - 1,
                         lambda: (torch.randn(4, 6, 20), torch.randn(4, 1, 20), torch.randn(4, 6, 1))),
    "expanded_input": (lambda x, y, b: (x * 2 + y * b).abs() - 1,
                       lambda: (torch.randn(4, 6, 20), torch.randn(4, 1, 20).expand(4, 6, 20),
                                torch.randn(20, 1).expand(20, 6).t())),
    "size1_middle": (lambda x, y, b: (x[:, 2:3, 1:] * 2 + y * b).abs() - 1,
                     lambda: (torch.randn(4, 5, 21), torch.randn(4, 1, 20), torch.randn(20))),
    "size1_rows": (lambda x, y, b: (x[..., 1:] * 2 + y * b).abs() - 1,
                   lambda: (torch.randn(6, 1, 21), torch.randn(6, 1, 20), torch.randn(20))),
    "nan_inf": (lambda x, y, b: ((x[..., 1:] * 2 + y * b).abs() - 1).exp().clamp(max=5) / y,
                lambda: (_special((4, 6, 21), seed=1), _special((4, 6, 20), seed=2), _special((20,), seed=3))),
    "strided_steps": (lambda x, y, b: (x[:, ::2, ::3] * 2 + y * b).abs() - 1,
                      lambda: (torch.randn(5, 12, 30), torch.randn(5, 6, 10), torch.randn(10))),
    "rows_at_tile_limit": (lambda x, y, b: (x[..., 1:] * 2 + y * b).abs() - 1,
                           lambda: (torch.randn(3, 7, 513), torch.randn(3, 7, 512), torch.randn(512))),
    "rows_over_tile_limit": (lambda x, y, b: (x[..., 1:] * 2 + y * b).abs() - 1,
                             lambda: (torch.randn(3, 5, 514), torch.randn(3, 5, 513), torch.randn(513))),
    "long_tile_of_short_rows": (lambda x, y, b: (x[..., 1:] * 2 + y * b).abs() - 1,
                                lambda: (torch.randn(2, 1000, 4), torch.randn(2, 1000, 3), torch.randn(3))),
}


@pytest.mark.parametrize("name", sorted(TILE_LAYOUTS))
def test_tiles_of_layouts(name):
    """Transposed, permuted, broadcast, stride-0 and sliced operands; values
    with NaN and Inf; rows of a size-1 middle dim; row lengths about the
    tile limit; the result's strides as eager's."""
    f, make = TILE_LAYOUTS[name]
    _run(f, *make(), equal_nan=True, strides=True)
    st = torchneuron_jit.stats()
    assert st["kernels_compiled"] >= 1 and st["eager_fallbacks"] == 0, st


MIXED = {
    "int32_plus_float": (lambda a, x: ((a * 2 + x).abs() - 1) * a,
                         lambda: (torch.randint(-20, 20, (4, 6, 21), dtype=torch.int32)[..., 1:], torch.randn(4, 6, 20))),
    "compare_to_bool": (lambda a, x: ((a[..., 1:] > 3) & (x < 0.5)) | (x * a[..., 1:] == 0),
                        lambda: (torch.randint(-5, 8, (3, 70, 10), dtype=torch.int64), torch.randn(3, 70, 9).round())),
    "where": (lambda a, x: torch.where(a[..., 1:] > 0, x * 2, -x).abs() + a[..., :-1],
              lambda: (torch.randint(-5, 5, (3, 70, 10), dtype=torch.int16), torch.randn(3, 70, 9))),
    "bool_times_float": (lambda a, x: (a[..., 1:] * x + 1).relu() - a[..., 1:].float(),
                         lambda: (torch.rand(4, 6, 21) > 0.5, torch.randn(4, 6, 20))),
    "uint8_with_int8": (lambda a, x: (a[..., 1:] * 3 + x).abs() - 1,
                        lambda: (torch.randint(0, 30, (4, 6, 21), dtype=torch.uint8),
                                 torch.randint(-30, 30, (20,), dtype=torch.int8))),
    "float16_with_float32": (lambda a, x: (a[..., 1:] * 2 + x).abs() - 1,
                             lambda: (torch.randn(4, 6, 21).half(), torch.randn(4, 1, 20))),
}


@pytest.mark.parametrize("name", sorted(MIXED))
def test_tiles_of_mixed_dtypes(name):
    f, make = MIXED[name]
    _run(f, *make(), strides=True)
    st = torchneuron_jit.stats()
    assert st["kernels_compiled"] >= 1 and st["eager_fallbacks"] == 0, st


@pytest.mark.parametrize("threads", [4, 5])
def test_large_tiled_launch_runs_in_parts(threads):
    """(64, 48, 40) of sliced rows: a launch split in parts (4: even ones,
    5: uneven), run on several threads; also kernels writing a cat's
    halves of that size."""
    config.kernel_threads = threads
    x, y, b = torch.randn(64, 48, 41), torch.randn(64, 48, 40), torch.randn(48, 1)
    f = lambda x, y, b: ((x[..., 1:] * 2 + y * b).abs() - 1).sigmoid()  # noqa: E731
    _run(f, x, y, b, strides=True)
    g = lambda x, y: torch.cat([x[..., 1:].exp() + 1, y * 2], -1) * 3  # noqa: E731
    _run(g, x, y)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_tiles_with_a_donated_input():
    """A cumsum's result (an intermediate read last by the kernel) may be
    the kernel's output buffer; the tile path must not overwrite what it
    still reads."""
    def f(x, y, b):
        c = torch.cumsum(x, -1)
        return (c * 2 + y * b).abs() - c, c[..., 1:] + b[1:]
    _run(f, torch.randn(4, 6, 20), torch.randn(4, 1, 20), torch.randn(20))


def test_kernels_writing_cat_slices_over_tiles(built):
    """Each part's kernel writes rows of the cat's result that are not one
    run (a slice along the last dim), from tiled inputs of several dtypes."""
    fallback0 = backend.fallback_ops.copy()

    def f(x, y, b, a):
        return torch.cat([(x[..., 1:] * 2 + b).abs() - 1, -y.transpose(-1, -2), a[..., 1:] * 0.5], -1)

    x, y = torch.randn(3, 70, 10), torch.randn(3, 7, 70)
    b, a = torch.randn(9), torch.randint(-9, 9, (3, 70, 5), dtype=torch.int32)
    _run(f, x, y, b, a)
    _assert_cat_rewritten(built, fallback0)
