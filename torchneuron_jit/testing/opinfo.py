"""OpInfo parity sweep: every ATen overload the back end lowers
(``torchneuron_jit.lowered_ops()``), run on the sample inputs of PyTorch's
OpInfo database through ``torch.compile(fn, backend="neuron",
fullgraph=True)`` and compared with eager.

    python -m torchneuron_jit.testing.opinfo            # the CI subset
    python -m torchneuron_jit.testing.opinfo --all      # every sample, every dtype
    python -m torchneuron_jit.testing.opinfo --op add --dtype int8 --sample 3 --variant fused -v

Matching: an OpInfo belongs to a lowered overload when its ``aten_name`` is
the overload's base name ("aten::add.Tensor" -> "add"). ALIASES names the
OpInfos of the ops no OpInfo has by name (_softmax -> softmax, ...),
REACHED_THROUGH OpInfos whose decomposition produces an overload the
OpInfos of its name never reach (add.Scalar <- isclose, ...), DECOMPOSED
the ops the back end's own decomposition table rewrites before lowering
(tested as what they become), COVERED_ELSEWHERE the ops no OpInfo reaches,
with the test file that covers them. OpInfos of a .Scalar overload get a
few of their reference inputs with a Python number operand (``x & 3``)
after their sample inputs (SCALAR_SAMPLES).

Each sample runs in three variants (the CI subset: the first two), each a
case of its own:

* ``plain``: ``opinfo.op(input, *args, **kwargs)``, as the database calls it.
  The back end leaves a graph of one pointwise op to eager on purpose, so
  for pointwise ops and views this checks only the graph passes;
  reductions, norms, GEMMs and argmax/argmin are kernels on their own.
* ``fused``: the same call between an exact identity on every tensor input
  and on every tensor output (``-(-t)``, ``~~t`` for bool): the op then
  runs inside a generated kernel, reading a kernel's results (a view or a
  cat of them, a row kernel's prologue) and feeding one (an epilogue).
* ``jit``: the fused function through ``torchneuron_jit.jit`` (our own front
  door): called once to trace it, then compared on its compiled call.

OpInfos of the reductions, norms and GEMMs run with ``row_fusion`` and
``gemm_fusion`` on (off by default: without them those ops are PyTorch's
own), and compare against a float64 reference when eager's result and
ours differ (sums in another order): a case fails only where our error
exceeds eager's error plus the dtype's default tolerance.

A case passes when the compiled result matches eager (torch's default
tolerances, ``equal_nan``; integers and bool exactly; dtype and shape
always), the inputs are left as eager leaves them (each run gets its own
copies), and the back end compiled its graph; when eager raises, the
compiled call must raise the same type. Dynamo is reset before every case
(one generated function each, compiled afresh: no recompile limit turns a
case into eager against eager).
Cases where Dynamo itself refuses the function (the same call with
``backend="eager"`` fails too) count as "dynamo unsupported", graphs
without an op as "not exercised", and graphs the back end gave up on and
ran eagerly (``stats()["eager_fallbacks"]``) as eager fallbacks: they must
still match, but they test nothing of ours.

The CI subset (the default; tests/python/test_opinfo.py runs it, one test
per OpInfo) takes up to CI_SAMPLES_FLOAT32 samples of float32 and
CI_SAMPLES_OTHER of each other dtype, spread over the OpInfo's list, both
variants for float32 and for the ops that are kernels alone, the fused
one otherwise; ``--all`` runs every sample of every dtype in both.

KNOWN_FAILURES lists what fails today, keyed by (OpInfo name, dtype or
None for every dtype): such a group must fail (all its samples run, also in
the CI subset), a group that passes is an unexpected pass and fails the
sweep, so the table stays true.
"""
import argparse
import collections
import contextlib
import dataclasses
import functools
import math
import random
import re
import sys
import time
import warnings
import zlib

import torch

import torchneuron_jit
from torchneuron_jit import config

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool)

# plain: the op alone; fused: the op between identities and with an
# epilogue, so it fuses; jit: the fused function through torchneuron_jit.jit
# (traced on a first call, compared on its compiled call) instead of
# torch.compile
VARIANTS = ("plain", "fused", "jit")

# The CI subset: at most this many samples per OpInfo and dtype (spread
# over the OpInfo's list), float32 and the other dtypes.
CI_SAMPLES_FLOAT32 = 6
CI_SAMPLES_OTHER = 2
# make test's slice of it (quick_dtypes): dtypes besides float32 per OpInfo (2 took 147 of CI's 900 s of
# test time; 1 takes 95, and each dtype still runs across the OpInfos)
QUICK_OTHER_DTYPES = 1

# Samples with a Python number operand added to the sample_inputs of the
# OpInfos that reach a lowered .Scalar overload (takes_scalars).
SCALAR_SAMPLES = 4

