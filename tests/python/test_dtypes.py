"""Mixed-dtype pointwise fusion (csrc/lowering/fuse.c, csrc/neuron_backend/codegen.c):
comparisons, where / masked_fill, logical ops, casts between every pair of
dtypes, integer wrap-around, type promotion and layouts, each through
torch.compile(backend="neuron") against eager.

Every compiled function chains two or more pointwise ops (a single op is
left to eager on purpose) and the test checks a kernel was generated."""
import copy
import math

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import config

pytestmark = [pytest.mark.usefixtures("fresh_backend"), pytest.mark.isa_parity]

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
ALL = FLOATS + INTS + [torch.bool]

nan, inf = math.nan, math.inf


def _name(dtype):
    return str(dtype).replace("torch.", "")


# -- comparing against eager ------------------------------------------------------

def _flat(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


# torch.testing.assert_close's default (rtol, atol), to point at the elements it rejects
_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
               torch.float64: (1e-7, 1e-7)}


def _problems(got, want, labels=None, exact=False):
    """Differences between the compiled and the eager results, one line each."""
    got, want = _flat(got), _flat(want)
    if len(got) != len(want):
        return [f"{len(got)} outputs, eager has {len(want)}"]
    labels = labels or [f"output {i}" for i in range(len(want))]
    out = []
    for label, g, w in zip(labels, got, want):
        if g.dtype != w.dtype or g.shape != w.shape:
            out.append(f"{label}: got {g.dtype} {tuple(g.shape)}, eager {w.dtype} {tuple(w.shape)}")
            continue
        if w.is_floating_point():
            rtol, atol = (0, 0) if exact else _TOLERANCES[w.dtype]
            try:
                torch.testing.assert_close(g, w, equal_nan=True, rtol=rtol, atol=atol)
                continue
            except AssertionError:
                bad = ~torch.isclose(g.double(), w.double(), rtol=rtol, atol=atol, equal_nan=True)
        else:
            if torch.equal(g, w):
                continue
            bad = g != w
        idx = bad.nonzero()[:6].tolist()
        pairs = ", ".join(f"{tuple(i)}: got {g[tuple(i)].item()!r} want {w[tuple(i)].item()!r}" for i in idx)
        out.append(f"{label} ({w.dtype}): {int(bad.sum())} of {w.numel()} differ; {pairs}")
    return out


@pytest.fixture
def check(compiled):
    """check(f, *args, lowered=(), labels=None, exact=False, dynamic=False, calls=None, kernels=True):
    compiles f with the neuron back end (Dynamo's caches reset first), runs
    it and eager f under no_grad on args (or on each tuple of calls, with
    the same compiled function), and fails listing every output that
    differs (dtype, shape or values: exact for integers and bool, and for
    floats when exact), if no kernel was generated (unless kernels=False), if a graph fell back to
    eager, or if one of the ATen ops in lowered did not run inside a kernel.
    Returns (got, want)."""
    config.log = "compile,fallback"

    def run(f, *args, lowered=(), labels=None, exact=False, dynamic=False, calls=None, kernels=True):
        torch._dynamo.reset()
        compiled.mark()
        c = torch.compile(f, backend="neuron", dynamic=dynamic)
        problems = []
        with torch.no_grad():
            for call_args in (calls or [args]):
                want = f(*call_args)
                got = c(*call_args)
                problems += _problems(got, want, labels, exact)
        groups = compiled.groups()
        st = torchneuron_jit.stats()
        fused = {op for grp in groups for op in grp}
        if kernels and st["kernels_compiled"] <= compiled.kernels0:
            problems.append(f"no kernel generated: {st}")
        if st["eager_fallbacks"]:
            problems.append(f"a graph ran eagerly: {st}")
        for op in lowered:
            if op not in fused:
                problems.append(f"{op} not fused: groups {groups}, through PyTorch {dict(compiled.fallbacks())}")
        assert not problems, "\n".join(problems)
        return got, want

    return run


# -- values -----------------------------------------------------------------------

def _values(dtype):
    """24 values of dtype with the interesting ones of its kind: NaN, +-inf,
    +-0 and range ends for floats, the limits for integers."""
    if dtype.is_floating_point:
        big = torch.finfo(dtype).max
        v = [nan, inf, -inf, 0.0, -0.0, 1.5, -1.5, 2.0, 1.0, -1.0, big, -big, 1e-3, 3.0, 0.5, -0.5,
             100.25, -7.0, 2.0, 1.5, 1e-30, 65504.0, 0.0, -3.0]
        return torch.tensor(v, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.tensor([True, False, True, True, False, False] * 4)
    info = torch.iinfo(dtype)
    v = [info.min, info.max, 0, 1, info.max - 1, info.min + 1, 2, 100, 3, 7, 0, 1,
         info.max, info.min, 5, 6, 127, 64, 9, 2, 1, 0, 8, 100]
    if info.min < 0:
        v[6:12] = [-1, -2, -100, -7, 0, -1]
    return torch.tensor(v, dtype=torch.int64).to(dtype)


def _pair(dtype):
    """x and y of dtype: equal at some positions (NaN == NaN included), different at others."""
    x = _values(dtype)
    y = torch.cat([x[:8], x.flip(0)[8:]])
    return x, y


CMP = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}

SCALARS = {
    "float": [0.0, 1.5, -1.5, 1.50001, inf, -inf, nan, 1e-8, 70000.0, 1e40, 65504.0, 2],
    "int": [0, 1, -1, 2, 100, 127, 128, 300, -129, 2 ** 31, -(2 ** 31) - 1, 2 ** 40 + 3, 255, 2.5, -0.5],
    "bool": [True, False, 0, 1, 2, -1, 0.5],
}


def _scalars(dtype):
    return SCALARS["float" if dtype.is_floating_point else "bool" if dtype == torch.bool else "int"]


