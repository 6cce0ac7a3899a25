"""Linear layers that stay in PyTorch: which of torch's own GEMMs runs each.

A float32 ``aten.linear`` that no generated kernel absorbs runs through
PyTorch, and torch has two kernels for it: ``aten.linear`` (MKL's sgemm in
the CPU wheels) and oneDNN's ``mkldnn._linear_pointwise``, which also takes
the op after the product into the same call: a bias added separately, relu,
gelu, or an added residual. Neither wins everywhere (on a Zen 4 host oneDNN
measured 15-25% faster from 256 rows up, MKL twice as fast at 4 rows), so
each such unit is timed, both ways, when its graph is lowered, and oneDNN
takes it only where it measured clearly faster. The choices are stored with
the graph's artifact: a process that finds them in the cache measures
nothing. Either way the numbers are eager's up to the order of the sums.

With config.onednn_packed_weights a third variant is timed: oneDNN on a
copy of the weight packed into its blocked layout (PackedLinear), several
times faster than both at a few rows. The copy is remade whenever the
weight is another tensor or its version counter moved; writes that bypass
the counter are not seen, hence the opt-in.
"""
import contextlib
import math
import threading
import time
import weakref
from dataclasses import dataclass

import sympy
import torch
from torch.fx.node import map_arg

from . import _C, _log
from ._spec import dense_strides
from .graph import static_val

aten = torch.ops.aten

# oneDNN must beat aten.linear by this factor (least times) to take a unit.
MARGIN = 0.95

# Measuring one unit (_least_seconds): samples of each variant that count,
# the time after which it stops at MIN_SAMPLES, and the most rounds.
MIN_SAMPLES, MAX_SAMPLES, BUDGET_S, MAX_ROUNDS = 3, 15, 0.012, 60


def available():
    """Whether this torch has oneDNN's linear op."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@dataclass
class Unit:
    """A linear layer and the ops folded into it."""
    nodes: list            # the aten.linear node first, then the folded ops in order
    x: torch.fx.Node
    w: torch.fx.Node
    b: object              # bias node or None
    attr: str = "none"     # oneDNN post-op: none, relu, gelu, or add (with other)
    algorithm: str = ""    # gelu's approximation
    other: object = None   # the residual of attr "add"
    bias_added: bool = False  # b is added by an add node after the product (not linear's own bias)

    def rows(self, fewest=False):
        """Rows of the product (the input's elements over its last dim; for
        rows of a symbolic size, the size of the trace that made them, or,
        fewest, the least its dynamic sizes take)."""
        return math.prod(_hinted(self.x, fewest)[0][:-1])

    def describe(self):
        w = static_val(self.w)
        extra = {"none": "", "add": " + residual"}.get(self.attr, f" + {self.attr}")
        rows = f"{self.rows()}" + ("" if static_val(self.x) is not None else " (dynamic)")
        return f"linear {rows}x{w.shape[1]}->{w.shape[0]}{' + bias' if self.b is not None else ''}{extra}"

    def signature(self):
        """What the unit's timing depends on (sizes of a symbolic input as
        their hints: the choice for dynamic rows is the one at the rows the
        trace saw)."""
        def sig(n):
            return None if n is None else _hinted(n)
        return (sig(self.x), sig(self.w), sig(self.b), self.attr, self.algorithm, sig(self.other),
                call_threads()) + (("dynamic rows",) if self.dynamic() else ())

    def dynamic(self):
        """Whether the unit's rows are symbolic (a jit variant's dynamic sizes)."""
        return static_val(self.x) is None


def _tensor(node):
    """node's example value when it is a tensor (its sizes may be symbolic), else None."""
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _exprs(ints):
    """Sizes or strides as sympy expressions, symbolic ones by their expression (no guard is asked)."""
    return [i.node.expr if isinstance(i, torch.SymInt) else sympy.Integer(i) for i in ints]


def _same_exprs(a, b):
    """Whether two size or stride lists are the same for every value of their symbols."""
    a, b = _exprs(a), _exprs(b)
    return len(a) == len(b) and all(sympy.expand(x - y) == 0 for x, y in zip(a, b))


def _row_major(v):
    """Whether tensor v (sizes perhaps symbolic) is row-major for every
    value of its symbols (a dimension of static size 1 has any stride)."""
    expect, sizes = sympy.Integer(1), _exprs(v.shape)
    for size, stride in reversed(list(zip(sizes, _exprs(v.stride())))):
        if size != 1 and sympy.expand(stride - expect) != 0:
            return False
        expect = expect * size
    return True