# Lowered ops whose base name no OpInfo has as aten_name -> the OpInfos
# that reach them.
ALIASES = {
    "_softmax": ("softmax", "softmax.with_dtype"),
    "_log_softmax": ("log_softmax", "log_softmax.with_dtype"),
    # x.to(...), x.double(), ...: aten._to_copy
    "_to_copy": ("to", "double", "float", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool"),
    # reshape of a tensor that has to be copied: clone + _unsafe_view
    "_unsafe_view": ("reshape", "view"),
    "embedding": ("nn.functional.embedding",),
    "silu": ("nn.functional.silu",),
}

# Lowered overloads that the OpInfos of their name never reach in our
# code (their samples call the .Tensor overload, or a tensor bound, or too
# small an input) -> OpInfos whose decomposition (the back end's table)
# produces them. The sweep checks they do (tested_ops).
REACHED_THROUGH = {
    "aten::add.Scalar": ("isclose",),                # other + atol: aot writes x + 3 as add.Tensor
    "aten::mul.Scalar": ("isclose",),
    "aten::sub.Scalar": ("nn.functional.cosine_embedding_loss",),
    "aten::div.Scalar": ("trapezoid",),
    "aten::clamp": ("nn.functional.hardsigmoid",),   # the clamp OpInfo's bounds are tensors (clamp.Tensor)
    "aten::clamp_min": ("nn.functional.hinge_embedding_loss",),
    "aten::full": ("nn.functional.logsigmoid",),     # full alone stays eager: a kernel takes it as a constant
    "aten::scalar_tensor": ("heaviside",),
    "aten::index_select": ("repeat_interleave",),    # index_select's samples: 0-dim, 1 element, or dim -1
}

# Lowered ops that torch.compile never hands the back end: its
# decomposition table (backend.decompositions()) rewrites them first ->
# what they become. Their OpInfos run; the test checks the table holds
# them and that what they become ran in our code.
DECOMPOSED = {
    "aten::sum": "aten::sum.dim_IntList",
    "aten::_unsafe_view": "aten::view",
    "aten::squeeze": "aten::squeeze.dims",
    "aten::squeeze.dim": "aten::squeeze.dims",
    "aten::transpose.int": "aten::permute",
}

# Lowered ops no OpInfo sample reaches in our code -> (the test file that
# covers them, why). test_covered_elsewhere_names_a_test_that_covers_it
# checks the file exists and names the op.
COVERED_ELSEWHERE = {
    "aten::clamp_max": ("tests/python/test_dtypes.py",
                        "only torch.clamp_max(x, number) calls it, and the clamp_max OpInfo's bound is a tensor "
                        "(clamp_max.Tensor); no OpInfo's decomposition produces it"),
}

# The ops the back end lowers only with row_fusion / gemm_fusion on: their
# OpInfos run with both on, and compare with a float64 reference (their
# kernels sum in another order than eager's).
FUSION_OPS = frozenset({
    "aten::_softmax", "aten::_log_softmax", "aten::native_layer_norm", "aten::sum", "aten::sum.dim_IntList",
    "aten::mean", "aten::mean.dim", "aten::amax", "aten::amin", "aten::var.correction", "aten::logsumexp",
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
})
FUSION_CONFIG = {"row_fusion": True, "gemm_fusion": True}

# Ops that are a kernel of their own (the rest: a lone op stays with eager).
ALONE_OPS = FUSION_OPS | {"aten::argmax", "aten::argmin"}

# (OpInfo name, dtype or None for all dtypes) -> why it fails today.
_ALPHA_HALF = ("values: a fused add/sub with alpha on float16 computes x + alpha*y in float32 and rounds once; "
               "eager rounds alpha*y to float16 first, so where the terms cancel the two differ by a few ulp "
               "(beyond rtol 1e-3; ours is the closer to float64). Repro: f = lambda x, y: "
               "torch.add(x * 1, y, alpha=-3.125) * 1 on float16 x = [10.0], y = [3.001953125]: "
               "compiled 0.619140625, eager 0.6171875, float64 0.618896...")
KNOWN_FAILURES = {
    ("add", torch.float16): _ALPHA_HALF,
    ("sub", torch.float16): _ALPHA_HALF,
}


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


_DTYPE_BY_NAME = {dtype_name(d): d for d in DTYPES}


def full_name(opinfo):
    """The OpInfo's name with its variant: "div.trunc_rounding"."""
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def base_name(op):
    """ "aten::add.Tensor" -> "add"."""
    return op.split("::", 1)[1].split(".", 1)[0]


@functools.lru_cache(maxsize=None)
def op_db():
    """PyTorch's OpInfo database, {full name: OpInfo} (imported on first use: seconds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    return {full_name(oi): oi for oi in db}


@dataclasses.dataclass
class Matching:
    ops: list            # every lowered op
    opinfos: dict        # OpInfo full name -> [lowered ops it reaches]
    of_op: dict          # lowered op -> [OpInfo full names]
    no_opinfo: list      # lowered ops no OpInfo has by aten_name (before ALIASES)


@functools.lru_cache(maxsize=None)
def match():
    """Which OpInfos test which lowered op."""
    db = op_db()
    ops = torchneuron_jit.lowered_ops()
    by_aten = collections.defaultdict(list)
    for name, oi in db.items():
        by_aten[oi.aten_name].append(name)
    of_op, no_opinfo = {}, []
    for op in ops:
        names = list(by_aten.get(base_name(op), ()))
        if not names:
            no_opinfo.append(op)
        names += [n for n in ALIASES.get(base_name(op), ()) + REACHED_THROUGH.get(op, ()) if n not in names]
        # OpInfos with none of our dtypes (complex variants) test nothing here
        of_op[op] = [n for n in names if any(d in DTYPES for d in db[n].supported_dtypes("cpu"))]
    opinfos = collections.defaultdict(list)
    for op, names in of_op.items():
        for n in names:
            opinfos[n].append(op)
    return Matching(ops, dict(sorted(opinfos.items())), of_op, no_opinfo)


def uses_fusion(name):
    """Whether OpInfo name runs with FUSION_CONFIG (and a float64 reference)."""
    return any(op in FUSION_OPS for op in match().opinfos.get(name, ()))


def dtypes_of(name):
    sup = op_db()[name].supported_dtypes("cpu")
    return [d for d in DTYPES if d in sup]


def quick_dtypes(name):
    """The dtypes make test's slice runs an OpInfo in (test_opinfo.py):
    float32 (else its first dtype), its known failures, and QUICK_OTHER_DTYPES
    more taken in turn by the name's CRC, so that across the OpInfos each
    dtype runs about equally often. Making an OpInfo's samples costs more
    than running them, so this, not fewer samples, is what keeps the slice
    short; make test-long runs every dtype."""
    have = dtypes_of(name)
    if not have:
        return []
    first = torch.float32 if torch.float32 in have else have[0]
    others = [d for d in have if d != first]
    start = zlib.crc32(name.encode()) % len(others) if others else 0
    picked = [others[(start + k) % len(others)] for k in range(min(QUICK_OTHER_DTYPES, len(others)))]
    return [d for d in have if d == first or d in picked or known_reason(name, d) is not None]


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def takes_scalars(name):
    """Whether OpInfo name reaches a lowered overload of a Python number
    operand (add.Scalar, pow.Tensor_Scalar, ...): its sample_inputs have
    none, so SCALAR_SAMPLES of its reference_inputs that do are added."""
    return any(op.endswith("Scalar") for op in match().opinfos.get(name, ()))


def samples(name, dtype, reference=False):
    """Every sample of OpInfo name for dtype, the same on every run: its
    sample_inputs, then, where takes_scalars(name), up to SCALAR_SAMPLES
    of its reference_inputs whose arguments hold a Python number (x & 3);
    reference: all its reference_inputs, a superset with extremal values."""
    seed = zlib.crc32(f"{name}|{dtype_name(dtype)}{'|reference' if reference else ''}".encode())
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed)
    except ImportError:
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opinfo = op_db()[name]
        if reference:
            return list(opinfo.reference_inputs("cpu", dtype, requires_grad=False))
        out = list(opinfo.sample_inputs("cpu", dtype, requires_grad=False))
        if takes_scalars(name):
            numbers = [s for s in opinfo.reference_inputs("cpu", dtype, requires_grad=False)
                       if any(_is_number(a) for a in s.args) or any(_is_number(v) for v in s.kwargs.values())]
            out += [numbers[i] for i in spread(len(numbers), SCALAR_SAMPLES)]
        return out


def spread(n, k):
    """k indices out of range(n), first and last included, evenly apart."""
    if k is None or k >= n:
        return list(range(n))
    if k <= 1:
        return [0][:k]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


# -- what the back end did with a graph -------------------------------------------

def overload_name(target):
    """An OpOverload as lowered_ops() writes it ("aten::add.Tensor",
    "aten::abs"); None for anything else."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name
    return name if target._overloadname == "default" else f"{name}.{target._overloadname}"


_graphs = []  # [ops in the graph, ops left to PyTorch (None: it failed)] of each graph the back end built
_fallbacks = []  # why the back end ran a graph eagerly (its warnings), during the current case
_harness_errors = []  # what went wrong in _recording's own wrapper, during the current case


@contextlib.contextmanager
def _recording():
    """While it lasts, backend._build records, for each graph the back end
    compiles, its ATen ops and those it left to PyTorch (not in a
    generated kernel, not read through or dropped), and _log.warn_once
    why a graph ran eagerly (each time, not once). Both call through, so
    the back end behaves as without them; both are put back after."""
    from torchneuron_jit import _log, backend
    build, warn_once = backend._build, _log.warn_once

    def recording_build(gm, *args, **kwargs):
        # the back end's own arguments pass through as they are; a failure of this
        # bookkeeping is the harness's (_harness_errors), never the back end's eager fallback
        try:
            entry = [{overload_name(n.target) for n in gm.graph.nodes if n.op == "call_function"} - {None}, None]
            _graphs.append(entry)
        except Exception as exc:
            _harness_errors.append(f"recording the graph failed ({type(exc).__name__}: {exc})")
            raise
        out = build(gm, *args, **kwargs)
        try:
            entry[1] = {overload_name(n.target) for n in out.source.graph.nodes
                        if n.op == "call_function" and not n.meta.get("neuron_kernel")
                        and not n.meta.get("neuron_cat")} - {None}
        except Exception as exc:
            _harness_errors.append(f"recording the compiled plan failed ({type(exc).__name__}: {exc})")
            raise
        return out

    def recording_warn_once(message):
        _fallbacks.append(message)
        return warn_once(message)

    del _graphs[:], _fallbacks[:], _harness_errors[:]
    backend._build, _log.warn_once = recording_build, recording_warn_once
    try:
        with _no_guard_profiling():
            yield
    finally:
        backend._build, _log.warn_once = build, warn_once


@contextlib.contextmanager
def _no_guard_profiling():
    """Dynamo times the guards of every frame it compiles, after flushing
    the CPU caches (torch._dynamo.guards.profile_guard_manager, for a log
    line and a metric): two thirds of a case's time here, where every case
    is a compilation. While this lasts that timing is skipped (0 us);
    the guards themselves are built and checked as always."""
    try:
        import torch._dynamo.guards as guards
    except ImportError:
        guards = None
    profile = getattr(guards, "profile_guard_manager", None)
    if profile is None:
        yield
        return
    guards.profile_guard_manager = lambda *args, **kwargs: 0.0
    try:
        yield
    finally:
        guards.profile_guard_manager = profile


# -- one case ---------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    status: str                   # pass, raises (as eager), fail, dynamo, unexercised
    detail: str = ""
    fallback: bool = False        # a graph ran eagerly (our back end gave up)
    fallback_reason: str = ""     # the back end's warning saying why
    graph_ops: frozenset = frozenset()
    kernel_ops: frozenset = frozenset()   # graph ops that did not run through PyTorch
    seconds: float = 0.0
    source: str = ""              # the function compiled


def _source(obj, tensors, consts):
    """The Python expression of obj in the generated function: a tensor is
    a new argument t<i> (appended to tensors), a list, tuple or dict
    holding tensors is written out, anything else is a constant c<j>
    (appended to consts)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return f"t{len(tensors) - 1}"
    if type(obj) in (list, tuple) and any(isinstance(x, torch.Tensor) for x in _flatten(list(obj))):
        items = [_source(x, tensors, consts) for x in obj]
        return f"[{', '.join(items)}]" if type(obj) is list else f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if type(obj) is dict and any(isinstance(x, torch.Tensor) for x in _flatten(list(obj.values()))):
        return "{" + ", ".join(f"{k!r}: {_source(v, tensors, consts)}" for k, v in obj.items()) + "}"
    consts.append(obj)
    return f"c{len(consts) - 1}"


def _identity_source(expr, dtype):
    """An exact identity of two pointwise ops: -(-t), ~~t for bool."""
    return f"~(~{expr})" if dtype == torch.bool else f"-(-{expr})"


def _epilogue_source(out, expr="out"):
    """The identity applied to every tensor of a result shaped like out."""
    if isinstance(out, torch.Tensor):
        return _identity_source(expr, out.dtype)
    if type(out) in (list, tuple) or (isinstance(out, tuple) and hasattr(out, "_fields")) or \
            type(out).__module__ == "torch.return_types":
        items = [_epilogue_source(x, f"{expr}[{i}]") for i, x in enumerate(out)]
        return f"[{', '.join(items)}]" if type(out) is list else f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    return expr


def make_fn(opinfo, sample, variant, shape_of=None):
    """(fn, tensors, source): fn(*tensors) calls the OpInfo on the sample,
    every tensor an argument (a graph input), everything else a constant;
    in the fused variant between identities on every tensor argument and
    on every tensor of the result (shaped like shape_of, eager's plain
    result). The function is generated, so Dynamo traces only the call."""
    tensors, consts = [], []
    x = _source(sample.input, tensors, consts)
    args = [_source(a, tensors, consts) for a in sample.args]
    kwargs = [f"{k}={_source(v, tensors, consts)}" for k, v in sample.kwargs.items()]
    params = ", ".join(f"t{i}" for i in range(len(tensors)))
    lines = [f"def fn({params}):"]
    if variant == "fused":
        lines += [f"    t{i} = {_identity_source(f't{i}', t.dtype)}" for i, t in enumerate(tensors)]
    lines.append(f"    out = op({', '.join([x] + args + kwargs)})")
    lines.append(f"    return {_epilogue_source(shape_of) if variant == 'fused' else 'out'}")
    source = "\n".join(lines)
    scope = {"op": opinfo.op, **{f"c{j}": c for j, c in enumerate(consts)}}
    exec(compile(source, f"<opinfo {full_name(opinfo)}>", "exec"), scope)
    return scope["fn"], tensors, source


_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
               torch.float64: (1e-7, 1e-7)}  # assert_close's defaults (rtol, atol)


def _flatten(out):
    if isinstance(out, (list, tuple)):
        return [y for x in out for y in _flatten(x)]
    return [out]


def _describe(x):
    if isinstance(x, torch.Tensor):
        return f"{dtype_name(x.dtype)}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__}({', '.join(_describe(y) for y in x)})"
    return type(x).__name__


def _tensor_problem(got, want, ref):
    """Why got is not want (None when it is); ref: the float64 reference
    (a tensor, or a callable giving it) or None."""
    if not isinstance(got, torch.Tensor):
        return f"got {_describe(got)}, eager a tensor {_describe(want)}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {_describe(got)}, eager {_describe(want)}"
    if not want.is_floating_point() and not want.is_complex():
        if torch.equal(got, want):
            return None
        bad = got != want
    else:
        try:
            torch.testing.assert_close(got, want, equal_nan=True)
            return None
        except AssertionError:
            pass
        rtol, atol = _TOLERANCES.get(want.dtype, (1.3e-6, 1e-5))
        g, w = got.double(), want.double()
        bad = ~torch.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        r = ref() if callable(ref) else ref
        if isinstance(r, torch.Tensor) and r.shape == want.shape:
            r = r.double()
            same = (g == w) | (g.isnan() & w.isnan())
            err_ours, err_eager = (g - r).abs(), (w - r).abs()
            bad = ~(same | (err_ours <= err_eager + atol + rtol * r.abs()))
            if not bad.any():
                return None
            pairs = ", ".join(f"{tuple(i)}: got {g[tuple(i)].item()!r} eager {w[tuple(i)].item()!r} "
                              f"float64 {r[tuple(i)].item()!r}" for i in bad.nonzero()[:3].tolist())
            return (f"{dtype_name(want.dtype)}{list(want.shape)}: {int(bad.sum())} of {want.numel()} further from "
                    f"the float64 reference than eager (+ tolerance); {pairs}")
    pairs = ", ".join(f"{tuple(i)}: got {got[tuple(i)].item()!r} eager {want[tuple(i)].item()!r}"
                      for i in bad.nonzero()[:3].tolist())
    return f"{dtype_name(want.dtype)}{list(want.shape)}: {int(bad.sum())} of {want.numel()} differ; {pairs}"


def compare(got, want, ref=None):
    """Why the compiled result got is not eager's want (None when it is).
    ref: None, or a callable giving the float64 reference result."""
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return f"got {_describe(got)}, eager {_describe(want)}"
        refs = None
        for i, (g, w) in enumerate(zip(got, want)):
            def ref_i(i=i):
                nonlocal refs
                if refs is None:
                    r = ref() if ref is not None else None
                    refs = list(r) if isinstance(r, (list, tuple)) and len(r) == len(want) else [None] * len(want)
                return refs[i]
            why = compare(g, w, ref_i if ref is not None else None)
            if why:
                return f"output {i}: {why}"
        return None
    if isinstance(want, torch.Tensor):
        return _tensor_problem(got, want, ref)
    if type(got) is not type(want):
        return f"got {_describe(got)} {got!r}, eager {_describe(want)} {want!r}"
    if got == want or (isinstance(want, float) and math.isnan(want) and math.isnan(got)):
        return None
    return f"got {got!r}, eager {want!r}"


def _causes(exc):
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _short(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def copy_inputs(tensors):
    """Copies of tensors with their layouts (sizes, strides, offsets) and
    their aliasing (tensors over one storage share one copied storage),
    for a run that may write into its inputs."""
    storages = {}
    out = []
    for t in tensors:
        if t.layout != torch.strided:
            out.append(t.clone())
            continue
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes())
        if key not in storages:
            storages[key] = st.clone()
        out.append(torch.empty(0, dtype=t.dtype).set_(storages[key], t.storage_offset(), t.size(), t.stride()))
    return out


def _inputs_differ(got_inputs, want_inputs):
    """Why the inputs after the compiled call are not as eager left them."""
    for i, (g, w) in enumerate(zip(got_inputs, want_inputs)):
        why = _tensor_problem(g, w, None)
        if why:
            return f"input {i} after the compiled call is not as eager left it: {why}"
    return None


def _dynamo_refuses(fn, tensors, exc_type):
    """Whether Dynamo alone (backend="eager", fullgraph) raises exc_type on fn."""
    torch._dynamo.reset()
    try:
        with _no_guard_profiling():
            torch.compile(fn, backend="eager", fullgraph=True)(*tensors)
    except Exception as exc:
        return any(isinstance(e, exc_type) for e in _causes(exc)) or type(exc) is exc_type
    return False


def run_case(opinfo, sample, variant, reference=False):
    """Runs one sample of opinfo in one variant, eagerly and compiled; the Outcome."""
    t0 = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shape_of = None
        form = "fused" if variant == "jit" else variant
        if form == "fused":  # the epilogue follows the plain result's structure
            plain, tensors, _ = make_fn(opinfo, sample, "plain")
            try:
                shape_of = plain(*copy_inputs(tensors))
            except Exception:
                pass
        fn, tensors, source = make_fn(opinfo, sample, form, shape_of)
        out = _run_case(fn, tensors, reference, jit=variant == "jit")
    out.source = source
    out.seconds = time.perf_counter() - t0
    return out


def _compiled_call(fn, tensors, jit):
    """fn's compiled result on tensors: through torch.compile (fullgraph), or
    through torchneuron_jit.jit, called first on copies (the trace: eager's
    result) and then on tensors (the compiled entry)."""
    if not jit:
        return torch.compile(fn, backend="neuron", fullgraph=True)(*tensors)
    jitted = torchneuron_jit.jit(fn)
    try:
        jitted(*copy_inputs(tensors))
    except Exception:  # eager's own error: the compiled call must raise it too
        pass
    return jitted(*tensors)


def _run_case(fn, tensors, reference, jit=False):
    # eager and compiled each on copies (an op may write into its inputs,
    # embedding with max_norm does): afterwards both must be alike
    want_inputs, got_inputs = copy_inputs(tensors), copy_inputs(tensors)
    want = want_exc = None
    try:
        want = fn(*want_inputs)
    except Exception as exc:
        want_exc = exc
    torch._dynamo.reset()
    st0 = torchneuron_jit.stats()
    got = got_exc = None
    with _recording():
        try:
            got = _compiled_call(fn, got_inputs, jit)
        except Exception as exc:
            got_exc = exc
    st1 = torchneuron_jit.stats()
    torch._dynamo.reset()
    fallback = st1["eager_fallbacks"] > st0["eager_fallbacks"]
    compiled = bool(_graphs) or fallback or st1["graphs_compiled"] > st0["graphs_compiled"]
    graph_ops = frozenset(op for ops, _ in _graphs for op in ops)
    kernel_ops = frozenset(op for ops, eager in _graphs if eager is not None for op in ops - eager)
    why_eager = "; ".join(dict.fromkeys(_fallbacks)) if fallback else ""
    done = functools.partial(Outcome, fallback=fallback, graph_ops=graph_ops, kernel_ops=kernel_ops,
                             fallback_reason=why_eager)
    if _harness_errors:  # the back end was not what ran: nothing of ours was tested
        return done("fail", f"the harness failed: {_harness_errors[0]}")

    if want_exc is not None:
        if got_exc is None:
            return done("fail", f"eager raises {_short(want_exc)}; compiled returned {_describe(got)}")
        if any(isinstance(e, type(want_exc)) for e in _causes(got_exc)):
            return done("raises", f"both raise {type(want_exc).__name__}")
        if not jit and _dynamo_refuses(fn, copy_inputs(tensors), type(got_exc)):
            return done("dynamo", f"eager raises {_short(want_exc)}; Dynamo: {_short(got_exc)}")
        return done("fail", f"eager raises {_short(want_exc)}; compiled raises {_short(got_exc)}")
    if got_exc is not None:
        if not jit and _dynamo_refuses(fn, copy_inputs(tensors), type(got_exc)):
            return done("dynamo", _short(got_exc))
        return done("fail", f"compiled raises {_short(got_exc)}; eager returns {_describe(want)}")
    changed = _inputs_differ(got_inputs, want_inputs)
    if changed:
        return done("fail", changed)
    ref = None
    if reference:
        def ref():
            try:
                return fn(*[t.double() if t.is_floating_point() else c for t, c in zip(tensors, copy_inputs(tensors))])
            except Exception:
                return None
    why = compare(got, want, ref)
    if why:
        return done("fail", why)
    if not compiled:
        return done("unexercised", "no graph reached the back end")
    return done("pass")


# -- the sweep --------------------------------------------------------------------

@dataclasses.dataclass
class Case:
    name: str
    dtype: torch.dtype
    index: int
    variant: str
    outcome: Outcome
    reference_inputs: bool = False

    def repro(self):
        return (f"python -m torchneuron_jit.testing.opinfo --op {self.name} --dtype {dtype_name(self.dtype)} "
                f"--sample {self.index} --variant {self.variant}{' --reference-inputs' if self.reference_inputs else ''}"
                f" -v")

    def label(self):
        return f"{self.name} {dtype_name(self.dtype)} sample {self.index} {self.variant}"


def known_reason(name, dtype):
    return KNOWN_FAILURES.get((name, dtype), KNOWN_FAILURES.get((name, None)))


def subset_variants(name, dtype, full):
    """The variants (name, dtype) runs in: both with full, for float32,
    for a known failure, and for OpInfos whose op is a kernel on its own
    (ALONE_OPS); otherwise the CI subset runs only the fused variant (a
    lone pointwise op or view runs through PyTorch: plain tests little)."""
    if full:
        return VARIANTS
    if dtype == torch.float32 or known_reason(name, dtype) is not None or \
            any(op in ALONE_OPS for op in match().opinfos.get(name, ())):
        return ("plain", "fused")
    return ("fused",)


def subset_limit(name, dtype, full):
    """How many samples of (name, dtype) run: all with full, or where the
    pair is a known failure (its failing sample must be reached), else the
    CI subset's."""
    if full or known_reason(name, dtype) is not None:
        return None
    return CI_SAMPLES_FLOAT32 if dtype == torch.float32 else CI_SAMPLES_OTHER


@dataclasses.dataclass
class Result:
    """The cases of one OpInfo, and what they mean against KNOWN_FAILURES."""
    name: str
    cases: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)   # (dtype, why): samples unavailable

    def groups(self):
        g = collections.defaultdict(list)
        for c in self.cases:
            g[c.dtype].append(c)
        return g

    def failures(self):
        """Failed cases that no KNOWN_FAILURES entry covers."""
        return [c for c in self.cases if c.outcome.status == "fail" and known_reason(c.name, c.dtype) is None]

    def known(self):
        """Failed cases a KNOWN_FAILURES entry covers."""
        return [c for c in self.cases if c.outcome.status == "fail" and known_reason(c.name, c.dtype) is not None]

    def unexpected_passes(self):
        """(dtype, reason) of every KNOWN_FAILURES group that ran without failing."""
        out = []
        for dtype, cases in self.groups().items():
            reason = known_reason(self.name, dtype)
            if reason is not None and not any(c.outcome.status == "fail" for c in cases):
                out.append((dtype, reason))
        return out

    def problems(self):
        """One line per failure and unexpected pass (empty: the OpInfo is as the table says)."""
        lines = [f"FAIL {c.label()}: {c.outcome.detail}\n    repro: {c.repro()}" for c in self.failures()]
        lines += [f"UNEXPECTED PASS {self.name} {dtype_name(d)}: listed in KNOWN_FAILURES ({r!r}) but no sample "
                  f"failed" for d, r in self.unexpected_passes()]
        return lines