# -- 1. comparisons -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL, ids=_name)
def test_compare_every_op(check, dtype):
    """Every comparison of two dtype tensors, and of a dtype tensor with
    Python scalars, among them scalars not representable in dtype (converted
    as eager converts them: 1.50001 is 1.5 in float16, 300 is 44 in uint8)
    or of another kind (2.5 with an int tensor compares in float); each
    result stored and feeding a where."""
    x, y = _pair(dtype)
    scalars = _scalars(dtype)

    def f(x, y):
        outs = []
        for op in CMP.values():
            r = op(x, y)
            outs += [r, torch.where(r, x, y)]
        for s in scalars:
            for op in CMP.values():
                r = op(x, s)
                outs += [r, torch.where(r, y, x)]
        return tuple(outs)

    labels = ([f"x {n} y{suffix}" for n in CMP for suffix in ("", " -> where")]
              + [f"x {n} {s!r}{suffix}" for s in scalars for n in CMP for suffix in ("", " -> where")])
    check(f, x, y, labels=labels, exact=True,
          lowered=[f"aten.{n}.{kind}" for n in CMP for kind in ("Tensor", "Scalar")] + ["aten.where.self"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_name)
def test_half_compare_with_unrepresentable_scalar(check, dtype):
    """The scalar is rounded to the tensor's dtype, and so is a computed
    operand (x * 3 is compared as eager stores it)."""
    x = torch.tensor([1.5, 1.5078125, 1.49, 0.0, -0.0, 65504.0, inf, nan, 1.0009765625, 0.3, 21845.5]).to(dtype)
    y = x * 3  # eager's rounded product

    def f(x, y):
        return ((x * 1 == 1.50001), (x + 0 < 1.50001), (x * 1 >= 1e-8), (x - 0 == 70000.0),
                (x * 3) == y, (x * 3) > y, (x * 3) < y, (x * 3) >= 3.0029296875, (x + 0.1) == (y * 1))

    got, want = check(f, x, y, exact=True)
    if dtype == torch.float16:
        assert bool(want[0][0]) and bool(got[0][0])  # eager: 1.5 == 1.50001 in float16


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool], ids=_name)
def test_integer_compare_with_float_scalar_compares_in_float(check, dtype):
    """An integer or bool tensor compared with a Python float compares in
    float32 (eager's result type), whatever the float's value: 300.0 is not
    44 for uint8, inf is not INT64_MIN, and 2**24 + 1 equals 16777216.0.
    The default float dtype is not in the graph, so these comparisons stay
    with eager (no kernel required); the results must still be eager's."""
    x = torch.tensor([2 ** 24 + 1, 3, -5, 2 ** 31 - 1, 0, 1, 127, 2 ** 40], dtype=torch.int64).to(dtype)
    scalars = [300.0, 16777216.0, 2147483648.0, 1e10, -1e10, 1e30, inf, -inf, nan, 1.0, 0.0, 127.5]

    def f(x):
        return tuple(op(x * 1 if dtype != torch.bool else x.logical_not().logical_not(), s)
                     for s in scalars for op in CMP.values())

    labels = [f"x {n} {s!r}" for s in scalars for n in CMP]
    check(f, x, labels=labels, exact=True, kernels=False)


def test_uint8_compare_wraps_the_scalar(check):
    x = torch.tensor([0, 1, 43, 44, 45, 254, 255], dtype=torch.uint8)
    f = lambda x: ((x + 0) < 300, (x * 1) == 300, (x * 1) == -1, (x + 0) > -1, (x * 1) <= 256)  # noqa: E731
    got, want = check(f, x, exact=True)
    assert want[0].tolist() == [True, True, True, False, False, False, False]


def test_bool_tensor_compared_with_two(check):
    x = torch.tensor([True, False, True])
    y = torch.tensor([False, False, True])
    f = lambda x, y: (torch.logical_or(x, y) == 2, torch.logical_and(x, y) != 2,  # noqa: E731
                      torch.logical_not(x) == 1, torch.logical_not(y) < 0.5)
    check(f, x, y, exact=True, lowered=["aten.eq.Scalar", "aten.ne.Scalar"])


# -- 2. where / masked_fill ---------------------------------------------------------------

def _where_inputs():
    """x (float32 with NaN, +-inf, -0), cond, and a float32 0-dim tensor z
    (0-dim tensors are inputs: a tensor literal inside the compiled function
    would be a get_attr constant, which makes the whole graph run eagerly)."""
    torch.manual_seed(0)
    x = torch.randn(6, 8) * 4
    x[0, :4] = torch.tensor([nan, inf, -inf, -0.0])
    return x, x > 0.5, torch.tensor(-2.5)


WHERE_CASES = {
    # where(cond, f16 tensor, f32 0-dim tensor): a float16 result
    "f16_tensor_f32_0dim": lambda x, c, z: torch.where(x > 0, x.half(), z) * 2,
    "f32_0dim_bf16_tensor": lambda x, c, z: torch.where(c, z, x.bfloat16() + 1) * 3,
    "int8_and_f32": lambda x, c, z: torch.where(c, x.to(torch.int8), x * 0.5) + 1,
    "int32_and_scalar": lambda x, c, z: torch.where(x.abs() < 2, x.to(torch.int32), 2.5) * 3,
    "uint8_and_int64": lambda x, c, z: torch.where(c, x.abs().to(torch.uint8), x.to(torch.int64) - 1) + 1,
    "bool_and_bool": lambda x, c, z: torch.where(c, x != x, x > -1).logical_not(),
    "f16_and_f64": lambda x, c, z: torch.where(c, x.half(), x.double() * 3) - 1,
    "where_neg_inf_nan": lambda x, c, z: (torch.where(c, x, -inf) * 2, torch.where(x < 0, nan, x + 1)),
    "masked_fill_f16_neg_inf_nan": lambda x, c, z: (x.half().masked_fill(c, -inf).exp(),
                                                    (x * 2).half().masked_fill(~c, nan) + 1),
    "masked_fill_tensor_0dim": lambda x, c, z: ((x.half() * 2).masked_fill(c, z) + 1,
                                                (x.to(torch.int16) * 2).masked_fill(c, z) - 1),
    "masked_fill_int_values": lambda x, c, z: ((x.to(torch.int32) + 1).masked_fill(c, 2.7) * 3,
                                               (x.abs().to(torch.uint8) + 1).masked_fill(c, -1) + 1,
                                               (x > 1).masked_fill(c, False).logical_or(x < -3)),
}