def _hinted(node, fewest=False):
    """(sizes, strides) of node's value, a symbolic size as the value the
    trace saw (its hint); fewest: with each symbol at the least of 2, 4,
    8, ... at which every size is a whole number of 1 or more, the least
    a dynamic size takes (row-major strides: only for a row-major value).
    At 2 a size 2 * s is 4; transformers' Swin divides by sizes that are 0
    below s = 32 (each window's count: ((s // 4 + 1) // 8)), which raised
    ZeroDivisionError and sent its whole graph to eager. Sizes at no such
    value are the hints."""
    v = _tensor(node)

    def hint(ints):
        return tuple(int(d.node.hint) if isinstance(d, torch.SymInt) else d for d in ints)
    if fewest:
        exprs = [d.node.expr if isinstance(d, torch.SymInt) else d for d in v.shape]
        symbols = set().union(*(e.free_symbols for e in exprs if isinstance(e, sympy.Expr)))
        value = 2
        while symbols and value <= max(hint(v.shape)):
            try:
                sizes = tuple(e.xreplace({sym: value for sym in symbols}) if isinstance(e, sympy.Expr) else e
                              for e in exprs)
            except ZeroDivisionError:
                sizes = None
            if sizes is not None and all(isinstance(n, int) or (n.is_Integer and n >= 1) for n in sizes):
                sizes = tuple(int(n) for n in sizes)
                return sizes, dense_strides(sizes)
            value *= 2
        sizes = hint(v.shape)
        return sizes, dense_strides(sizes)
    return hint(v.shape), hint(v.stride())


def _f32(node, dims=None, static=True):
    """A float32 tensor (of dims dimensions); static: of static sizes too.
    Symbolic sizes must have hints (the sizes of the trace), for timing."""
    v = static_val(node) if static else _tensor(node)
    if v is None or v.dtype != torch.float32 or (dims is not None and v.dim() != dims):
        return False
    return static or all(not isinstance(d, torch.SymInt) or d.node.hint is not None for d in (*v.shape, *v.stride()))


def _only_user(node):
    return next(iter(node.users)) if len(node.users) == 1 else None


def _add_operand(add, node):
    """The other operand of add.Tensor(node, c) or add.Tensor(c, node)
    without alpha, or None."""
    if add is None or add.target is not aten.add.Tensor or add.kwargs or len(add.args) != 2:
        return None
    a, c = add.args
    if c is node:
        a, c = c, a
    return c if a is node and isinstance(c, torch.fx.Node) and c is not node else None


def find_unit(node):
    """The unit a float32 aten.linear node heads, or None when oneDNN
    cannot take it. The weight and bias have static sizes; the input's
    rows may be symbolic (a jit variant with dynamic sizes): what the unit
    needs of its shapes is then checked for every value of the symbols,
    so no guard is asked after the variant's guards were taken."""
    if node.op != "call_function" or node.target is not aten.linear.default or node.kwargs:
        return None
    x, w, b = (*node.args, None)[:3]
    out = _tensor(node)
    if not (_f32(x, static=False) and _f32(w, 2) and (b is None or _f32(b, 1)) and out is not None
            and out.dtype == torch.float32
            and (static_val(node) is None or out.numel() > 0) and static_val(w).shape[1] > 0):
        return None  # oneDNN makes no primitive for an empty product (K = 0; eager's result is 0s or bias)
    unit = Unit([node], x, w, b)
    tail = node
    c = _add_operand(_only_user(tail), tail)
    if b is None and c is not None and _f32(c, 1) and _same_exprs(static_val(c).shape, out.shape[-1:]):
        tail = _only_user(tail)
        unit.nodes.append(tail)
        unit.b, unit.bias_added = c, True
    user = _only_user(tail)
    c = _add_operand(user, tail)
    if user is None:
        pass
    elif user.target is aten.relu.default and len(user.args) == 1:
        unit.attr = "relu"
    elif user.target is aten.gelu.default and len(user.args) == 1 \
            and user.kwargs.get("approximate", "none") in ("none", "tanh"):
        unit.attr, unit.algorithm = "gelu", user.kwargs.get("approximate", "none")
    elif c is not None and _f32(c, static=False) and _same_exprs(_tensor(c).shape, out.shape):
        unit.attr, unit.other = "add", c
    if unit.attr != "none":
        unit.nodes.append(user)
    last = _tensor(unit.nodes[-1])
    if last is None or last.dtype != torch.float32 or not _row_major(last):
        return None  # oneDNN's result is contiguous: only where eager's is too
    return unit