def run_opinfo(name, full=False, dtypes=None, variants=None, indices=None, log=None, reference_inputs=False):
    """Runs OpInfo name: every dtype it supports (of dtypes), the CI subset
    of samples (all with full; reference_inputs: of its reference inputs),
    in each of variants (default: the subset's, both with full). Returns a
    Result."""
    result = Result(name)
    opinfo = op_db()[name]
    fusion = uses_fusion(name)
    settings = dict(cache=False, **(FUSION_CONFIG if fusion else {}))
    with config.patch(**settings):
        for dtype in dtypes_of(name):
            if dtypes is not None and dtype not in dtypes:
                continue
            try:
                all_samples = samples(name, dtype, reference_inputs)
            except Exception as exc:  # the database's own problem: nothing to run
                result.skipped.append((dtype, _short(exc)))
                continue
            chosen = indices if indices is not None else spread(len(all_samples), subset_limit(name, dtype, full))
            for i in chosen:
                if i >= len(all_samples):
                    continue
                for variant in variants or subset_variants(name, dtype, full):
                    outcome = run_case(opinfo, all_samples[i], variant, reference=fusion)
                    case = Case(name, dtype, i, variant, outcome, reference_inputs)
                    result.cases.append(case)
                    if log:
                        log(case)
    return result