@pytest.mark.parametrize("case", sorted(WHERE_CASES))
def test_where_and_masked_fill_mixed_dtypes(check, case):
    check(WHERE_CASES[case], *_where_inputs())


@pytest.mark.parametrize("dtype,mask_heads", [(torch.float32, 3), (torch.float16, 1), (torch.bfloat16, 3)],
                         ids=["float32-full_mask", "float16-broadcast_mask", "bfloat16-full_mask"])
def test_attention_mask_chain(check, dtype, mask_heads):
    """scores.masked_fill(mask == 0, -inf).softmax(-1) and an additive
    where(mask, 0, -inf) mask (softmax itself may stay out of the kernels)."""
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 5, 7).to(dtype)
    mask = (torch.rand(2, mask_heads, 5, 7) > 0.4).to(torch.int64)
    mask[0, 0, 1] = 0  # a fully masked row: NaN after softmax, in eager too

    def f(scores, mask):
        s = (scores * 0.125).masked_fill(mask == 0, float("-inf"))
        additive = torch.where(mask.bool(), 0.0, float("-inf")).to(scores.dtype)
        return s.softmax(-1), (scores + additive).float().softmax(-1)

    # with a mask of the scores' own shape, the masking runs in a kernel
    check(f, scores, mask, lowered=["aten.eq.Scalar", "aten.masked_fill.Scalar"] if mask_heads == 3 else [])


# -- 3. casts -----------------------------------------------------------------------

FLOAT_SOURCE = [nan, inf, -inf, 3e9, -3e9, 1e20, 300.5, -1.5, 70000.7, -129.9, 0.0, -0.0, 0.4, -0.7, 1.5,
                127.9, 128.5, 255.5, 256.5, -128.9, 32767.5, 40000.3, 65519.0, 65520.0, 2.0 ** 31 - 0.5,
                2.0 ** 63, -(2.0 ** 63), 1e-40, 1e-300, 1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -8 + 2 ** -40, 16777217.0]
INT_SOURCE = [2 ** 40 + 3, -1, 300, 2 ** 31, 0, 1, -(2 ** 63), 2 ** 63 - 1, 127, 128, -129, 255, 256, 65535,
              65536, -32769, 2 ** 24 + 1, 2 ** 53 + 1, 2 ** 31 - 1, -(2 ** 31) - 1, 2049, 4097]