def _linear_pointwise(x, w, b, attr, algorithm, other=None):
    """One oneDNN linear call with its post-op: attr "add" adds other (binary form)."""
    if other is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, w, b, "add")
    return torch.ops.mkldnn._linear_pointwise.default(x, w, b, attr, [], algorithm)


class PackedLinear:
    """A linear unit run by oneDNN from a packed copy of its weight.

    The copy is made on the first call and again whenever the weight is
    another tensor, was written in place (its version counter moved) or
    now lives elsewhere (``.data`` replaced); the weight's old storage is
    held meanwhile, so its address cannot be reused unnoticed. Writes that
    bypass the version counter (through ``.data``, numpy views) are not
    seen. Inference tensors have no version counter: they run unpacked.
    """

    __name__ = __qualname__ = "onednn_packed_linear"

    def __init__(self, attr, algorithm, rows):
        self.attr, self.algorithm, self.rows = attr, algorithm, rows
        self._state = None  # (weakref to the weight, version, data_ptr, alias holding its storage, packed)

    def packed(self, w):
        try:
            version = w._version
        except RuntimeError:  # an inference tensor
            return w
        # a view made on each call (a Conv1D weight's transpose) stands for its base, whose counter it shares
        owner = w._base if w._base is not None else w
        state = self._state
        if state is not None and state[0]() is owner and state[1] == version and state[2] == w.data_ptr():
            return state[4]
        alias = w.detach()
        packed = torch.ops.mkldnn._reorder_linear_weight(alias, self.rows)
        self._state = (weakref.ref(owner), version, w.data_ptr(), alias, packed)
        return packed

    def __call__(self, x, w, b, other=None):
        return _linear_pointwise(x, self.packed(w), b, self.attr, self.algorithm, other)

    def __repr__(self):
        return "oneDNN packed linear"


class SwitchedLinear:
    """A linear unit whose rows change (a jit variant with dynamic sizes):
    one oneDNN call from `rows` rows up, where it measured faster, and the
    graph's own ops below (aten.linear, then the bias add and the op after
    it, as eager runs them), where MKL's sgemm wins."""

    __name__ = __qualname__ = "onednn_linear_from_rows"

    def __init__(self, attr, algorithm, rows, bias_added):
        self.attr, self.algorithm, self.rows, self.bias_added = attr, algorithm, rows, bias_added

    def __call__(self, x, w, b, other=None):
        if x.numel() >= self.rows * w.shape[1]:
            return _linear_pointwise(x, w, b, self.attr, self.algorithm, other)
        y = aten.linear.default(x, w, None if self.bias_added else b)
        if self.bias_added:
            y = aten.add.Tensor(y, b)
        if self.attr == "relu":
            return aten.relu.default(y)
        if self.attr == "gelu":
            return aten.gelu.default(y, approximate=self.algorithm)
        return aten.add.Tensor(y, other) if self.attr == "add" else y

    def __repr__(self):
        return f"oneDNN linear from {self.rows} rows"


def _onednn_call(unit, kind="onednn"):
    """(target, args) of the one oneDNN call that replaces unit (kind
    "onednn", "packed" for a PackedLinear, or "onednn@R" for a
    SwitchedLinear from R rows)."""
    args = (unit.x, unit.w, unit.b) + ((unit.other,) if unit.attr == "add" else ())
    if kind.startswith("onednn@"):
        return SwitchedLinear(unit.attr, unit.algorithm, int(kind[7:]), unit.bias_added), args
    if kind == "packed":
        return PackedLinear(unit.attr, unit.algorithm, unit.rows()), args
    if unit.attr == "add":
        return torch.ops.mkldnn._linear_pointwise.binary, (unit.x, unit.other, unit.w, unit.b, "add")
    return torch.ops.mkldnn._linear_pointwise.default, (unit.x, unit.w, unit.b, unit.attr, [], unit.algorithm)


def _example(node, fewest=False):
    """A random tensor laid out as node's example value (symbolic sizes as
    the trace's, or, fewest, as 2), drawn from a generator of its own: a
    compile leaves the caller's random numbers as they were (generate()'s
    sampling would otherwise draw other tokens than eager's)."""
    shape, stride = _hinted(node, fewest)
    generator = torch.Generator().manual_seed(0)
    # drawn into the memory the layout spans, then viewed: an expanded layout (stride 0) overlaps itself,
    # which normal_ refuses to write
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(shape, stride)) if all(shape) else 0
    memory = torch.empty(span, dtype=_tensor(node).dtype).normal_(generator=generator)
    return memory.as_strided(shape, stride)