def tested_ops(results):
    """lowered op -> cases that ran it in our code: the case passed (or
    raised as eager), no graph fell back to eager, and the op was in a
    graph the back end compiled and not left to PyTorch. An op of
    DECOMPOSED counts where a case of its OpInfos ran what it becomes."""
    m = match()
    lowered = set(m.ops)
    out = collections.defaultdict(list)
    for r in results:
        for c in r.cases:
            o = c.outcome
            if o.status in ("pass", "raises") and not o.fallback:
                for op in o.kernel_ops & lowered:
                    out[op].append(c)
                for op, into in DECOMPOSED.items():
                    if into in o.kernel_ops and c.name in m.of_op.get(op, ()):
                        out[op].append(c)
    return out


def summary(results, seconds, out=sys.stdout, coverage=True):
    """Prints the sweep's summary (coverage: with the lowered ops no case
    ran in our code); returns whether it succeeded (no failures, no
    unexpected passes)."""
    m = match()
    cases = [c for r in results for c in r.cases]
    status = collections.Counter(c.outcome.status for c in cases)
    failures = [c for r in results for c in r.failures()]
    known = [c for r in results for c in r.known()]
    unexpected = [(r.name, d, why) for r in results for d, why in r.unexpected_passes()]
    fallbacks = [c for c in cases if c.outcome.fallback]
    tested = tested_ops(results)
    p = functools.partial(print, file=out)
    p(f"\n== OpInfo sweep: {len(m.ops)} lowered ops, {len(results)} OpInfos, {len(cases)} cases "
      f"({len({(c.name, c.dtype, c.index) for c in cases})} samples; variants "
      f"{dict(collections.Counter(c.variant for c in cases))}) "
      f"in {seconds:.0f} s")
    p(f"passed {status['pass']}, raised as eager {status['raises']}, known failures {len(known)}, "
      f"unexpected passes {len(unexpected)}, failures {len(failures)}, dynamo unsupported {status['dynamo']}, "
      f"not exercised {status['unexercised']}, eager fallbacks {len(fallbacks)}")
    p(f"OpInfos of {', '.join(sorted({base_name(op) for op in FUSION_OPS}))} ran with "
      f"{', '.join(f'{k}={v}' for k, v in FUSION_CONFIG.items())}")
    if m.no_opinfo:
        p(f"\nlowered ops without an OpInfo of their name ({len(m.no_opinfo)}):")
        for op in m.no_opinfo:
            how = (f"OpInfos {', '.join(m.of_op[op])}" if m.of_op[op] else
                   f"covered elsewhere: {COVERED_ELSEWHERE[op][0]}" if op in COVERED_ELSEWHERE else "NOT COVERED")
            p(f"  {op}: {how}")
    p("\nlowered ops reached through other OpInfos' decompositions: "
      + "; ".join(f"{op} <- {', '.join(names)}" for op, names in REACHED_THROUGH.items()))
    p("lowered ops the back end's decomposition table rewrites first (tested as what they become): "
      + "; ".join(f"{op} -> {into}" for op, into in DECOMPOSED.items()))
    p("lowered ops covered elsewhere: " + "; ".join(f"{op} ({path}: {why})"
                                                 for op, (path, why) in COVERED_ELSEWHERE.items()))
    if known:
        p("\nknown failures by reason:")
        by_reason = collections.Counter(known_reason(c.name, c.dtype) for c in known)
        for reason, n in by_reason.most_common():
            keys = sorted({f"{c.name} {dtype_name(c.dtype)}" for c in known if known_reason(c.name, c.dtype) == reason})
            p(f"  {n:4d}  {reason}\n        ({', '.join(keys)})")
    dyn = [c for c in cases if c.outcome.status == "dynamo"]
    if dyn:
        p("\ndynamo unsupported:")
        for (name, detail), n in collections.Counter((c.name, c.outcome.detail) for c in dyn).most_common():
            p(f"  {n:4d}  {name}: {detail}")
    if fallbacks:
        p("\neager fallbacks (the back end gave up on the graph and ran it eagerly; results matched unless "
          "listed as failures), by OpInfo and reason:")
        groups = collections.defaultdict(list)
        for c in fallbacks:
            groups[(c.name, re.sub(r"node \S+ ", "node ", c.outcome.fallback_reason))].append(c)
        for (name, why), cs in groups.items():
            p(f"  {len(cs):4d}  {name} ({', '.join(sorted({dtype_name(c.dtype) for c in cs}, key=str))}): "
              f"{why or 'no reason given'}\n        e.g. {cs[0].repro()}")
    unexercised = collections.Counter(c.name for c in cases if c.outcome.status == "unexercised")
    if unexercised:
        p("\nnot exercised (no graph reached the back end): "
          + ", ".join(f"{n} x{k}" for n, k in sorted(unexercised.items())))
    not_run = [op for op in m.ops if op not in tested and op not in COVERED_ELSEWHERE]
    if not_run and coverage:
        p(f"\nlowered ops no passing case ran in our code this time ({len(not_run)}): {', '.join(not_run)}")
    for r in results:
        for dtype, why in r.skipped:
            p(f"skipped {r.name} {dtype_name(dtype)}: samples unavailable ({why})")
    for name, dtype, why in unexpected:
        p(f"UNEXPECTED PASS {name} {dtype_name(dtype)}: listed as {why!r}")
    if failures:
        p(f"\nfailures ({len(failures)}):")
        for c in failures:
            p(f"FAIL {c.label()}: {c.outcome.detail}\n    repro: {c.repro()}")
    ok = not failures and not unexpected
    p(f"\n{'OK' if ok else 'FAILED'}")
    return ok