def _cast_source(dtype):
    if dtype.is_floating_point:
        return torch.tensor(FLOAT_SOURCE, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.tensor([True, False, True, False])
    return torch.tensor(INT_SOURCE, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("src", ALL, ids=_name)
def test_cast_to_every_dtype(check, src):
    """x.to(dst) for every dst: stored as an output and used inside the
    kernel (compared with 0, cast on to float64), and also computed afresh
    and used only inside the kernel: the value a kernel computes with is the
    stored one, and both are eager's."""
    x = _cast_source(src)

    def f(x):
        outs = []
        for dst in ALL:
            y = x.to(dst)
            outs += [y, y != 0, y.to(torch.float64), x.to(dst) == 0, torch.where(x.to(dst) != 0, 1.5, -0.5)]
        return tuple(outs)

    labels = [f"{_name(src)} -> {_name(dst)}{s}" for dst in ALL
              for s in (" (stored)", " (stored) != 0", " (stored) -> float64", " (internal) == 0", " (internal) != 0")]
    check(f, x, labels=labels, exact=True, lowered=["aten._to_copy.default", "aten.ne.Scalar"])


@pytest.mark.parametrize("src", [torch.float16, torch.bfloat16], ids=_name)
def test_half_intermediate_rounded_before_cast(check, src):
    """x * 3 in a half type is rounded to that type before the cast (as eager rounds every op)."""
    x = torch.tensor([1.0009765625, 0.3, 21845.5, 21846.0, 1.5, 255.9, 85.33, -0.7, 100.1]).to(src)
    f = lambda x: ((x * 3).to(torch.float32), (x * 3).to(torch.int32), (x * 3).to(torch.float64) + 0.0)  # noqa: E731
    check(f, x, exact=True)


# -- 4. integer wrap-around -------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS, ids=_name)
def test_integer_overflow_wraps_like_eager(check, dtype):
    info = torch.iinfo(dtype)
    a = torch.tensor([info.max, info.max - 1, info.min, info.min + 1, info.max // 2 + 1, 100, 0, 1, 3, info.max,
                      info.min, 50], dtype=torch.int64).to(dtype)
    b = torch.tensor([1, 2, -1, -2, info.max // 2 + 1, 100, info.min, info.max, 3, info.max, info.min, 3],
                     dtype=torch.int64).to(dtype)

    def f(a, b):
        s, d, p = a + b, a - b, a * b
        # the wrapped values stored, and used inside the kernel only (computed afresh)
        return (s, s > 0, d, d < 0, p, p == 0, -a, (-a) >= 0, a.abs(), a.abs() < 0,
                torch.maximum(s, p), torch.minimum(d, p), torch.relu(s), s.clamp(-5, 5),
                p.clamp_min(3), d.clamp_max(-2), a + 7, a * 3, (a * 3) > a, torch.sub(a, b, alpha=3),
                (a + b) > 0, (a - b) < 0, (a * b) > 0, torch.maximum(a + b, a * b) == (a + b), (-a) > 0,
                a.abs() < 0, torch.relu(a * b) > 0, (a * b).clamp(-3, 3) < 0)

    labels = ["a+b", "a+b>0", "a-b", "a-b<0", "a*b", "a*b==0", "-a", "-a>=0", "abs", "abs<0", "max(s,p)",
              "min(d,p)", "relu(s)", "clamp(s,-5,5)", "clamp_min(p,3)", "clamp_max(d,-2)", "a+7", "a*3",
              "a*3>a", "sub alpha=3", "internal a+b>0", "internal a-b<0", "internal a*b>0",
              "internal max(a+b,a*b)==a+b", "internal -a>0", "internal abs<0", "internal relu(a*b)>0",
              "internal clamp(a*b,-3,3)<0"]
    check(f, a, b, labels=labels, exact=True,
          lowered=["aten.add.Tensor", "aten.mul.Tensor", "aten.gt.Scalar", "aten.maximum.default"])


def test_int8_sum_wraps_before_compare(check):
    a = torch.tensor([100, 127, -128, 60, -100], dtype=torch.int8)
    b = torch.tensor([100, 1, -1, 60, -100], dtype=torch.int8)
    f = lambda a, b: (((a + b) > 0), torch.maximum(a + b, a), (a * b).abs() < 10)  # noqa: E731
    got, want = check(f, a, b, exact=True)
    assert want[0].tolist() == [False, False, True, True, True]


def test_wrapped_integer_promoted_and_cast(check):
    """The wrapped value, not the int64 one the kernel computes with, is
    promoted to float or cast to another dtype."""
    a = torch.tensor([100, 127, -128, 60], dtype=torch.int8)
    b = torch.tensor([100, 1, -1, 60], dtype=torch.int8)
    u = torch.tensor([200, 255, 0, 1], dtype=torch.uint8)

    def f(a, b, u):
        return ((a + b).to(torch.float32) * 1, (a * b).to(torch.float64) + 0.5, (a + b) * 0.5,
                torch.where(a > 0, a + b, 0.5), (a + b).to(torch.int32) + 0, (u + u).float() + 0,
                (-u) * 1.5, (u * 3).to(torch.int16) * 2, (a * b).half() - 1)

    check(f, a, b, u, exact=True)


def test_mixed_integer_promotion_wraps_in_result_dtype(check):
    u = torch.tensor([0, 200, 255, 128, 7], dtype=torch.uint8)
    i = torch.tensor([-128, 100, 127, -1, 7], dtype=torch.int8)
    s = torch.tensor([32767, -32768, 1000, 300, 7], dtype=torch.int16)
    f = lambda u, i, s: ((u + i) * 200, (i * s) + 1, (u - s) > 0, torch.maximum(u, i) * 2)  # noqa: E731
    check(f, u, i, s, exact=True)


# -- promotion in arithmetic -----------------------------------------------------------

def _promo_inputs():
    """f (float32), i (int32 with values beyond float16's range) and 0-dim
    tensors of float32, float64 and float16 (inputs, not literals: see
    _where_inputs)."""
    torch.manual_seed(0)
    f = torch.randn(5, 6) * 10
    i = (torch.randn(5, 6) * 50).to(torch.int32)
    i[0, :3] = torch.tensor([70000, -70000, 0], dtype=torch.int32)
    return f, i, torch.tensor(0.1), torch.tensor(1.1, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float16)


PROMOTION = {
    "int_plus_float": lambda f, i, z32, z64, z16: (i + f) * 2,
    "f16_plus_f32_0dim": lambda f, i, z32, z64, z16: ((f.half() + z32) * 2, (f.half() - z32) * 3),
    "bf16_times_f64_0dim": lambda f, i, z32, z64, z16: (f.bfloat16() * z64).abs() * 2,
    "int_plus_f16_0dim": lambda f, i, z32, z64, z16: (i + z16) * 2,
    "int_times_float_scalar": lambda f, i, z32, z64, z16: (i * 2.5 + 1, i.to(torch.int64) * (2 ** 30) + 0.5),
    "exp_of_int": lambda f, i, z32, z64, z16: (torch.exp(i.to(torch.int8)) + f, torch.sigmoid(i) * 2),
    "int_true_divide": lambda f, i, z32, z64, z16: (i / (i % 3).to(torch.int64)) * 2,
    # a float16 product is rounded to float16 before it is promoted to float32
    "f16_product_plus_f32": lambda f, i, z32, z64, z16: ((f.half() * 3) + f, (f.bfloat16() * 3) - f * 1),
    "int_plus_bool": lambda f, i, z32, z64, z16: ((i + (f > 0)) * 2, (f > 0) * 3 + (f < 1)),
    "int_clamp_float_bounds": lambda f, i, z32, z64, z16: ((i + 1).clamp(-2.5, 3.5), (i * 2).clamp_min(0.5)),
    "full_and_scalar_tensor": lambda f, i, z32, z64, z16: (
        (f.half() * torch.full([], 3.5) + torch.scalar_tensor(1.0)).abs(),
        (i * torch.full([], 7, dtype=torch.int32)) - torch.scalar_tensor(2, dtype=torch.int8)),
}


@pytest.mark.parametrize("case", sorted(PROMOTION))
def test_promotion_in_arithmetic(check, case):
    check(PROMOTION[case], *_promo_inputs())


SHAPED_FACTORIES = {
    "where_full": lambda f, i: torch.where(f > 0, f, torch.full((5, 6), -1.5)) * 2,
    "ones_zeros_f64": lambda f, i: f * torch.ones(5, 6) + torch.zeros(5, 6, dtype=torch.float64),
    "like": lambda f, i: torch.maximum(f, torch.zeros_like(f)) + torch.full_like(f, 0.5) - torch.ones_like(i),
    "int_full": lambda f, i: (i + torch.full((5, 6), 70000, dtype=torch.int32)) * 3,
    "int16_wraps": lambda f, i: i.to(torch.int16) * torch.full((5, 6), 300, dtype=torch.int16),
    "bool_full": lambda f, i: torch.logical_and(f > 0, torch.ones(5, 6, dtype=torch.bool)) + 0,
    "row_of_full": lambda f, i: (f + torch.full((6,), float("-inf"))) * 2,
}


@pytest.mark.parametrize("case", sorted(SHAPED_FACTORIES))
def test_factories_of_any_shape_are_kernel_constants(check, case):
    """full / zeros / ones (and the *_like of a contiguous result) of a shape
    the kernel's inputs already give become constants of the kernel."""
    f, i, *_ = _promo_inputs()
    check(SHAPED_FACTORIES[case], f, i, exact=True, lowered=["aten.full.default"])


def test_a_factory_that_enlarges_the_result_stays_outside(check, compiled):
    """x[6] + full((5, 6)): the kernel's shape comes from its inputs, so a
    constant must not be what makes the result 5 x 6."""
    f, i, *_ = _promo_inputs()
    check(lambda x: (x * 2 + 1) + torch.full((5, 6), 2.0), f[0], exact=True)
    assert compiled.fallbacks()["aten.full.default"] == 1


def test_static_arange_is_folded_and_what_follows_fuses(check, compiled):
    """arange with number arguments becomes a constant at compile time (eager
    computes it), so a position mask or a scaled ramp fuses with its users;
    one as an embedding's positions feeds the gather."""
    lengths = torch.tensor([1, 3, 5, 8])
    x = torch.randn(4, 8)
    emb = torch.randn(16, 6)

    def f(x, n, emb):
        mask = (torch.arange(8) < n[:, None]) & (x > 0)
        ramp = torch.arange(2, 20, 3, dtype=torch.float32) * 0.1 + x[0, :6]
        pos = torch.nn.functional.embedding(torch.arange(8), emb) * 2 + 1
        return mask, ramp, pos

    check(f, x, lengths, emb, exact=True, lowered=["aten.lt.Tensor", "aten.embedding.default"])
    assert not any("arange" in op for op in compiled.fallbacks()), dict(compiled.fallbacks())


@pytest.mark.parametrize("f", [lambda x: (torch.arange(5), x + 1), lambda x: (torch.arange(6).view(2, 3), x + 1),
                               lambda x: {"pos": torch.arange(2, 12, 2)[1:], "y": x + 1}],
                         ids=["itself", "a view", "a slice in a dict"])
def test_an_arange_the_graph_returns_is_a_new_tensor_on_each_call(f):
    """A folded arange is a constant of the compiled graph: one it returned
    (or a view of) was the same tensor on every call, so a caller that
    changed it in place changed what the next calls returned."""
    x = torch.randn(3)
    for door in ("compile", "jit"):
        torch._dynamo.reset()
        cf = torch.compile(f, backend="neuron") if door == "compile" else torchneuron_jit.jit(f)
        for _ in range(3):
            got = cf(x)
            torch.testing.assert_close(got, f(x), msg=door)
            first = got[0] if isinstance(got, tuple) else got["pos"]
            first.add_(100)


def test_what_the_graph_computes_from_constants_alone_is_computed_once(check, compiled):
    """A relative position index built from aranges on every call (BEiT's
    and Swin's, where transformers' lru_cache is off under torch.compile:
    266 nodes of 469 ran through PyTorch on each call) is computed at
    compile time: no op of it runs at run time."""
    def f(x):
        coords = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous() + 3
        index = rel[..., 0] * 7 + rel[..., 1]
        return x + index.float().sum(-1)

    check(f, torch.randn(16), exact=True, kernels=False)  # x + the index: one op left
    ran = compiled.fallbacks()
    assert not {op for op in ran if any(w in op for w in ("arange", "stack", "permute", "sub", "clone", "view"))}, \
        dict(ran)


def test_arange_of_a_dynamic_length_stays_an_op(check, compiled):
    def f(x):
        return (torch.arange(x.shape[1]) * 2 + x) > 0

    calls = [(torch.randn(3, n).to(torch.int64),) for n in (5, 9, 12)]
    check(f, *calls[0], exact=True, dynamic=True, calls=calls)
    assert compiled.fallbacks()["aten.arange.default"] + compiled.fallbacks()["aten.arange.start_step"] >= 1


def test_full_like_of_a_transposed_tensor_keeps_eagers_strides(check):
    f, i, *_ = _promo_inputs()
    got, want = check(lambda x: torch.full_like(x, 2.0) * x, f.t(), exact=True, kernels=False)
    assert got.stride() == want.stride()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_name)
def test_half_op_with_scalar_operand_rounds_once_like_eager(check, dtype):
    """One float16/bfloat16 op with a Python scalar or a 0-dim float tensor,
    then cast to float32 (the cast rounds the op's result): eager computes in
    float32 and rounds once, so the results are equal bit for bit when the
    scalar operand is taken as eager takes it. Eager's CPU kernels round the
    scalar to the tensor's dtype for add and sub, and use it unrounded
    (float32) for mul and div, for Python scalars and 0-dim tensors alike;
    a 0-dim first operand of mul and div they round too."""
    torch.manual_seed(0)
    x = (torch.randn(64) * 4).to(dtype)
    x[:3] = torch.tensor([0.3, -1.1171875, 1000.0]).to(dtype)
    z = torch.tensor(0.1)
    w = torch.tensor(1.1, dtype=torch.float64)

    def f(x, z, w):
        return ((x + 0.1).float(), (x + z).float(), (x - 0.1).float(), (x - z).float(),
                (x * 1.1).float(), (x * w).float(), (x / 1.1).float(), (x / w).float(),
                torch.relu(w * x).float(), (w / x).float(), (z * x).float())

    labels = ["x + 0.1", "x + 0-dim 0.1", "x - 0.1", "x - 0-dim 0.1",
              "x * 1.1", "x * 0-dim 1.1 (f64)", "x / 1.1", "x / 0-dim 1.1 (f64)",
              # a 0-dim first operand eager rounds to the dtype first (a scale attribute times x)
              "relu(0-dim 1.1 (f64) * x)", "0-dim 1.1 (f64) / x", "0-dim 0.1 * x"]
    check(f, x, z, w, labels=labels, exact=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_name)
def test_half_chain_rounds_after_every_op_like_eager(check, dtype):
    """Chains of float16/bfloat16 ops give eager's bits: eager stores, so
    rounds, every op's result in the tensor's dtype, and so does the kernel
    (a chain kept in float32 between ops was 3% from eager in bfloat16 for
    exp(x * 2 + y)). pow takes its exponent rounded to the dtype; bfloat16's
    x ** 3 and x ** -2 round x * x first (PowKernel.cpp)."""
    torch.manual_seed(0)
    x, y = (torch.randn(4096) * 3).to(dtype), (torch.randn(4096) * 3).to(dtype)

    def f(x, y):
        return (x * 0.1 + y / 3.0 - 0.7, (x * 2) ** 3, (x * 2) ** -2, (x * 2).abs() ** 0.3, (x + y) * (x - y) / 7.0)

    labels = ["x * 0.1 + y / 3 - 0.7", "(2x) ** 3", "(2x) ** -2", "|2x| ** 0.3", "(x + y) * (x - y) / 7"]
    check(f, x, y, labels=labels, exact=True, lowered=["aten.pow.Tensor_Scalar", "aten.add.Tensor"])
    # exp's last float32 bit may differ from eager's (another exp): then
    # one half ulp does; a chain kept in float32 between ops differed by 3%
    x = (torch.randn(3, 64) * 5).to(dtype)
    y = (torch.randn(3, 64) * 5).to(dtype)
    check(lambda x, y: (x * 2 + y).exp() - x / (y.abs() + 1), x, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_name)
def test_half_add_takes_alpha_rounded_to_its_dtype(compiled, dtype):
    """add/sub(x, y, alpha) of float16/bfloat16 tensors: x + alpha * y in
    float32 with alpha rounded to the dtype, one rounding, as eager's
    AVX2/AVX-512 loop (its default loop rounds alpha * y too: that eager is
    not the reference here)."""
    torch.manual_seed(0)
    x, y = (torch.randn(4096) * 3).to(dtype), (torch.randn(4096) * 3).to(dtype)
    a = torch.tensor(0.3).to(dtype).item()
    config.log = "compile,fallback"
    torch._dynamo.reset()
    compiled.mark()
    with torch.no_grad():
        got = torch.compile(lambda x, y: (torch.add(x * 2, y, alpha=0.3), torch.sub(x * 2, y, alpha=0.3)),
                            backend="neuron")(x, y)
    compiled.assert_lowered("aten.add.Tensor", "aten.sub.Tensor")
    assert torch.equal(got[0], ((x * 2).float() + a * y.float()).to(dtype))
    assert torch.equal(got[1], ((x * 2).float() - a * y.float()).to(dtype))


# -- 5. logical ops -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                   torch.int8, torch.uint8, torch.bool], ids=_name)
def test_logical_ops(check, dtype):
    """NaN is true, -0.0 false, every nonzero integer true."""
    x, y = _pair(dtype)

    def f(x, y):
        a, o, n = torch.logical_and(x, y), torch.logical_or(x, y), torch.logical_not(x)
        return a, o, n, torch.logical_and(n, o), torch.logical_or(torch.logical_not(y), a)

    check(f, x, y, exact=True, lowered=["aten.logical_and.default", "aten.logical_or.default",
                                        "aten.logical_not.default"])


def test_logical_ops_mixed_input_dtypes(check):
    x = torch.tensor([nan, 0.0, -0.0, 1.0, inf, 0.0, 2.0])
    i = torch.tensor([0, 0, 5, -1, 0, 256, 0], dtype=torch.int16)
    b = torch.tensor([True, False, True, False, True, True, False])

    def f(x, i, b):
        return (torch.logical_and(x.half(), i), torch.logical_or(x.bfloat16(), b),
                torch.logical_not(torch.logical_or(i.to(torch.uint8), x)))

    check(f, x, i, b, exact=True)


# -- 6. layouts ----------------------------------------------------------------------------

def test_non_contiguous_mixed_dtypes(check):
    """A transposed int8 and a sliced float16 input, each with a contiguous
    partner of another dtype (results keep eager's strides too)."""
    torch.manual_seed(0)
    h = torch.randn(4, 5).half()
    a = (torch.randn(5, 4) * 100).to(torch.int8).t()
    s = (torch.randn(4, 10) * 3)[:, ::2].bfloat16()

    def f(h, a, s):
        return (torch.where(h > 0, a, h) * 2, (h + (a + 100)) * 2, torch.where(h < s, a.to(torch.float16), -h) * 3,
                torch.logical_and(h, a) == (s > 0))

    got, want = check(f, h, a, s)
    assert [g.stride() for g in got] == [w.stride() for w in want]


def test_broadcast_mixed_dtypes(check):
    a = torch.tensor([[1], [-2], [300], [0]], dtype=torch.int32)
    h = torch.tensor([[0.5, -2.0, 1.0, nan, 300.0]], dtype=torch.float16)
    f = lambda a, h: (torch.where(a.to(torch.float16) >= h, a, -a) * 3, (a + h) * 2,  # noqa: E731
                      torch.logical_and(a, h))
    check(f, a, h)


def test_expanded_mask_and_values(check):
    x = torch.randn(4, 6).bfloat16()
    mask = torch.tensor([[True, False, True, False, False, True]]).expand(4, 6)
    v = torch.tensor([[-1.5], [2.0], [nan], [0.0]]).expand(4, 6)
    f = lambda x, m, v: ((x.masked_fill(m, -inf) + 1).exp(), torch.where(m, v, x) * 2)  # noqa: E731
    check(f, x, mask, v)


def test_zero_dim_mixed(check):
    a = torch.tensor(-128, dtype=torch.int8)
    x = torch.tensor(2.5)
    f = lambda a, x: ((a - 1) * 2, (a + x) > 0, torch.where(a < 0, x, -x) * 3)  # noqa: E731
    check(f, a, x)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_empty_mixed(check, shape):
    a = torch.zeros(shape, dtype=torch.uint8)
    x = torch.randn(shape).half()
    f = lambda a, x: ((a + 1) * 3, torch.where(a == 0, x, 1.0) * 2, torch.logical_not(x > 0))  # noqa: E731
    got, want = check(f, a, x)
    assert all(g.shape == w.shape for g, w in zip(got, want))


def test_dynamic_shapes_two_sizes(check):
    def f(x, a, m):
        return torch.where(m, x * 2, a.to(x.dtype)) + 1, (a + 100) > x

    def inputs(n):
        torch.manual_seed(n)
        return (torch.randn(n, 3).half(), (torch.randn(n, 3) * 100).to(torch.int8), torch.rand(n, 3) > 0.5)

    check(f, calls=[inputs(5), inputs(11), inputs(7)], dynamic=True)


def test_large_mixed_dtypes_span_blocks(check):
    """More elements than one block of the kernel's loop, unaligned, plus a
    broadcast whose inner extent is large."""
    torch.manual_seed(0)
    x = torch.randn(3, 1500)
    i = (torch.randn(3, 1500) * 100).to(torch.int16)
    col = torch.randn(700, 1)
    u = (torch.rand(1, 2100) * 255).to(torch.uint8)

    def f(x, i, col, u):
        return (torch.where(x > 0, i, x.to(torch.int8)) * 3, torch.logical_and(x.half() < 0.5, i > 0),
                (i * 100).to(torch.float16) + x, torch.where(col > 0, u, col.to(torch.uint8)) * 2,
                (col.half() < 0.5).logical_or(u > 128))

    check(f, x, i, col, u)


# -- 7. a masking model ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=_name)
def test_length_mask_model(check, dtype):
    def f(x, lengths):
        mask = torch.arange(x.shape[1])[None, :] < lengths[:, None]
        return torch.where(mask, x * 2, 0.0).sum(-1), mask.sum(-1)

    torch.manual_seed(0)
    x = torch.randn(4, 9).to(dtype)
    lengths = torch.tensor([0, 3, 9, 12])
    check(f, x, lengths)


# -- 8. signed zero -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=_name)
def test_signed_zero_in_where_and_masked_fill(check, dtype):
    x = torch.tensor([-0.0, 0.0, -1.0, 1.0, -0.0, 2.0]).to(dtype)
    m = torch.tensor([True, False, True, False, False, True])
    z = torch.tensor(-0.0)

    def f(x, m, z):
        return (torch.where(m, -0.0, x) * 1, x.masked_fill(m, -0.0) * 1, torch.where(x == 0, x, 0.0) * 1,
                x.masked_fill(~m, z).neg().neg(), (x * 1).to(torch.float32), torch.where(m, x, -x) * 1,
                torch.where(m, z, x + 0) * 1, torch.where(m, x.to(torch.int32), z) * 1)

    got, want = check(f, x, m, z, exact=True)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(torch.signbit(g), torch.signbit(w)), (i, g, w)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32], ids=_name)