def _least_seconds(fns):
    """Least seconds of each of fns, run interleaved so drift hits all.

    A background build of jit measures while calls are served: a jitted
    call beside a sample (PyTorch's threads of both on the same cores)
    made oneDNN read 3-10x slower than it is and a dynamic variant keep
    MKL for its largest layers, at half oneDNN's speed. So a sample counts
    only when no jitted call of another thread was in flight at its start
    (a build made inside its own call, compile_blocking, is not beside
    it), none began during it and the build did not pause for one inside
    it; rounds go on, the build pausing between them while calls run,
    until each fn has MIN_SAMPLES that count and BUDGET_S has passed, or
    MAX_ROUNDS. The least sample is taken: whatever else runs beside one
    can only add to it. With too few samples that count (calls that never
    stop), all are taken."""
    quiet = [[] for _ in fns]
    every = [[] for _ in fns]
    for fn in fns:
        fn()
    deadline = time.perf_counter() + BUDGET_S
    for _ in range(MAX_ROUNDS):
        if len(quiet[0]) >= MAX_SAMPLES or (min(map(len, quiet)) >= MIN_SAMPLES and time.perf_counter() > deadline):
            break
        for fn, q, e in zip(fns, quiet, every):
            pauses = _C.build_pauses()
            in_flight, begun = _C.build_calls()  # a call in flight: the build pauses here first
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            e.append(dt)
            if in_flight == 0 and _C.build_calls()[1] == begun and _C.build_pauses() == pauses:
                q.append(dt)
    return [min(q if len(q) >= MIN_SAMPLES else e) for q, e in zip(quiet, every)]


_measuring = threading.local()  # .threads: OpenMP threads of the calls this thread's measurements are for


@contextlib.contextmanager
def measured_with(threads, run_on=None):
    """Measurements made on this thread inside it run on a thread of their
    own with threads OpenMP threads (run_on where given): a background build
    runs its own ops on one (own_threads), and its choices are for
    calls that run on threads. A build's child lent a thread by calls that
    keep every core busy measures on run_on = 1: two threads time-sliced on
    the one core it gets made MKL read twice its time and took oneDNN for
    layers MKL serves faster. The measuring thread ends with each
    measurement, and the team of OpenMP threads it ran with ends with it
    (yield_py.c: a team left alive slows every call)."""
    was = getattr(_measuring, "threads", None), getattr(_measuring, "run_on", None)
    _measuring.threads, _measuring.run_on = threads, run_on
    try:
        yield
    finally:
        _measuring.threads, _measuring.run_on = was


def own_threads(n):
    """This thread's PyTorch ops (its OpenMP parallel regions) on n threads,
    other threads' kept. PyTorch sets a thread's OpenMP count to
    torch.set_num_threads' on the thread's first op (a lazy init, which
    torch.get_num_threads runs): done first, or that op undid this, and a
    background build after torch.set_num_threads(2) ran its ops on two."""
    from . import backend
    backend._share_torch_threads()  # how: torch's own OpenMP runtime
    torch.get_num_threads()
    _C.build_omp_threads(n)


def call_threads():
    """The OpenMP threads the calls being compiled for run on: measured_with's
    inside it (a background build's own thread, or a build's child process,
    runs on one), else this thread's."""
    threads = getattr(_measuring, "threads", None)
    return threads if threads is not None else torch.get_num_threads()