def _show_case(case, opinfo, sample):
    """-v: the sample and the outcome of one case."""
    print(f"{case.label()}: {case.outcome.status} {case.outcome.detail}")
    print(f"  sample: input {_describe(sample.input)} args {sample.args!r:.300} kwargs {sample.kwargs!r:.300}")
    print("  " + case.outcome.source.replace("\n", "\n  "))
    print(f"  ops in the graph: {sorted(case.outcome.graph_ops)}; in our code: {sorted(case.outcome.kernel_ops)}"
          f"{f'; FELL BACK TO EAGER: {case.outcome.fallback_reason}' if case.outcome.fallback else ''}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torchneuron_jit.testing.opinfo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="every sample of every dtype (default: the CI subset)")
    parser.add_argument("--op", action="append", help="OpInfo name or lowered op (aten::add.Tensor); repeatable")
    parser.add_argument("--dtype", action="append", choices=sorted(_DTYPE_BY_NAME), help="repeatable")
    parser.add_argument("--sample", type=int, action="append", help="sample index (all dtypes' lists); repeatable")
    parser.add_argument("--variant", choices=VARIANTS, action="append")
    parser.add_argument("--reference-inputs", action="store_true",
                        help="the OpInfos' reference_inputs (more samples, extremal values) instead of sample_inputs")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per case")
    parser.add_argument("--list", action="store_true", help="the matching of lowered ops to OpInfos, and exit")
    a = parser.parse_args(argv)
    config.cache = False  # nothing written under the user's cache directory
    m = match()
    if a.list:
        for op in m.ops:
            where = COVERED_ELSEWHERE.get(op, ("",))[0]
            print(f"{op}: {', '.join(m.of_op[op]) or '-'}{f'  (covered elsewhere: {where})' if where else ''}")
        print(f"\n{len(m.ops)} lowered ops, {len(m.opinfos)} OpInfos; without an OpInfo of their name: "
              f"{', '.join(m.no_opinfo) or 'none'}")
        return 0
    names = list(m.opinfos)
    if a.op:
        names = []
        for want in a.op:
            got = [want] if want in m.opinfos else m.of_op.get(want) or m.of_op.get(f"aten::{want}")
            if not got:
                parser.error(f"--op {want}: no such OpInfo or lowered op (see --list)")
            names += [n for n in got if n not in names]
    dtypes = [_DTYPE_BY_NAME[d] for d in a.dtype] if a.dtype else None
    variants = tuple(a.variant) if a.variant else None
    db = op_db()

    def log(case):
        o = case.outcome
        if a.verbose:
            if a.sample is not None:
                _show_case(case, db[case.name], samples(case.name, case.dtype, a.reference_inputs)[case.index])
            else:
                print(f"  {case.label()}: {o.status}{' (eager fallback)' if o.fallback else ''} "
                      f"{o.detail} [{o.seconds * 1e3:.0f} ms]", flush=True)
        elif o.status == "fail" and known_reason(case.name, case.dtype) is None:
            print(f"FAIL {case.label()}: {o.detail}", flush=True)

    t0 = time.perf_counter()
    results = []
    for n in names:
        t1 = time.perf_counter()
        r = run_opinfo(n, full=a.all or a.sample is not None, dtypes=dtypes, variants=variants, indices=a.sample,
                       log=log, reference_inputs=a.reference_inputs)
        results.append(r)
        print(f"{n}: {len(r.cases)} cases, {len(r.failures())} failures, {len(r.known())} known "
              f"[{time.perf_counter() - t1:.1f} s]", flush=True)
    return 0 if summary(results, time.perf_counter() - t0, coverage=not a.op) else 1


if __name__ == "__main__":
    sys.exit(main())