def test_wraps_deferred_through_sums_and_products(check, dtype):
    """Narrow integers are wrapped only where a reader needs the value: after
    several sums, products and bitwise ops, max, abs, clamp, comparisons,
    casts and stores all see eager's wrapped values."""
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, (4, 37), dtype=torch.int64).to(dtype)
    y = torch.randint(info.min, info.max, (4, 37), dtype=torch.int64).to(dtype)

    def f(x, y):
        s = (x * 3 + y) * 5 - (x ^ y)
        return (torch.maximum(s, y), s.abs(), s.clamp(-40, 50), s > 0, s.float(), s.to(torch.int64),
                torch.where(s < y, s, y * 7), -s | 5, s)
    check(f, x, y, exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                                   torch.int64, torch.int8], ids=_name)
def test_rounding_and_sign(check, dtype):
    """floor, ceil, trunc, round (half to even) and sign as eager gives them:
    NaN and -0 kept by the roundings, sign(NaN) and sign(-0) are +0; on
    integers the roundings are the value itself."""
    if dtype.is_floating_point:
        x = torch.tensor([float("nan"), -0.0, 0.0, -0.5, 0.5, 1.5, 2.5, -2.5, float("inf"), -float("inf"), 3.7,
                          -3.7, 1e30, -1e-30] * 3, dtype=dtype)
    else:
        x = torch.tensor([-5, 0, 3, -1, 7, 100, -100, 1] * 3, dtype=torch.int64).to(dtype)

    def f(x):
        y = x * 1
        return torch.floor(y) * 1, torch.ceil(y) * 1, torch.trunc(y) * 1, torch.round(y) * 1, torch.sign(y) * 1

    got, want = check(f, x, exact=True, lowered=["aten.floor.default", "aten.round.default", "aten.sign.default"])
    for g, w in zip(got, want):
        if g.dtype.is_floating_point:
            assert torch.equal(g.signbit() & ~g.isnan(), w.signbit() & ~w.isnan())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=_name)