def _timed(fns):
    """_least_seconds(fns) here, or on a thread of _measuring.threads
    OpenMP threads that pauses for jitted calls as a build does."""
    threads = getattr(_measuring, "threads", None)
    if threads is None:
        return _least_seconds(fns)
    threads = getattr(_measuring, "run_on", None) or threads
    out = {}

    def run():
        try:
            own_threads(threads)
            _C.build_yield()
            with torch.no_grad():
                out["seconds"] = _least_seconds(fns)
        except BaseException as exc:  # raised again on the build's thread
            out["error"] = exc
        finally:
            _C.build_yield(0)

    t = threading.Thread(target=run, name="torchneuron_jit measure", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["seconds"]


def measure(unit, kinds=("onednn",), fewest=False):
    """{"aten": seconds, kind: seconds for each of kinds}: least times of the
    unit run as the graph has it and as one oneDNN call of each kind
    ("onednn", "packed": packed once beforehand, as in steady state), on
    random inputs of its layouts (fewest: with its dynamic sizes at 2)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily(), torch.no_grad():
        leaves = {n: _example(n, fewest and n in (unit.x, unit.other)) for n in (unit.x, unit.w, unit.b, unit.other)
                  if n is not None}

        def as_graph():
            values = dict(leaves)
            for n in unit.nodes:
                values[n] = n.target(*map_arg(n.args, values.__getitem__), **n.kwargs)
            return values[unit.nodes[-1]]

        fns = [as_graph]
        for kind in kinds:
            target, args = _onednn_call(unit, kind)
            fns.append(lambda target=target, args=map_arg(args, leaves.__getitem__): target(*args))
        return dict(zip(("aten",) + tuple(kinds), _timed(fns)))


KINDS = ("aten", "onednn", "packed")  # and "onednn@R" (known_kind)


def known_kind(kind):
    """Whether kind is one a choice may hold: KINDS, or "onednn@R" (R rows, a positive int)."""
    return kind in KINDS or (isinstance(kind, str) and kind.startswith("onednn@") and kind[7:].isdigit()
                             and int(kind[7:]) > 0)


def _dynamic_choice(unit, times):
    """The kind of a unit of dynamic rows whose oneDNN call measured
    faster at the trace's rows (times): "onednn" where it is faster at the
    fewest rows too, else "onednn@R", R where the two times cross (each
    taken as linear in the rows between the two measurements)."""
    few = measure(unit, ("onednn",), fewest=True)
    r1, r2 = unit.rows(fewest=True), unit.rows()
    if few["onednn"] < MARGIN * few["aten"] or r2 <= r1:
        return "onednn", few
    # aten - onednn goes from negative (few rows) to positive (the trace's rows): where it is 0
    d1, d2 = MARGIN * few["aten"] - few["onednn"], MARGIN * times["aten"] - times["onednn"]
    cross = r1 + (r2 - r1) * (-d1) / (d2 - d1)
    return f"onednn@{max(r1 + 1, min(r2, math.ceil(cross)))}", few


def choose(graph_units, choices, packed=False):
    """[(index, kind)] for the units of graph_units that oneDNN should run
    ("onednn", or "packed" when packed weights may be timed too). Each
    distinct signature is timed once: choices (get(sig) -> kind or None,
    put(sig, kind)) remembers what was timed, for the caller across graphs
    and processes."""
    chosen = []
    for i, unit in enumerate(graph_units):
        sig = (unit.signature(), packed)
        kind = choices.get(sig)
        if kind is None:
            # rows that change: oneDNN unpacked, where it wins (packing is for one batch size)
            kinds = ("onednn", "packed") if packed and not unit.dynamic() else ("onednn",)
            times = measure(unit, kinds)
            fastest = min(times, key=times.get)
            kind = fastest if times[fastest] < MARGIN * times["aten"] else "aten"
            words = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in times.items())
            if kind != "aten" and unit.dynamic():
                # MKL wins at a few rows: below where the two cross, the unit runs as the graph has it
                kind, few = _dynamic_choice(unit, times)
                words += f"; at {unit.rows(fewest=True)} rows " + ", ".join(f"{k} {v * 1e6:.0f} us"
                                                                           for k, v in few.items())
            choices.put(sig, kind)
            _log.event("compile", f"{unit.describe()}: {words} -> {kind}")
        if kind != "aten":
            chosen.append((i, kind))
    return chosen


def rewrite(graph, head, kind="onednn"):
    """Replaces the unit that the linear node head heads by its oneDNN call
    of kind ("onednn" or "packed"). The unit is found again on the graph as
    it is now: an earlier rewrite may have replaced one of its operands."""
    unit = find_unit(head)
    if unit is None:
        raise RuntimeError(f"{head.name} no longer heads a linear unit")
    target, args = _onednn_call(unit, kind)
    tail = unit.nodes[-1]
    with graph.inserting_before(tail):
        call = graph.call_function(target, args)
    call.meta = dict(tail.meta)
    call.meta["neuron_gemm"] = True  # an external GEMM step of ours (backend._fallback_report_of)
    tail.replace_all_uses_with(call)
    for n in reversed(unit.nodes):
        graph.erase_node(n)