def test_weight_norm_gives_eagers_bits_through_both_doors(dtype):
    """nn.utils weight norm (Wav2Vec2's positional convolution): eager's
    kernel rounds v * (g / norm) once; the core decomposition rounded
    g / norm to bfloat16 first (3% of a bfloat16 convolution's outputs
    outside assert_close)."""
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(
        torch.nn.Conv1d(128, 128, 16, padding=8, groups=4), name="weight", dim=2).to(dtype).eval()
    x = torch.randn(2, 128, 79, dtype=dtype)
    with torch.no_grad(), config.patch(compile_blocking=True):
        want = conv(x)
        jitted = copy.deepcopy(conv)
        torchneuron_jit.jit(jitted)
        for door, f in (("neuron", torch.compile(copy.deepcopy(conv), backend="neuron")), ("jit", jitted)):
            for call in range(2):
                torch.testing.assert_close(f(x), want, rtol=0, atol=0, msg=lambda m: f"{door} call {call}: {m}")


# -- lazy conjugate and negative views ------------------------------------------------------------------------

def _negative_view(n):
    """A real tensor marked negative (is_neg(), as the imaginary part of a
    conjugate view is), with a plain tensor's strides."""
    return torch._neg_view(torch.randn(n))


@pytest.mark.parametrize("door", ["neuron", "jit"])
def test_a_lazy_conjugate_or_negative_view_gives_eagers_values(door):
    """z.conj() marks a view conjugate, and its .imag is a real view marked
    negative: their values are not their memory, which our kernels read.
    A marked input, one made inside the graph and a marked result each
    gave eager's values with the wrong sign (through both doors); and a
    jit variant traced with a plain tensor took a marked one."""
    def on_input(x):
        return x.sin() * 2 + 1

    def inside(z):
        return z.conj().imag.sin() * 2 + 1

    def returned(z):
        return z.conj()

    compile = torchneuron_jit.jit if door == "jit" else (lambda f: torch.compile(f, backend="neuron"))
    f, g, h = compile(on_input), compile(inside), compile(returned)
    for i in range(4):
        x = _negative_view(6) if i % 2 else torch.randn(6)
        assert x.is_neg() == bool(i % 2)
        torch.testing.assert_close(f(x), on_input(x))
        z = torch.randn(6, dtype=torch.complex64)
        torch.testing.assert_close(g(z), inside(z))
        torch.testing.assert_close(h(z).resolve_conj(), returned(z).resolve_conj())


# -- ops whose decomposition rounds otherwise than eager's kernel in float16/bfloat16 (backend.HALF_WHOLE) --

def _half_inputs(dtype, n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g)
    u[:4] = torch.tensor([0.0, 1.0, 1e-4, 0.999])
    a, b = torch.randn(n, generator=g) * 2, torch.randn(n, generator=g)
    return u.to(dtype), a.to(dtype), b.to(dtype)


_HALF_OPS = {
    "logit": lambda u, a, b: torch.logit(u),
    "logit eps": lambda u, a, b: torch.logit(u, 1e-3),
    "addr": lambda u, a, b: torch.addr(a[:32].reshape(4, 8), b[:4], u[:8], beta=0.5, alpha=2),
    "linalg.cross": lambda u, a, b: torch.linalg.cross(a[:96].reshape(32, 3), b[:96].reshape(32, 3)),
    "mse_loss": lambda u, a, b: torch.nn.functional.mse_loss(a, b, reduction="none"),
    "soft_margin_loss": lambda u, a, b: torch.nn.functional.soft_margin_loss(a * 8, b.sign(), reduction="none"),
    "smooth_l1_loss": lambda u, a, b: torch.nn.functional.smooth_l1_loss(a, b, reduction="none", beta=0.5),
    "huber_loss": lambda u, a, b: torch.nn.functional.huber_loss(a, b, reduction="none", delta=0.5),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_name)
@pytest.mark.parametrize("op", sorted(_HALF_OPS))
def test_half_ops_whose_decomposition_rounds_otherwise_give_eagers_bits(check, op, dtype):
    """torch.logit, addr, linalg.cross and three losses in float16 and
    bfloat16: their core ATen decompositions compute in float32 and round
    once, or round each product on its own, where eager's kernel rounds at
    its own steps: values an ulp or more off (logit: beyond assert_close's
    tolerance), and logit(1.0, eps=1e-3) finite where eager's is inf in
    bfloat16 (a helper's probes). Given such a tensor the op stays whole
    (eager's bits); the graph's other ops are still a kernel."""
    fn = _HALF_OPS[op]
    check(lambda u, a, b: (fn(u, a, b) * 2).abs() + 1, *_half_inputs(dtype), exact=True)


def test_a_bool_tensor_in_a_fused_subtraction_raises_as_eagers(check):
    """(mask - x) * 2 with a bool mask: eager raises "Subtraction, the `-`
    operator, with a bool tensor is not supported"; the fused kernel
    computed 1 - x (F.tanhshrink of a bool tensor too; a helper's probe)."""
    mask, x = torch.tensor([True, False]), torch.tensor([0.5, 0.25])
    for f in (lambda m, y: (m - y) * 2, lambda m, y: (y - m) * 2, lambda m, y: torch.nn.functional.tanhshrink(m) * y):
        with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor"):
            f(mask, x)
        torch._dynamo.reset()
        with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor"):
            torch.compile(f, backend="neuron")(mask, x)
        with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor"):
            torchneuron_jit.jit(f)(mask, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_name)
def test_an_op_eager_refuses_in_half_raises_as_eagers(dtype):
    """torch.special.log_ndtr of a float16 tensor: eager has no kernel for
    it (NotImplementedError); its decomposition computed an answer."""
    x = torch.randn(8).to(dtype)
    f = lambda t: torch.special.log_ndtr(t) * 2  # noqa: E731
    with pytest.raises(NotImplementedError, match="log_ndtr"):
        f(x)
    torch._dynamo.reset()
    with pytest.raises(NotImplementedError, match="log_ndtr"):
        torch.compile(f, backend="neuron")(x)
