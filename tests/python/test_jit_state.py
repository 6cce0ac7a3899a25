"""jit and Python state: every value a trace read through a global, a
closure or what they hold is guarded (a change is a miss, in words); a
traced call that writes state outliving it, or reads values from outside
torch (random, time, os.environ, numpy's RNG), runs eagerly with one
warning naming what and where. Each call is compared with eager from the
same state, results and state both."""
import array
import builtins
import collections
import contextlib
import copy
import functools
import enum
import inspect
import io
import math
import operator
import os
import random
import sys
import threading
import time
import types
import warnings
import weakref

import numpy as np
import pytest
import torch

import torchneuron_jit
from test_jit import _recompile_reason

pytestmark = pytest.mark.usefixtures("fresh_backend")

X = torch.arange(4.0) + 1


def _same_as_eager(f, set_state, read_state, calls=4):
    """Calls jit(f) and f from the same state (set_state(i) before call i)
    and compares results and the state after (read_state()). Returns the
    jit door's warnings."""
    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(calls):
            set_state(i)
            got = jf(X)
            got_state = read_state()
            set_state(i)
            want = f(X)
            torch.testing.assert_close(got, want, msg=lambda m: f"call {i}: {m}")
            assert got_state == read_state(), f"call {i}: state {got_state} after jit, {read_state()} after eager"
    return [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]


def _miss(jf, change):
    """Calls jitted jf once, then change(), then jf again: (its result, the
    recompiles log of that call). Without trace records: the miss words
    come from a trace, and a record the calls before stored would be
    loaded instead."""
    with torchneuron_jit.config.patch(jit_trace_records=False):
        jf(X)
        change()
        return _recompile_reason(jf, X)


def _one_warning(messages, *words):
    assert len(messages) == 1, messages
    for w in words:
        assert w in messages[0], (w, messages[0])


# -- reads ----------------------------------------------------------------------------

CFG = {"scale": 2.0, "inner": {"shift": 1.0}}


def _cfg_scale(x):
    return x * CFG["scale"] + CFG["inner"]["shift"]


def test_a_value_read_through_a_global_dict_is_guarded():
    def set_state(i):
        CFG["scale"], CFG["inner"]["shift"] = 2.0 + (i > 1) * 3.0, 1.0 + (i == 3)

    assert _same_as_eager(_cfg_scale, set_state, lambda: repr(CFG)) == []
    jf = torchneuron_jit.jit(_cfg_scale)
    CFG["scale"], CFG["inner"]["shift"] = 2.0, 1.0
    out, log = _miss(jf, lambda: CFG.update(scale=5.0))
    torch.testing.assert_close(out, X * 5.0 + 1.0)
    assert "global CFG['scale']: 2.0 → 5.0" in log, log
    CFG["scale"] = 2.0
    out, log = _miss(jf, lambda: CFG["inner"].update(shift=4.0))
    torch.testing.assert_close(out, X * 2.0 + 4.0)
    assert "global CFG['inner']['shift']: 1.0 → 4.0" in log, log
    CFG["inner"]["shift"] = 1.0
    CFG["scale"], CFG["inner"]["shift"] = 2.0, 1.0


def _reads_builtin_max(x):
    return x * max(x.shape[0], 2)


def test_a_global_that_comes_to_shadow_a_builtin_is_a_miss():
    """The code reads the builtin max; a global max defined after the trace
    shadows it for eager, so the variant must miss (it answered with the
    builtin's value before), in words; removing the global hits again."""
    jf = torchneuron_jit.jit(_reads_builtin_max)
    torch.testing.assert_close(jf(X), X * 4)
    try:
        out, log = _miss(jf, lambda: globals().__setitem__("max", lambda a, b: 7))
        torch.testing.assert_close(out, X * 7)
        assert "global max: defined, where the builtin max was read" in log, log
    finally:
        globals().pop("max", None)
    torch.testing.assert_close(jf(X), X * 4)


def test_a_list_item_read_through_a_closure_is_guarded():
    def make():
        k = [2.0]

        def f(x):
            return x * k[0]
        return f, k

    f, k = make()

    def set_state(i):
        k[0] = [2.0, 2.0, 5.0, 7.0][i]

    assert _same_as_eager(f, set_state, lambda: list(k)) == []
    k[0] = 2.0
    out, log = _miss(torchneuron_jit.jit(f), lambda: k.__setitem__(0, 5.0))
    torch.testing.assert_close(out, X * 5.0)
    assert "closure k[0]: 2.0 → 5.0" in log, log


class _Settings:
    def __init__(self, s):
        self.s = s


SETTINGS = _Settings(2.0)


class _Scales:
    factor = 3.0


def _attr_reads(x):
    return x * SETTINGS.s + _Scales.factor


def test_attributes_of_a_plain_object_and_a_class_held_by_globals_are_guarded():
    def set_state(i):
        SETTINGS.s = [2.0, 3.0, 3.0, 4.0][i]
        _Scales.factor = [3.0, 3.0, 6.0, 6.0][i]

    assert _same_as_eager(_attr_reads, set_state, lambda: (SETTINGS.s, _Scales.factor)) == []
    SETTINGS.s, _Scales.factor = 2.0, 3.0
    out, log = _miss(torchneuron_jit.jit(_attr_reads), lambda: setattr(SETTINGS, "s", 5.0))
    torch.testing.assert_close(out, X * 5.0 + 3.0)
    assert "global SETTINGS.s: 2.0 → 5.0" in log, log
    SETTINGS.s = 2.0


def test_state_reads_that_do_not_change_keep_hitting():
    jf = torchneuron_jit.jit(_cfg_scale)
    for _ in range(5):
        torch.testing.assert_close(jf(X), _cfg_scale(X))
    assert torchneuron_jit.stats()["traces"] == 1
    assert torchneuron_jit.stats()["graphs_compiled"] == 1


class _Items(dict):
    pass


class _SlotAndDict:
    __slots__ = ("scale", "__dict__")

    def __init__(self):
        self.scale = 2.0


HELD = None


def _held_scale(x):
    return x * (HELD["scale"] if isinstance(HELD, dict) else HELD.scale)


@pytest.mark.parametrize("make, eager", [
    (lambda: collections.OrderedDict(scale=2.0), False),
    (lambda: _Items(scale=2.0), False),
    (_SlotAndDict, True),
    (lambda: types.SimpleNamespace(scale=2.0), False),
], ids=["OrderedDict", "dict subclass", "slots and a __dict__", "SimpleNamespace"])
def test_state_a_global_keeps_outside_its_dict_is_guarded_or_runs_eagerly(make, eager):
    """An OrderedDict's or a dict subclass's items, and a slot's value, are
    not in the object's __dict__: jit guarded that (empty) __dict__ and
    answered with the first value after the global's value changed in
    place. The items are guarded as a dict's; a slot makes it run eagerly.
    A types.SimpleNamespace (a C type) keeps its state in __dict__ alone:
    it ran eagerly, where an argparse.Namespace compiled."""
    global HELD
    held = make()

    def set_state(i):
        global HELD
        HELD = held
        if not isinstance(held, dict):
            held.scale = 2.0 + i
        else:
            held["scale"] = 2.0 + i

    try:
        messages = _same_as_eager(_held_scale, set_state, lambda: None)
    finally:
        HELD = None
    assert [m for m in messages if "whose contents jit cannot guard" in m] == \
        (["torchneuron_jit: _held_scale (" + __file__ + f":{_held_scale.__code__.co_firstlineno}) runs eagerly: "
          "global HELD is a _SlotAndDict, whose contents jit cannot guard (pass what the function needs from it "
          "as an argument)"] if eager else []), messages


class _ScaledItems(dict):
    mult = 1.0

    def __getitem__(self, key):
        return super().__getitem__(key) * self.mult


SCALED = _ScaledItems(a=2.0)


def _scaled_item(x):
    return x * SCALED["a"]


@pytest.mark.parametrize("where", ["instance", "class"])
def test_a_dict_subclass_whose_methods_read_its_attributes_is_guarded_by_them(where):
    """A dict subclass of the user's whose __getitem__ reads self.mult:
    with no attribute of its own at the trace, only its items (and its
    class) were guarded, and mult set on it changed eager's answer and
    not the compiled one."""
    def set_state(i):
        target = SCALED if where == "instance" else _ScaledItems
        target.mult = 1.0 + i

    try:
        assert _same_as_eager(_scaled_item, set_state, lambda: None) == []
    finally:
        vars(SCALED).pop("mult", None)
        _ScaledItems.mult = 1.0


class _ClassHeld:
    weights = [1.0]
    opts = {"scale": 1.0}


class _SubClassHeld(_ClassHeld):
    pass


def _registry_weight(x):
    return x * _SubClassHeld.weights[0] + _ClassHeld.opts["scale"]


def test_a_list_or_dict_a_class_attribute_holds_is_guarded_by_content():
    """The class's dict was guarded by identity only: a list item or dict
    value changed in place (read through a subclass too) kept the traced
    value."""
    def set_state(i):
        _ClassHeld.weights[0], _ClassHeld.opts["scale"] = 1.0 + i, 2.0 * i

    try:
        assert _same_as_eager(_registry_weight, set_state, lambda: None) == []
    finally:
        _ClassHeld.weights[0], _ClassHeld.opts["scale"] = 1.0, 1.0


class _Counted:
    n = 0

    @classmethod
    def bump(cls):
        cls.n += 1
        return cls.n

    def tick(self):
        type(self).n += 1
        return type(self).n


_COUNTED_LOG = []
_COUNTED_APPEND = _COUNTED_LOG.append
_COUNTED_N = 0


def _bumps_through_cls(x):
    return x * _Counted.bump()


def _bumps_through_type_of_self(x):
    return x * _Counted().tick()


def _appends_through_a_bound_builtin(x):
    _COUNTED_APPEND(1)
    return x * 2


def _rebinds_through_globals(x):
    globals()["_COUNTED_N"] += 1
    return x * globals()["_COUNTED_N"]


def _rebinds_through_setattr(x):
    setattr(sys.modules[__name__], "_COUNTED_N", _COUNTED_N + 1)
    return x * 2


@pytest.mark.parametrize("f", [_bumps_through_cls, _bumps_through_type_of_self, _appends_through_a_bound_builtin,
                               _rebinds_through_globals, _rebinds_through_setattr],
                         ids=["cls.n += 1", "type(self).n += 1", "LOG.append bound", "globals()[N] += 1",
                              "setattr(module)"])
def test_writes_made_through_cls_a_bound_builtin_or_the_globals_dict_run_eagerly(f):
    """A write that outlives the call and that no assignment of the code's
    makes: the class a class method or type(self) reaches, the list a
    global bound method appends to, a global rebound through globals() or
    setattr on the module. Compiled calls skipped each (the state stayed at
    the traced call's, and the results with it), without a warning."""
    global _COUNTED_N

    def set_state(i):
        global _COUNTED_N
        _Counted.n, _COUNTED_N = i, i
        del _COUNTED_LOG[i:]

    try:
        messages = _same_as_eager(f, set_state, lambda: (_Counted.n, _COUNTED_N, len(_COUNTED_LOG)))
    finally:
        _Counted.n, _COUNTED_N = 0, 0
        _COUNTED_LOG.clear()
    assert len(messages) == 1 and "during the call" in messages[0], messages


def _bump_own_default(state=[0]):
    state[0] += 1
    return state[0]


class _Defaults:
    def bump(self, state=[0]):
        state[0] += 1
        return state[0]

    @staticmethod
    def bump_kw(*, state={"n": 0}):
        state["n"] += 1
        return state["n"]


def _through_a_default(x):
    return x * _bump_own_default()


def _through_a_methods_default(x):
    return x * _Defaults().bump()


def _through_a_static_methods_keyword_default(x):
    return x * _Defaults.bump_kw()


def _reads_a_default(x, table={"scale": 2.0}):
    return x * table["scale"]


def _through_a_default_it_only_reads(x):
    return _reads_a_default(x) + 1


_DEFAULTS = [_bump_own_default.__defaults__[0], _Defaults.bump.__defaults__[0]]


@pytest.mark.parametrize("f", [_through_a_default, _through_a_methods_default,
                               _through_a_static_methods_keyword_default],
                         ids=["function", "method", "static method keyword-only"])
def test_a_helper_that_writes_its_own_mutable_default_runs_eagerly(f):
    """def bump(state=[0]): state[0] += 1, a memo or counter that lives in
    the function's default: compiled calls skipped the write and answered
    with the traced count, without a warning."""
    def set_state(i):
        _DEFAULTS[0][0] = _DEFAULTS[1][0] = i
        _Defaults.bump_kw.__kwdefaults__["state"]["n"] = i

    def read_state():
        return _DEFAULTS[0][0], _DEFAULTS[1][0], _Defaults.bump_kw.__kwdefaults__["state"]["n"]

    messages = _same_as_eager(f, set_state, read_state)
    assert len(messages) == 1 and "writes the default of" in messages[0], messages


def test_a_helper_that_only_reads_its_default_compiles():
    assert _same_as_eager(_through_a_default_it_only_reads, lambda i: None, lambda: None) == []


_BAD_INPUT = ValueError("bad input")


def _raises_a_global_exception(x, bad=False):
    if bad:
        raise _BAD_INPUT
    return x.exp() * 2


def test_a_global_exception_raised_on_a_branch_the_call_did_not_take_compiles():
    """if bad: raise ERR, with ERR a module-level exception: its contents
    (args, a traceback) were taken for state jit cannot guard, and every
    call ran eagerly with a warning."""
    jf = torchneuron_jit.jit(_raises_a_global_exception)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            torch.testing.assert_close(jf(X), X.exp() * 2)
    assert [v["kind"] for v in torchneuron_jit.explain(jf).variants] == ["compiled"]
    with pytest.raises(ValueError) as info:
        jf(X, True)
    assert info.value is _BAD_INPUT


def test_a_global_that_holds_what_jit_cannot_guard_runs_eagerly():
    arr = np.array([2.0])
    scope = {"torch": torch, "ARR": arr}
    exec("def f(x):\n    return x * float(ARR[0])\n", scope)
    f = torchneuron_jit.jit(scope["f"])
    with pytest.warns(RuntimeWarning, match=r"runs eagerly: global ARR is a ndarray, whose contents jit cannot guard"):
        torch.testing.assert_close(f(X), X * 2.0)
    arr[0] = 3.0
    torch.testing.assert_close(f(X), X * 3.0)


class _Mode(enum.Enum):
    FAST = 1
    SLOW = 2


@pytest.mark.parametrize("values, body", [
    ((torch.float32, torch.float64), "x.to(V)"),
    ((torch.Size([4]), torch.Size([2, 2])), "x.reshape(V)"),
    ((slice(0, 2), slice(1, 4)), "x[V]"),
    ((1 + 0j, 3 + 0j), "x * V.real"),
    ((range(2), range(5)), "x * len(V)"),
    ((b"\x02", b"\x05"), "x * V[0]"),
    ((_Mode.FAST, _Mode.SLOW), "x.relu() if V is _Mode.FAST else x * 2"),
], ids=["dtype", "Size", "slice", "complex", "range", "bytes", "enum"])
def test_a_value_that_never_changes_in_place_is_guarded_in_a_global_and_a_closure(values, body):
    """A global or closure variable bound to a dtype, a Size, a slice, an
    enum member...: jit held none of them, and answered with the first
    value's graph after the program bound another."""
    scope = {"torch": torch, "_Mode": _Mode, "V": values[0]}
    exec(f"def g(x):\n    return {body}\n"
         f"def make(V):\n    def c(x):\n        return {body}\n    return c\n", scope)
    g = scope["g"]
    assert _same_as_eager(g, lambda i: scope.__setitem__("V", values[i % 2]), lambda: None) == []
    for v in values:
        c = scope["make"](v)
        torch.testing.assert_close(torchneuron_jit.jit(c)(X), c(X))
        torch.testing.assert_close(torchneuron_jit.jit(c)(X), c(X))
    c = scope["make"](values[0])
    jc = torchneuron_jit.jit(c)
    for i in range(4):
        c.__closure__[0].cell_contents = values[i % 2]
        torch.testing.assert_close(jc(X), eval(body, {"torch": torch, "_Mode": _Mode, "V": values[i % 2], "x": X}),
                                   msg=lambda m: f"closure call {i}: {m}")


class _Opts:
    pass


class _Configured(torch.nn.Module):
    """Settings a model keeps in plain attributes: a dict, a list in it,
    an object of the user's and a list of tensors."""

    def __init__(self):
        super().__init__()
        self.cfg = {"scale": 1.0, "layers": [1.0]}
        self.opts = _Opts()
        self.opts.shift = 0.5
        self.extra = [torch.ones(4)]

    def forward(self, x):
        return x * self.cfg["scale"] * len(self.cfg["layers"]) + self.opts.shift + self.extra[0]


@pytest.mark.parametrize("change", [
    lambda m, i: m.cfg.__setitem__("scale", float(i)),
    lambda m, i: m.cfg["layers"].append(1.0),
    lambda m, i: setattr(m.opts, "shift", float(i)),
    lambda m, i: m.extra.__setitem__(0, torch.full((4,), float(i))),
], ids=["dict item", "list in a dict", "object attribute", "tensor in a list"])
def test_what_a_modules_attributes_hold_is_guarded_by_content(change):
    """A module's attributes were guarded by identity only: a config dict
    changed in place answered with the first trace's value."""
    eager = _Configured()
    model = torchneuron_jit.jit(copy.deepcopy(eager))
    for i in range(4):
        torch.testing.assert_close(model(X), eager(X), msg=lambda m: f"call {i}: {m}")
        change(eager, i + 2)
        change(model, i + 2)


class _Slotted:
    __slots__ = ("k",)

    def __init__(self):
        self.k = 2.0


class _HoldsWhatJitCannotGuard(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.arr = np.array([2.0])
        self.slotted = _Slotted()
        self.deep = {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 2.0}}}}}}}}

    def forward(self, x):
        if self.kind == "numpy array":
            return x * float(self.arr[0])
        if self.kind == "__slots__ object":
            return x * self.slotted.k
        return x * self.deep["a"]["b"]["c"]["d"]["e"]["f"]["g"]["h"]


class _HoldsWhatJitCannotGuardAndReadsNone(_HoldsWhatJitCannotGuard):
    def forward(self, x):
        return x * 2.0


def _change_what_jit_cannot_guard(m):
    m.arr[0] = 5.0
    m.slotted.k = 5.0
    m.deep["a"]["b"]["c"]["d"]["e"]["f"]["g"]["h"] = 5.0


@pytest.mark.parametrize("kind", ["numpy array", "__slots__ object", "nested too deep", "reads none"])
def test_what_a_modules_attribute_holds_that_jit_cannot_guard_runs_eagerly_where_the_code_reads_it(kind):
    """Held by identity, a change in place went unseen: the compiled call
    kept the traced value. Where the code names the attribute or key that
    holds it, the variant runs eagerly with one warning naming it; a model
    that holds such values and reads none of them still compiles."""
    eager = (_HoldsWhatJitCannotGuardAndReadsNone if kind == "reads none" else _HoldsWhatJitCannotGuard)(kind)
    model = torchneuron_jit.jit(copy.deepcopy(eager))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            if i == 2:
                _change_what_jit_cannot_guard(eager)
                _change_what_jit_cannot_guard(model)
            torch.testing.assert_close(model(X), eager(X), msg=lambda m: f"call {i}: {m}")
    messages = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    if kind == "reads none":
        assert messages == [] and torchneuron_jit.stats()["graphs_compiled"] >= 1
    else:
        _one_warning(messages, "runs eagerly", "whose contents jit cannot guard")


class _Served(torch.nn.Module):
    """A model whose caller keeps its own bookkeeping on it: forward never
    reads calls, started or note."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = 2.0
        self.which = "calls"
        self.calls, self.started, self.note = 0, 0.0, "cold"
        self.history, self.seen = [], {"requests": 0, "by_size": {}}

    def forward(self, x):
        return self.lin(x).relu() * self.scale


class _ServedByName(_Served):
    def forward(self, x):
        return self.lin(x).relu() * getattr(self, self.which)


def test_attributes_the_call_never_reads_change_without_a_miss():
    """model.calls = i between calls was a miss on every call (a module's
    attributes were guarded whole), then a storm warning, and the model ran
    eagerly for good; so was model.history.append(...), a list the caller
    fills. An attribute no code of the call names is guarded to be there,
    whatever it holds, and what it holds is not guarded; the ones it names
    (scale) still miss, and so does a new attribute."""
    eager = _Served().eval()
    model = torchneuron_jit.jit(copy.deepcopy(eager))
    before = torchneuron_jit.stats()["traces"]
    with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(12):
            for m in (eager, model):
                m.calls, m.started, m.note = i, time.time(), f"request {i}"
                m.history.append(i)
                m.seen["requests"] += 1
                m.seen["by_size"][i] = [i]
            torch.testing.assert_close(model(X), eager(X))
        assert torchneuron_jit.stats()["traces"] - before == 1
        assert [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)] == []
        out, words = _miss(model, lambda: setattr(model, "scale", 3.0))
        eager.scale = 3.0
        torch.testing.assert_close(out, eager(X))
        assert "self.scale: 2.0 → 3.0" in words, words
        model.lin.tag = "new"
        torch.testing.assert_close(model(X), eager(X))
        assert torchneuron_jit.stats()["traces"] - before == 3
    assert max(v["hits"] for v in torchneuron_jit.explain(model).variants) >= 11


SERVED = _Served().eval()


def _through_a_global(x):
    return SERVED(x) + 1


def test_attributes_of_a_module_a_global_holds_that_the_call_never_reads_change_without_a_miss():
    """The same for a model a jitted function reads from a global (its
    guards are made after the trace): SERVED.calls = i was a miss per call
    and a storm warning ("global SERVED.calls changes on every call")."""
    jf = torchneuron_jit.jit(_through_a_global)
    before = torchneuron_jit.stats()["traces"]
    with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True, jit_trace_records=False), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(12):
            SERVED.calls = i
            torch.testing.assert_close(jf(X), SERVED(X) + 1)
        SERVED.scale = 4.0
        torch.testing.assert_close(jf(X), SERVED(X) + 1)
    assert [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)] == []
    assert torchneuron_jit.stats()["traces"] - before == 2


def test_a_dict_guard_value_of_any_passes_any_value_of_a_key_that_is_there():
    """_C.GUARD_ANY in a "dict" guard: the key must be there, whatever it
    holds; sized, the keys stay as they were, in order; the values beside
    it are compared as ever, also after a write that passed (its version
    tag)."""
    from torchneuron_jit import _C
    spec = [("arg", 0), ("dict", 0, ("calls", "scale"), (_C.GUARD_ANY, 2.0), True)]
    gs = _C.GuardSet(spec)
    d = {"calls": 0, "scale": 2.0}
    assert gs.check(d) == -1
    d["calls"] = object()
    assert gs.check(d) == -1
    d["scale"] = 3.0
    assert gs.check(d) == 1
    assert gs.check({"scale": 2.0, "calls": 1}) == 1  # another order
    assert gs.check({"calls": 1, "scale": 2.0, "new": 0}) == 1
    loose = _C.GuardSet([("arg", 0), ("dict", 0, ("calls",), (_C.GUARD_ANY,), False)])
    assert loose.check({"calls": None, "other": 1}) == -1 and loose.check({"other": 1}) == 1
    # a relaxed guard on what such an attribute holds: "nop", which loads no slot for another to read
    assert _C.GuardSet([("arg", 0), ("nop",), ("type", 0, dict)]).check({}) == -1
    with pytest.raises(ValueError, match="must name an earlier load"):
        _C.GuardSet([("arg", 0), ("nop",), ("type", 1, dict)])


def test_attributes_code_reads_by_a_name_held_as_data_stay_guarded():
    """getattr(self, self.which) names no attribute in the code: every
    attribute of the module stays guarded by value, and a change of the
    one it reads is a miss, not the traced call's value."""
    eager = _ServedByName().eval()
    model = torchneuron_jit.jit(copy.deepcopy(eager))
    with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True):
        for i in range(1, 5):
            eager.calls = model.calls = i
            torch.testing.assert_close(model(X), eager(X), msg=lambda m: f"call {i}: {m}")


_GETATTR = getattr


class _ReadsAnotherWay(torch.nn.Module):
    """forward reads self.gain_q, or what self.conf_q holds, in a way no
    name of its code spells out (names no code of torch's or ours holds)."""

    def __init__(self, how):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.how, self.gain_q = how, 2.0
        self.notes_q = {"gain_q": 2.0}
        self.conf_q = self.notes_q  # one dict under two names: the unread one came first
        if how == "a held attrgetter":  # held, it keeps every attribute of the module guarded
            self.getter = operator.attrgetter("gain_q")
        if how == "a held partial over getattr":
            self.read = functools.partial(_GETATTR, self, "".join(["gain", "_q"]))

    def forward(self, x):
        return self.lin(x) * _READS[self.how](self)


# each its own code: only the one a call runs counts
_READS = {
    "an alias of a dict": lambda m: m.conf_q["gain_q"],
    "a format string": lambda m: float("{0.gain_q}".format(m)),
    "getattr under another name": lambda m: _GETATTR(m, "".join(["gain", "_q"])),
    "inspect.getmembers": lambda m: dict(inspect.getmembers(m))["".join(["gain", "_q"])],
    "a held attrgetter": lambda m: m.getter(m),
    "a held partial over getattr": lambda m: m.read(),
    "getattr called from C": lambda m: functools.reduce(_GETATTR, ["".join(["gain", "_q"])], m),
    "a class pattern": lambda m: _match_gain(m),
    "a thread": lambda m: _on_a_thread(m),
}


def _match_gain(m):
    match m:
        case _ReadsAnotherWay(gain_q=k):
            return k


def _on_a_thread(m):
    out = []
    worker = threading.Thread(target=lambda: out.append(m.gain_q))
    worker.start()
    worker.join()
    return out[0]


@pytest.mark.parametrize("how", list(_READS))
def test_attributes_read_in_ways_no_name_spells_stay_guarded(how):
    """What relaxing the attributes no code names must not reach: a dict
    two attributes hold (its guards were the unread one's), a format
    string's field, getattr called under another name, inspect's view of
    every attribute, an attrgetter held by the module. Each answered with
    the traced call's value after the change (found by a helper's probes)."""
    eager = _ReadsAnotherWay(how).eval()
    model = torchneuron_jit.jit(copy.deepcopy(eager))
    with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True):
        for i in range(4):
            if i == 2:
                for m in (eager, model):
                    if how == "an alias of a dict":
                        m.conf_q["gain_q"] = 3.0
                    else:
                        m.gain_q = 3.0
            torch.testing.assert_close(model(X), eager(X), msg=lambda m: f"call {i}: {m}")


def test_attributes_of_a_librarys_modules_stay_guarded():
    """transformers' code reads its modules' attributes by names it builds:
    Gemma3's rotary embedding, getattr(self, f"{layer_type}_attention_scaling").
    A changed scaling answered with the traced one (a helper's probe): the
    attributes of modules of an installed distribution's classes are not
    relaxed."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], pad_token_id=0, bos_token_id=2, eos_token_id=1)
    eager = transformers.Gemma3ForCausalLM(config).eval()
    model = torchneuron_jit.jit(copy.deepcopy(eager))
    ids = torch.randint(3, 100, (1, 6))
    with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True):
        for i in range(4):
            if i == 2:
                for m in (model, eager):
                    m.model.rotary_emb.full_attention_attention_scaling = 2.0
            torch.testing.assert_close(model(ids, use_cache=False).logits, eager(ids, use_cache=False).logits,
                                       rtol=1e-4, atol=1e-4, msg=lambda m: f"call {i}: {m}")


def test_a_record_of_a_module_serves_another_value_of_an_attribute_no_code_reads():
    """Trace records key a module's attributes by name: another instance
    (a new process) whose counter holds another value loads the record and
    traces nothing."""
    a, b = _Served().eval(), _Served().eval()
    a.calls, b.calls = 3, 7
    b.history.extend([1, 2, 3])
    want = b(X)
    with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True):
        before = torchneuron_jit.stats()
        torchneuron_jit.jit(a)(X)
        jb = torchneuron_jit.jit(b)
        torch.testing.assert_close(jb(X), want)
        after = torchneuron_jit.stats()
    assert after["traces"] - before["traces"] == 1 and after["traces_loaded"] - before["traces_loaded"] == 1


def test_globals_read_by_name_at_run_time_are_guarded(monkeypatch):
    """getattr(settings, "SCALE"), globals()["SCALE"] and
    sys.modules[__name__].SCALE read no LOAD_GLOBAL name: the first
    value's graph answered after the program set another."""
    settings = types.ModuleType("tn_settings_by_name")
    settings.SCALE = 1.0
    monkeypatch.setitem(sys.modules, settings.__name__, settings)
    scope = {"torch": torch, "settings": settings, "sys": sys, "SCALE": 1.0, "__name__": "tn_scope_by_name"}
    exec("def by_getattr(x):\n    return x * getattr(settings, 'SCALE')\n"
         "def by_globals(x):\n    return x * globals()['SCALE']\n", scope)
    for name in ("by_getattr", "by_globals"):
        f = scope[name]

        def set_state(i):
            settings.SCALE = scope["SCALE"] = float(i + 1)

        assert _same_as_eager(f, set_state, lambda: None) == [], name


_BY_HELD_NAME = (
    "KEYS = ['SCALE']\n"
    "NAME = 'SCALE'\n"
    "def by_globals_name(x):\n    return x * globals()[NAME]\n"
    "def by_keys(x):\n"
    "    for k in KEYS:\n"
    "        x = x * getattr(settings, k)\n"
    "    return x\n"
    "def by_argument(x, key='SCALE'):\n    return x * getattr(settings, key)\n"
    "def read(key):\n    return vars(settings)[key]\n"
    "def by_helper(x):\n"
    "    for k in KEYS:\n"
    "        x = x * read(k)\n"
    "    return x\n")


@pytest.mark.parametrize("name", ["by_globals_name", "by_keys", "by_argument", "by_helper"])
def test_globals_read_by_a_name_held_as_data_are_guarded(monkeypatch, name):
    """globals()[NAME], getattr(settings, k) for k in KEYS, getattr(settings,
    key) with key an argument, vars(settings)[k] in a helper: the name is no
    constant of the code, and the first value's graph kept answering after
    the program set another (found by a helper's probe). The names the
    arguments, globals and closure variables of such code hold are guarded
    as the code's string constants are."""
    settings = types.ModuleType("tn_settings_held_name")
    settings.SCALE = 1.0
    monkeypatch.setitem(sys.modules, settings.__name__, settings)
    scope = {"torch": torch, "settings": settings, "SCALE": 1.0, "__name__": "tn_scope_held_name"}
    exec(_BY_HELD_NAME, scope)

    def set_state(i):
        settings.SCALE = scope["SCALE"] = float(i + 1)

    assert _same_as_eager(scope[name], set_state, lambda: None) == []


_PATCHED_F = torch.nn.functional


def _reads_library_functions(x):
    return _PATCHED_F.gelu(x) + torch.tanh(x) + torch.nn.functional.relu(x)


@pytest.mark.parametrize("patch", ["F.gelu", "torch.tanh", "torch.nn.functional.relu"])
def test_a_librarys_function_the_code_calls_replaced_after_the_trace(monkeypatch, patch):
    """F.gelu = quick_gelu, torch.tanh = torch.sigmoid: user code that calls
    F.gelu calls the new one, and the compiled call kept the traced one
    (library modules went unguarded). The functions the code names in a
    library's module are guarded by identity; back to the original, the
    first variant answers again."""
    module, attr = {"F.gelu": (torch.nn.functional, "gelu"), "torch.tanh": (torch, "tanh"),
                    "torch.nn.functional.relu": (torch.nn.functional, "relu")}[patch]
    original = getattr(module, attr)
    replacement = {"gelu": lambda t, approximate="none": t * torch.sigmoid(1.702 * t), "tanh": torch.sigmoid,
                   "relu": lambda t, inplace=False: t * 0 - 1}[attr]

    def set_state(i):
        setattr(module, attr, replacement if i in (2, 3) else original)

    try:
        assert _same_as_eager(_reads_library_functions, set_state, lambda: None, calls=6) == []
    finally:
        setattr(module, attr, original)


def _reads_a_library_number(x):
    return x * math.pi + x.softmax(-1) * abs(-2)


@pytest.mark.parametrize("patch", ["math.pi", "builtins.abs", "torch.Tensor.softmax"])
def test_a_librarys_number_a_builtin_or_a_tensor_method_replaced_after_the_trace(patch):
    """math.pi = 3.0, builtins.abs = ..., torch.Tensor.softmax = ...:
    user code reading them reads the new one, and the compiled call kept
    the traced value (a helper's repros r01 and r06: only a library
    module's functions were guarded, a builtin was guarded to stay
    unshadowed by a global, and a tensor's methods not at all). Back to
    the original, the first variant answers again."""
    owner, attr = {"math.pi": (math, "pi"), "builtins.abs": (builtins, "abs"),
                   "torch.Tensor.softmax": (torch.Tensor, "softmax")}[patch]
    had = attr in vars(owner)
    original = getattr(owner, attr)
    replacement = {"pi": 3.0, "abs": lambda v: 7, "softmax": lambda self, dim: self * 2}[attr]

    def set_state(i):
        if i in (2, 3):
            setattr(owner, attr, replacement)
        elif had:
            setattr(owner, attr, original)
        elif attr in vars(owner):
            delattr(owner, attr)

    try:
        assert _same_as_eager(_reads_a_library_number, set_state, lambda: None, calls=6) == []
    finally:
        set_state(0)
        assert getattr(owner, attr) is original


def _scaled(x):
    return x * _scaled.factor


@pytest.mark.parametrize("change", ["set", "deleted and set again"])
def test_a_functions_attribute_it_reads_is_guarded(change):
    """h.factor = 4.0 after the trace, read by h itself (x * h.factor), or a
    decorator's wrapper.scale: the compiled call kept the traced value
    (a helper's repro). A function the call ran is guarded by its
    attributes too."""
    _scaled.factor = 2.0

    def set_state(i):
        if change == "deleted and set again" and i == 2:
            del _scaled.factor
        _scaled.factor = 2.0 if i < 2 else 4.0 + i

    assert _same_as_eager(_scaled, set_state, lambda: None, calls=5) == []


STORE_UD = collections.UserDict(k=2.0)
STORE_UL = collections.UserList([2.0])
STORE_CM = collections.ChainMap({"k": 2.0})


@pytest.mark.parametrize("kind", ["UserDict", "UserList", "ChainMap"])
def test_the_standard_librarys_containers_are_guarded_by_their_items(kind):
    """A global UserDict, UserList or ChainMap changed in place after the
    trace: the compiled call kept the traced value (their items are in
    their __dict__, which jit held by identity as a library object's; a
    helper's repros). They are followed as the user's objects are."""
    read = {"UserDict": lambda: STORE_UD["k"], "UserList": lambda: STORE_UL[0],
            "ChainMap": lambda: STORE_CM["k"]}[kind]

    def f(x):
        return x * read()

    def set_state(i):
        value = 2.0 if i < 2 else 3.0 + i
        if kind == "UserDict":
            STORE_UD["k"] = value
        elif kind == "UserList":
            STORE_UL[0] = value
        else:
            STORE_CM.maps[0]["k"] = value

    assert _same_as_eager(f, set_state, lambda: None, calls=5) == []


class _Settings:
    pass


class _HoldsOpaque(torch.nn.Module):
    def __init__(self, kind, cfg):
        super().__init__()
        self.kind = kind
        self.held = array.array("d", [2.0]) if kind == "array" else weakref.ref(cfg)

    def forward(self, x):
        return x * (self.held[0] if self.kind == "array" else self.held().scale)


@pytest.mark.parametrize("kind", ["array", "weakref"])
def test_a_module_attribute_no_guard_can_follow_runs_eagerly_with_one_warning(kind):
    """self.coef = array.array(...) changed in place, self.cfg =
    weakref.ref(cfg) whose cfg.scale changes: the compiled call kept the
    traced value (a helper's repros). Named by the forward, such an
    attribute makes the call run eagerly, with one warning saying why."""
    cfg = _Settings()
    cfg.scale = 2.0
    m = _HoldsOpaque(kind, cfg)
    ref = _HoldsOpaque(kind, cfg)
    torchneuron_jit.jit(m)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for i in range(4):
            if i == 2:
                if kind == "array":
                    m.held[0] = ref.held[0] = 5.0
                else:
                    cfg.scale = 5.0
            torch.testing.assert_close(m(X), ref(X), msg=lambda msg: f"call {i}: {msg}")
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    _one_warning(ours, "runs eagerly", "self.held is a " + ("array" if kind == "array" else "weak reference"))


ACT = None


def _reads_a_partial(x):
    return ACT(x) * 2


def _scale_then_relu(scale, x):
    return torch.relu(x * scale)


@pytest.mark.parametrize("change", ["keywords in place", "another partial", "its function", "its arguments"])
def test_a_partial_global_compiles_and_what_it_holds_is_guarded(change):
    """act = functools.partial(F.leaky_relu, negative_slope=0.2): the
    function ran eagerly ("global act is a partial, whose contents jit
    cannot guard"; found by a helper's probe). Its function, arguments and
    keywords are guarded; the calls compile."""
    global ACT
    first = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.2)
    second = {"keywords in place": first, "another partial": functools.partial(torch.nn.functional.leaky_relu,
                                                                               negative_slope=0.7),
              "its function": functools.partial(torch.nn.functional.elu, alpha=0.2),
              "its arguments": functools.partial(_scale_then_relu, 3.0)}[change]
    if change == "its arguments":
        first = functools.partial(_scale_then_relu, 1.0)

    def set_state(i):
        global ACT
        if change == "keywords in place":
            ACT = first
            first.keywords["negative_slope"] = 0.2 if i < 2 else 0.9
        else:
            ACT = first if i < 2 else second

    compiled = torchneuron_jit.stats()["graphs_compiled"]
    try:
        assert _same_as_eager(_reads_a_partial, set_state, lambda: None) == []
    finally:
        ACT = None
    assert torchneuron_jit.stats()["graphs_compiled"] > compiled


NP_VALUE = None


def _reads_a_numpy_scalar(x, arg=None):
    v = NP_VALUE if arg is None else arg
    return x * float(v) + x.sum() if v.dtype.kind == "b" else x * v


@pytest.mark.parametrize("kind", ["float64", "float32", "int64", "bool"])
@pytest.mark.parametrize("where", ["global", "argument"])
def test_a_numpy_scalar_compiles_and_is_guarded_by_its_value(kind, where):
    """scale = 1 / np.sqrt(d) is an np.float64: the function ran eagerly
    ("global scale is a float64, whose contents jit cannot guard"; found by
    a helper's probe). numpy's scalars are guarded by type and value, as
    floats are (-0.0 and 0.0 apart); the calls compile."""
    import numpy as np
    global NP_VALUE
    values = {"float64": [0.125, 0.125, -0.0, 0.0, 2.5], "float32": [0.5, 0.5, 1.5, 1.5, -2.0],
              "int64": [2, 2, 3, 3, 5], "bool": [True, True, False, False, True]}[kind]
    make = getattr(np, kind if kind != "bool" else "bool_")
    jf = torchneuron_jit.jit(_reads_a_numpy_scalar)
    compiled = torchneuron_jit.stats()["graphs_compiled"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i, value in enumerate(values):
                x = torch.randn(4) - 0.5
                NP_VALUE = make(value)  # a new object each call, as a notebook's cell makes
                args = (x,) if where == "global" else (x, make(value))
                torch.testing.assert_close(jf(*args), _reads_a_numpy_scalar(*args), msg=lambda m: f"call {i}: {m}")
    finally:
        NP_VALUE = None
    assert [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)] == []
    assert torchneuron_jit.stats()["graphs_compiled"] > compiled


HPARAMS = collections.namedtuple("HPARAMS", "scale shift")


def _reads_a_namedtuple(x):
    return x * HP.scale + HP.shift


HP = None


def test_a_namedtuple_global_compiles_and_is_guarded():
    """HP = Hparams(2.0, 1.0) read as HP.scale: the function ran eagerly
    ("global HP is a Hparams, whose contents jit cannot guard"; found by a
    helper's notebook probe), where a plain tuple compiled. A namedtuple is
    guarded as a tuple is."""
    global HP

    def set_state(i):
        global HP
        HP = HPARAMS(*[(2.0, 1.0), (2.0, 1.0), (3.0, 1.0), (3.0, -1.0)][i])

    compiled = torchneuron_jit.stats()["graphs_compiled"]
    try:
        assert _same_as_eager(_reads_a_namedtuple, set_state, lambda: None) == []
    finally:
        HP = None
    assert torchneuron_jit.stats()["graphs_compiled"] > compiled


def test_a_global_named_like_an_attribute_or_key_of_the_result_is_no_read():
    """A training loop's loss = out.loss.item() (a dataclass field named
    loss) or logits = ... (a result's {"logits": y}) at module level: jit
    took the attribute names and strings of the code for globals it may read
    by name, guarded the global loss by value, and traced again on every
    call until its limit, then ran eagerly, saying the function reads it.
    A code that reads no global by name reads none of them."""
    scope = {"torch": torch, "dataclasses": __import__("dataclasses"), "loss": 0.0, "logits": 0.0,
             "__name__": "tn_scope_named_like"}
    exec("@dataclasses.dataclass\n"
         "class StepOut:\n"
         "    loss: torch.Tensor\n"
         "def step(x):\n"
         "    return StepOut((x * 2).square().mean())\n"
         "def head(x):\n"
         "    return {'logits': x * 3}\n", scope)
    step, head = torchneuron_jit.jit(scope["step"]), torchneuron_jit.jit(scope["head"])
    before = torchneuron_jit.stats()["traces"]
    with torchneuron_jit.config.patch(compile_blocking=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            x = torch.randn(4)
            scope["loss"] = step(x).loss.item()
            torch.testing.assert_close(scope["loss"], (x * 2).square().mean().item())
            scope["logits"] = float(head(x)["logits"].sum())
    assert torchneuron_jit.stats()["traces"] - before == 2
    assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]


REBOUND_W = torch.ones(4)
REBOUND_B = torch.zeros(3)
ALIAS_A = torch.ones(4)
ALIAS_B = ALIAS_A
ALIAS_LIN = torch.nn.Linear(4, 4)
ALIAS_W = ALIAS_LIN.weight


def _reads_rebound(x):
    return x * REBOUND_W + REBOUND_B.shape[0]


def _reads_aliases(x):
    return x * ALIAS_A + ALIAS_B + ALIAS_LIN(x) + ALIAS_W.sum(1)


def test_a_global_tensor_rebound_on_every_call_is_a_storm_in_words():
    """W = W - lr * g at module level binds the global to a new tensor of
    the same dtype and sizes on each call: each miss read "a tensor (4,)
    float32 → a tensor (4,) float32", one change to the storm detector,
    which never warned. Which tensor is in the words now. A global tensor
    read only for its sizes was not guarded at all."""
    global REBOUND_W, REBOUND_B
    jf = torchneuron_jit.jit(_reads_rebound)
    try:
        with torchneuron_jit.config.patch(compile_blocking=True), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(6):
                REBOUND_W = REBOUND_W - 0.1
                x = torch.randn(4)
                torch.testing.assert_close(jf(x), _reads_rebound(x))
            REBOUND_B = torch.zeros(5)  # its sizes are what the code reads
            torch.testing.assert_close(jf(x), _reads_rebound(x))
    finally:
        REBOUND_W, REBOUND_B = torch.ones(4), torch.zeros(3)
    words = [str(w.message) for w in caught if "global REBOUND_W changes" in str(w.message)]
    assert len(words) == 1 and "pass it as an argument" in words[0], words


def test_a_tensor_two_globals_or_a_global_and_a_module_hold_is_one_while_they_are_one():
    """B = A, or W = lin.weight: the graph reads one input for both. A
    trace record made so was taken in a process where they were two, and
    its graph read A for B; rebinding one of them in the process is a
    miss."""
    global ALIAS_A, ALIAS_W
    jf = torchneuron_jit.jit(_reads_aliases)
    spec = None
    try:
        with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True):
            for _ in range(2):
                x = torch.randn(4)
                torch.testing.assert_close(jf(x), _reads_aliases(x))
            spec = next(spec for spec, _ in jf.entries())
            assert sum(inst[0] == "same" for inst in spec) >= 2, spec
            ALIAS_A, ALIAS_W = torch.full((4,), 2.0), torch.zeros(4, 4)
            torch.testing.assert_close(jf(x), _reads_aliases(x))
    finally:
        ALIAS_A, ALIAS_W = ALIAS_B, ALIAS_LIN.weight


class _Meta(type):
    scale = 1.0


class _Registry(metaclass=_Meta):
    pass


def _reads_metaclass_attribute(x):
    return x * _Registry.scale


def test_an_attribute_a_class_finds_on_its_metaclass_is_guarded():
    """_Registry.scale lives on the metaclass: only the class and its bases
    were guarded, and the first value answered."""
    try:
        assert _same_as_eager(_reads_metaclass_attribute, lambda i: setattr(_Meta, "scale", float(i + 1)),
                              lambda: None) == []
    finally:
        _Meta.scale = 1.0


ORDERED = {"a": 1.0, "b": 2.0}


def _first_of_global_dict(x):
    return x * list(ORDERED.values())[0]


def _scaler():
    s = 1.0

    def scale(x):
        return x * s

    def set_s(v):
        nonlocal s
        s = v

    return scale, set_s


SCALE_BY, SET_SCALE = _scaler()


def _slope(x, slope=1.0, *, shift=0.0):
    return x * slope + shift


def _plus(x):
    return x + 1


_CODES = (_plus.__code__, (lambda x: x - 5).__code__)


def _set_cell(i):
    SET_SCALE(float(i))


def _set_defaults(i):
    _slope.__defaults__ = (float(i),)


def _set_kwdefaults(i):
    _slope.__kwdefaults__ = {"shift": float(i)}


def _set_code(i):
    _plus.__code__ = _CODES[i % 2]


@pytest.mark.parametrize("f,change", [
    (lambda x: SCALE_BY(x) + 1, _set_cell),
    (lambda x: _slope(x), _set_defaults),
    (lambda x: _slope(x, 2.0), _set_kwdefaults),
    (lambda x: _plus(x) * 2, _set_code),
], ids=["closure cell", "defaults", "kwdefaults", "code"])
def test_a_helper_changed_in_place_is_a_miss(f, change):
    """A helper the traced code calls, held by a global: the snapshot of
    the globals held it by identity, so a factory's nonlocal set through a
    setter, new defaults or a new __code__ replayed the first trace.
    Now what it holds is guarded too (guard_function)."""
    try:
        _same_as_eager(f, change, lambda: None)
    finally:
        _set_cell(1), _set_defaults(1), _set_kwdefaults(0), _set_code(0)


def test_a_dicts_key_order_is_guarded():
    """Code that iterates a dict sees its order: a dict argument and a
    global dict with the same keys in another order took the first
    order's variant."""
    def cat_values(d):
        return torch.cat(list(d.values()))

    jf = torchneuron_jit.jit(cat_values)
    for i in range(4):
        d = {"a": torch.ones(1), "b": torch.zeros(2)} if i % 2 == 0 else {"b": torch.zeros(2), "a": torch.ones(1)}
        torch.testing.assert_close(jf(d), cat_values(d), msg=lambda m: f"call {i}: {m}")
    jg = torchneuron_jit.jit(_first_of_global_dict)
    try:
        for i in range(4):
            globals()["ORDERED"] = {"a": 1.0, "b": 2.0} if i % 2 == 0 else {"b": 2.0, "a": 1.0}
            torch.testing.assert_close(jg(X), _first_of_global_dict(X), msg=lambda m: f"call {i}: {m}")
            ORDERED.pop("a")  # reordered in place: the same dict object
            ORDERED["a"] = 1.0
            torch.testing.assert_close(jg(X), _first_of_global_dict(X), msg=lambda m: f"call {i} in place: {m}")
    finally:
        globals()["ORDERED"] = {"a": 1.0, "b": 2.0}


Z = 0.0


def _divides_by_global_z(x):
    return x / Z


def test_minus_zero_is_not_zero_to_a_guard():
    """0.0 == -0.0, but x / z is inf and -inf: a float argument and a
    global took the variant of the other sign."""
    def divide(x, z):
        return x / z

    jf = torchneuron_jit.jit(divide)
    for z in (0.0, -0.0, 0.0, -0.0, float("nan"), float("nan")):
        torch.testing.assert_close(jf(X, z), divide(X, z), equal_nan=True, msg=lambda m: f"z={z}: {m}")
    jg = torchneuron_jit.jit(_divides_by_global_z)
    try:
        for i, z in enumerate((0.0, -0.0, 0.0, -0.0)):
            globals()["Z"] = z
            torch.testing.assert_close(jg(X), X / z, msg=lambda m: f"call {i}, Z={z}: {m}")
    finally:
        globals()["Z"] = 0.0


def test_the_words_name_a_decorated_function_by_the_function_it_wraps():
    """A decorator's wrapper (functools.wraps, as Hugging Face wraps its
    models' forward) is named by what it wraps, not "deco.<locals>.wrapper"."""
    import functools

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            return fn(*args)
        return wrapper

    scope = {"torch": torch, "ARR": np.array([2.0])}
    exec("def scaled(x):\n    return x * float(ARR[0])\n", scope)
    f = torchneuron_jit.jit(deco(scope["scaled"]))
    with pytest.warns(RuntimeWarning, match=r"jit: scaled \(<string>:1\) runs eagerly") as record:
        torch.testing.assert_close(f(X), X * 2.0)
    assert not any("wrapper" in str(w.message) for w in record)


# -- writes ---------------------------------------------------------------------------

def test_a_counter_in_a_closure_list_runs_eagerly_with_a_warning():
    steps = [0]

    def f(x):
        steps[0] += 1
        return x * steps[0]

    def set_state(i):
        steps[0] = i

    _one_warning(_same_as_eager(f, set_state, lambda: list(steps)),
                 "runs eagerly: it writes closure variable steps[0] (an int)", "test_jit_state.py", ": an item set")


LOG = []


def _appends(x):
    LOG.append(1)
    return x * len(LOG)


def test_appending_to_a_global_list_runs_eagerly_with_a_warning():
    def set_state(i):
        LOG[:] = [0] * i

    _one_warning(_same_as_eager(_appends, set_state, lambda: len(LOG)),
                 "it writes global LOG (its length)", ".append()")


def _sets_attribute(x):
    SETTINGS.s = SETTINGS.s + 1
    return x * SETTINGS.s


def test_setting_an_attribute_of_a_global_object_runs_eagerly_with_a_warning():
    def set_state(i):
        SETTINGS.s = float(i)

    _one_warning(_same_as_eager(_sets_attribute, set_state, lambda: SETTINGS.s),
                 "it writes global SETTINGS.s (a float)", "an attribute set")
    SETTINGS.s = 2.0


class _Stats:
    calls = 0
    seen = []


def _counts_on_its_class(x):
    _Stats.calls += 1
    return x * _Stats.calls


def _appends_to_a_class_list(x):
    _Stats.seen.append(x.shape[0])
    return x * 2


@pytest.mark.parametrize("f, words", [(_counts_on_its_class, "it writes _Stats.calls"),
                                      (_appends_to_a_class_list, "it writes _Stats.seen")])
def test_writing_a_class_attribute_of_a_users_class_runs_eagerly_with_a_warning(f, words):
    """_Stats.calls += 1 through a global class: compiled calls skipped the
    write, with no warning, and answered the traced count."""
    def set_state(i):
        _Stats.calls = i
        _Stats.seen = list(range(i))

    _one_warning(_same_as_eager(f, set_state, lambda: (_Stats.calls, list(_Stats.seen))), words)


STEP = 0


def _global_counter(x):
    global STEP
    STEP += 1
    return x * STEP


def test_assigning_a_global_runs_eagerly_with_a_warning():
    def set_state(i):
        global STEP
        STEP = i

    _one_warning(_same_as_eager(_global_counter, set_state, lambda: STEP),
                 "it assigns global STEP at", "test_jit_state.py:")


def test_assigning_a_nonlocal_runs_eagerly_with_a_warning():
    n = 0

    def f(x):
        nonlocal n
        n += 1
        return x * n

    def set_state(i):
        nonlocal n
        n = i

    _one_warning(_same_as_eager(f, set_state, lambda: n), "it assigns closure variable n at")


def test_a_module_writing_its_own_attribute_runs_eagerly_with_a_warning():
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * self.calls

    m = Counting()
    jm = torchneuron_jit.jit(Counting())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            torch.testing.assert_close(jm(X), m(X))
    assert jm.calls == m.calls == 4
    # one warning and two traces: the first eager entry guards what the call read (a write made once lets
    # the next call compile), the second, made when the next trace writes the same, does not
    _one_warning([str(w.message) for w in caught], "Counting.forward", "runs eagerly: it writes argument self.calls "
                 "(an int)", "test_jit_state.py")
    assert torchneuron_jit.stats()["traces"] == 2


def test_writing_into_an_argument_dict_runs_eagerly_with_a_warning():
    def f(x, d):
        d["n"] = d.get("n", 0) + 1
        return x * d["n"]

    jf = torchneuron_jit.jit(f)
    with pytest.warns(RuntimeWarning, match=r"it writes argument d\['n'\] \(set\)"):
        for _ in range(3):
            a, b = {}, {}
            torch.testing.assert_close(jf(X, a), f(X, b))
            assert a == b


def test_state_made_by_the_call_itself_is_no_write():
    """Locals, and the **kwargs dict the call gets, are the call's own."""
    def f(x, **kw):
        acc = []
        acc.append(x * 2)
        kw["extra"] = 1.0
        return acc[0] + kw["extra"] + kw["bias"]

    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            torch.testing.assert_close(jf(X, bias=0.5), f(X, bias=0.5))
    assert torchneuron_jit.stats()["traces"] == 1 and torchneuron_jit.stats()["graphs_compiled"] == 1


# -- values from outside torch ----------------------------------------------------------

def _random_scale(x):
    return x * random.random()


def _time_scale(x):
    return x * (time.time() % 7)


def _env_scale(x):
    return x * float(os.environ["TN_TEST_SCALE"])


def _numpy_scale(x):
    return x * float(np.random.rand())


def _randint_scale(x):
    return x * random.randint(1, 100)


@pytest.mark.parametrize("f, words", [(_random_scale, "random.Random.random()"), (_time_scale, "time.time()"),
                                      (_env_scale, "os.environ"), (_numpy_scale, "numpy.random"),
                                      (_randint_scale, "random.Random.randint()")])
def test_values_from_outside_torch_run_eagerly_with_a_warning(f, words, monkeypatch):
    def set_state(i):
        random.seed(i)
        np.random.seed(i)
        monkeypatch.setenv("TN_TEST_SCALE", str(i + 2))

    if f is _time_scale:
        jf = torchneuron_jit.jit(f)
        with pytest.warns(RuntimeWarning, match=r"it calls time.time\(\) at .*test_jit_state.py:\d+"):
            jf(X)
        assert torchneuron_jit.stats()["graphs_compiled"] == 0
        return
    _one_warning(_same_as_eager(f, set_state, lambda: None), f"it calls {words} at", "test_jit_state.py:")
    assert torchneuron_jit.stats()["graphs_compiled"] == 0


FILE_LOG = io.StringIO()


def _warns(x):
    warnings.warn("scaling by two")
    return x * 2


def _logs_to_a_file(x):
    FILE_LOG.write("called\n")
    return x * 2


@pytest.mark.parametrize("f, words, read_state", [
    (_warns, "it calls warnings.warn at", lambda: None),
    (_logs_to_a_file, "it calls a write to a file at", lambda: FILE_LOG.getvalue().count("called")),
])
def test_warnings_and_writes_to_files_run_eagerly_with_a_warning(f, words, read_state):
    """warnings.warn and FILE_LOG.write ran only on the traced call, without a
    word: a user's log lost its lines, and under simplefilter("error")
    eager raised where compiled calls returned."""
    def set_state(i):
        FILE_LOG.seek(0)
        FILE_LOG.truncate()

    _one_warning(_same_as_eager(f, set_state, read_state), words, "test_jit_state.py:")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="scaling by two"):
            torchneuron_jit.jit(_warns)(X)


def test_torch_random_ops_still_compile_and_draw_fresh_numbers():
    def f(x):
        return x * torch.rand(4)

    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outs = [jf(X) for _ in range(3)]
    assert not torch.equal(outs[1], outs[2])
    torch.manual_seed(3)
    got = jf(X)
    torch.manual_seed(3)
    torch.testing.assert_close(got, f(X))


def _seeds_then_draws(x):
    torch.manual_seed(123)
    return x + torch.rand(4)


def _turns_grad_off(x):
    torch.set_grad_enabled(False)
    return x * 2


@pytest.mark.parametrize("f, words", [
    (_seeds_then_draws, "it calls torch.manual_seed at "),
    (_turns_grad_off, "it sets torch's grad mode (True → False) during the call"),
])
def test_torch_state_the_call_sets_runs_eagerly_with_a_warning(f, words):
    """A seed set inside the function, or grad mode switched off and left
    so: compiled calls skipped both (their random ops drew from the
    caller's generator; grad mode stayed on after the call)."""
    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for i in range(3):
                torch.set_grad_enabled(True)
                torch.manual_seed(i)
                got = jf(X)
                got_grad = torch.is_grad_enabled()
                torch.set_grad_enabled(True)
                torch.manual_seed(i)
                torch.testing.assert_close(got, f(X), msg=lambda m: f"call {i}: {m}")
                assert got_grad == torch.is_grad_enabled(), f"call {i}: grad mode {got_grad} after jit"
        finally:
            torch.set_grad_enabled(True)
    _one_warning([str(w.message) for w in caught if "torchneuron_jit" in str(w.message)], words)


def _threads_scale(x):
    return x * torch.get_num_threads()


def _deterministic_scale(x):
    return x * (2 if torch.are_deterministic_algorithms_enabled() else 3)


def _seed_scale(x):
    return x * (torch.initial_seed() % 5)


def _anomaly_scale(x):
    return x * (2 if torch.is_anomaly_enabled() else 3)


def _precision_scale(x):
    return x * len(torch.get_float32_matmul_precision())


def _mkldnn_scale(x):
    return x * (2 if torch.backends.mkldnn.enabled else 3)


def _fastpath_scale(x):
    return x * (2 if torch.backends.mha.get_fastpath_enabled() else 3)


def _autocast_dtype_scale(x):  # read with autocast off, where only a read guards it
    return x * (2 if torch.get_autocast_dtype("cpu") == torch.bfloat16 else 3)


@pytest.mark.parametrize("f, set_state, words", [
    (_threads_scale, lambda i: torch.set_num_threads(1 + i % 2), "torch.get_num_threads()"),
    (_deterministic_scale, lambda i: torch.use_deterministic_algorithms(bool(i % 2)),
     "torch.are_deterministic_algorithms_enabled()"),
    (_seed_scale, lambda i: torch.manual_seed(1000 + i), "torch.initial_seed()"),  # ints no cache holds
    (_anomaly_scale, lambda i: torch.autograd.set_detect_anomaly(bool(i % 2)), "torch.is_anomaly_enabled()"),
    (_precision_scale, lambda i: torch.set_float32_matmul_precision("high" if i % 2 else "highest"),
     "torch.get_float32_matmul_precision()"),
    (_mkldnn_scale, lambda i: torch._C._set_mkldnn_enabled(not i % 2), "torch.backends.mkldnn.enabled"),
    (_fastpath_scale, lambda i: torch.backends.mha.set_fastpath_enabled(not i % 2),
     "torch.backends.mha.get_fastpath_enabled()"),
    (_autocast_dtype_scale, lambda i: torch.set_autocast_dtype("cpu", (torch.float16, torch.bfloat16)[i % 2]),
     "CPU autocast dtype"),
], ids=["threads", "deterministic", "seed", "anomaly", "matmul precision", "mkldnn", "mha fast path",
        "autocast dtype"])
def test_torch_state_read_through_torchs_functions_is_guarded(f, set_state, words):
    """A trace that called torch.get_num_threads() (or another reader of
    torch's process state) kept its value: a compiled call answered it
    after the state changed. Each is a guard, in the call's words."""
    threads = torch.get_num_threads()
    try:
        assert _same_as_eager(f, set_state, lambda: None) == []
        jf = torchneuron_jit.jit(f)
        set_state(0)
        jf(X)
        assert f"guard {words}: " in str(torchneuron_jit.explain(jf)), torchneuron_jit.explain(jf)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)
        torch.autograd.set_detect_anomaly(False)
        torch.set_float32_matmul_precision("highest")
        torch._C._set_mkldnn_enabled(True)
        torch.backends.mha.set_fastpath_enabled(True)
        torch.set_autocast_dtype("cpu", torch.bfloat16)


def test_a_transformer_encoder_traced_without_its_fast_path_misses_when_it_is_switched_on():
    """nn.TransformerEncoder in eval mode with a padding mask reads
    torch.backends.mha.get_fastpath_enabled(): with it on, eager takes the
    nested-tensor fast path and zeroes the padded positions. A variant
    traced with it off answered with the layers' values there."""
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2).eval()
    jf = torchneuron_jit.jit(copy.deepcopy(enc))  # jit(module) compiles the module's own calls
    x, mask = torch.randn(2, 6, 32), torch.zeros(2, 6, dtype=torch.bool)
    mask[1, 4:] = True
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fast path's nested tensor: that variant runs eagerly, and says so
            for fast in (False, False, True, True, False):
                torch.backends.mha.set_fastpath_enabled(fast)
                torch.testing.assert_close(jf(x, src_key_padding_mask=mask), enc(x, src_key_padding_mask=mask),
                                           msg=lambda m: f"fast path {fast}: {m}")
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def _autocast_off_inside(x, w):
    with torch.autocast("cpu", enabled=False):
        return x @ w


def _bfloat16_inside(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return (x @ w).relu()


def _under_callers(x, w):
    return (x @ w).softmax(-1)


@pytest.mark.parametrize("f, outer", [
    (_autocast_off_inside, torch.bfloat16), (_bfloat16_inside, torch.float16), (_under_callers, torch.bfloat16),
], ids=["off inside", "bfloat16 inside float16", "the caller's"])
def test_autocast_switched_inside_a_call_under_the_callers_autocast_gives_eagers_dtype(f, outer):
    """The graph holds autocast's casts as the trace made them: it was built
    and run under the caller's autocast, which cast its matmul again, so
    from the second call a matmul the code ran with autocast off came back
    bfloat16, and one in bfloat16 came back float16."""
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    jf = torchneuron_jit.jit(f)
    with torchneuron_jit.config.patch(compile_blocking=True), torch.autocast("cpu", dtype=outer):
        for _ in range(3):
            got, want = jf(x, w), f(x, w)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)
    assert [v["kind"] for v in torchneuron_jit.explain(jf).variants] == ["compiled"]


_LAYER = torch.nn.Linear(4, 4)  # its parameters require grad


def _autocast_over_a_layer(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return _LAYER(x).relu() * 2


def test_autocast_entered_inside_the_call_over_parameters_that_require_grad_compiles():
    """Autocast casts a parameter that requires grad with grad mode on, for
    its cast cache, whatever the caller's mode: under torch.no_grad(), a
    function that enters autocast itself ran eagerly, said to be training
    (HF BERT under autocast did); one called under the caller's autocast
    compiled."""
    jf = torchneuron_jit.jit(_autocast_over_a_layer)
    x = torch.randn(3, 4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            got, want = jf(x), _autocast_over_a_layer(x)
            assert got.dtype == want.dtype == torch.bfloat16 and not got.requires_grad
            torch.testing.assert_close(got, want)
    assert [v["kind"] for v in torchneuron_jit.explain(jf).variants] == ["compiled"]


@torch.no_grad()
def _predict_no_grad(x):
    return _LAYER(x).relu() * 2


@torch.inference_mode()
def _predict_inference(x):
    return _LAYER(x).relu() * 2


@pytest.mark.parametrize("f", [_predict_no_grad, _predict_inference], ids=["no_grad", "inference_mode"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_function_decorated_to_run_without_grad_compiles(f, requires_grad):
    """@torch.no_grad() and @torch.inference_mode() on an inference
    function, called in grad mode: the decorator's wrapper holds a bound
    method (its context's clone), which jit could not guard, grad mode was
    on as the call began while the parameters require grad, and inference
    mode switched on inside: each call ran eagerly with a warning. The
    graph runs with grad mode off (in inference mode), as the ops did."""
    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught, torchneuron_jit.config.patch(compile_blocking=True):
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(2, 4, requires_grad=requires_grad)
            got, want = jf(x), f(x)
            torch.testing.assert_close(got, want)
            assert (got.requires_grad, got.grad_fn, got.is_inference()) == \
                (want.requires_grad, want.grad_fn, want.is_inference())
    assert [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)] == []
    assert [v["kind"] for v in torchneuron_jit.explain(jf).variants] == ["compiled"]


def test_grad_mode_on_inside_with_tensors_that_require_grad_still_runs_eagerly():
    """What the decorated functions' variants rely on: ops that record a
    history are no graph's."""
    def f(x):
        return _LAYER(x).relu() * 2

    jf = torchneuron_jit.jit(f)
    with pytest.warns(RuntimeWarning, match="grad mode is on inside the traced code and tensors it uses require grad"):
        got = jf(torch.randn(2, 4))
    assert got.grad_fn is not None


def test_calls_in_grad_mode_of_many_sizes_leave_no_grad_calls_compiling():
    """A model called with grad mode on over parameters that require grad
    (a forgotten no_grad, a saliency map in one thread) runs eagerly: its
    eager variant took only its own sizes, each new length traced and
    failed again, and the backoff ran the function eagerly for good, so the
    no_grad calls after it never compiled. Its eager variant takes every
    size."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    eager = copy.deepcopy(model)
    torchneuron_jit.jit(model)
    before = torchneuron_jit.stats()["traces"]
    with torchneuron_jit.config.patch(compile_blocking=True), warnings.catch_warnings(record=True) as caught, \
            torch.enable_grad():
        warnings.simplefilter("always")
        for n in range(5, 13):
            x = torch.randn(2, n, 32)
            got = model(x)
            assert got.grad_fn is not None
            torch.testing.assert_close(got, eager(x))
        assert torchneuron_jit.stats()["traces"] - before == 1
        with torch.no_grad():
            for n in (8, 8, 8):
                x = torch.randn(2, n, 32)
                torch.testing.assert_close(model(x), eager(x))
    kinds = [v["kind"] for v in torchneuron_jit.explain(model).variants]
    assert any(k.startswith("compiled") for k in kinds), kinds
    assert not [str(m.message) for m in caught if "from now on" in str(m.message)]


@pytest.mark.parametrize("f", [lambda x: x.t().flatten(), lambda x: (x * 2).view(-1),
                               lambda x: torch.nn.functional.relu(x).t().reshape(-1)],
                         ids=["x.t().flatten()", "(x * 2).view(-1)", "relu(x).t().reshape(-1)"])
def test_a_result_changed_in_place_under_grad_mode_as_eagers_can_be(f):
    """A frozen jitted backbone feeding a trainable head that adds to its
    features in place (feats += bias): the variant's graph runs with grad
    off, and a view it returned was one autograd refuses to change in
    place under grad mode (RuntimeError where eager trains)."""
    jf = torchneuron_jit.jit(f)
    x = torch.randn(4, 6)
    for _ in range(3):
        grads = []
        for fn in (f, jf):
            w = torch.linspace(-1, 1, 24, requires_grad=True)
            out = fn(x)
            out.mul_(w)
            out.sum().backward()
            grads.append((out.detach(), w.grad))
        torch.testing.assert_close(grads[1], grads[0])
    assert [(v["kind"], v["hits"]) for v in torchneuron_jit.explain(jf).variants] == [("compiled", 2)]


class _Knob:
    k = 2.0

    @classmethod
    def scaled(cls, x):
        return x * cls.k


class _HoldsKnob(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = _Knob

    def forward(self, x):
        return x * self.cfg.k


def _scale_helper(s):
    def h(a):
        return a * s
    return h


_KNOB_HELPER = _scale_helper(2.0)


@pytest.mark.parametrize("case", ["class argument", "class method's cls", "class in a dict argument",
                                  "class a module holds", "Python module argument", "function argument"])
def test_what_a_class_module_or_function_argument_holds_is_guarded(case):
    """A class, Python module or function passed in (or held by a module's
    attribute) was guarded by identity alone: cls.k = 7.0, settings.SCALE
    = 7.0 or a helper's closure rebound after the trace answered with the
    traced value, where the same reached as a global was seen."""
    settings = types.ModuleType("settings_for_test")
    settings.SCALE = 2.0
    f, args = {
        "class argument": (lambda c, x: x * c.k, lambda: (_Knob, X)),
        "class method's cls": (torchneuron_jit.jit(_Knob.scaled), lambda: (X,)),
        "class in a dict argument": (lambda d, x: x * d["cfg"].k, lambda: ({"cfg": _Knob}, X)),
        "class a module holds": (torchneuron_jit.jit(_HoldsKnob()), lambda: (X,)),
        "Python module argument": (lambda m, x: x * m.SCALE, lambda: (settings, X)),
        "function argument": (lambda h, x: h(x), lambda: (_KNOB_HELPER, X)),
    }[case]
    jf = f if case in ("class method's cls", "class a module holds") else torchneuron_jit.jit(f)
    try:
        for value in (2.0, 2.0, 7.0, 7.0, 3.0):
            _Knob.k = settings.SCALE = value
            _KNOB_HELPER.__closure__[0].cell_contents = value
            torch.testing.assert_close(jf(*args()), X * value, msg=lambda m: f"{case}, {value}: {m}")
    finally:
        _Knob.k = 2.0
        _KNOB_HELPER.__closure__[0].cell_contents = 2.0


def test_a_forward_the_instance_holds_is_the_one_jit_compiles():
    """model.forward = MethodType(patched, model) (accelerate's hooks
    install one): jit(model) installed the class's forward over it, and
    the call computed something else than eager's."""
    def patched(self, x):
        return self.lin(x) * 10

    model = torch.nn.Sequential()
    model.lin = torch.nn.Linear(4, 3)
    model.forward = types.MethodType(patched, model)
    ref = copy.deepcopy(model)
    ref.forward = types.MethodType(patched, ref)
    assert torchneuron_jit.jit(model) is model and torchneuron_jit.jit(model) is model
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(x), ref(x))
    assert [(v["kind"], v["hits"]) for v in torchneuron_jit.explain(model).variants] == [("compiled", 2)]


def _tiny(kind):
    import transformers
    torch.manual_seed(0)
    if kind == "bert":
        cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=32)
        return transformers.BertModel(cfg).eval()
    cfg = transformers.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                    final_logit_softcapping=30.0)
    return transformers.Gemma2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("kind, attr, values, read", [
    ("bert", "output_hidden_states", [False, True, False, True], lambda out: out.hidden_states is None),
    ("gemma2", "use_cache", [True, False, True], lambda out: out.past_key_values is None),
    ("gemma2", "final_logit_softcapping", [30.0, 0.5, 30.0], lambda out: out.logits),
])
def test_a_models_config_attribute_set_between_calls_is_seen(kind, attr, values, read):
    """model.config.output_hidden_states = True after jit(model): Hugging
    Face's forward reads its config on every call, and the config (a
    library object a module holds) was held by identity only, so compiled
    calls answered as traced: no hidden states, a cache where use_cache
    was turned off, logits capped at the traced softcap (0.19 off)."""
    import transformers
    model = _tiny(kind)
    eager = copy.deepcopy(model)
    torchneuron_jit.jit(model)
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for value in values:
            setattr(model.config, attr, value)
            setattr(eager.config, attr, value)
            for _ in range(2):
                torch.testing.assert_close(read(model(input_ids=ids)), read(eager(input_ids=ids)),
                                           msg=lambda m: f"{attr} = {value}: {m}")
    assert isinstance(model.config, transformers.PretrainedConfig)


@pytest.mark.parametrize("where", ["with torch.device", "set_default_device"])
def test_the_default_device_is_guarded(where):
    """torch.ones(3) in the traced code makes a tensor on the default
    device: a compiled call kept making CPU tensors under
    with torch.device("meta")."""
    def f(x):
        return torch.ones(3) + x.sum()

    jf = torchneuron_jit.jit(f)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(jf(x), f(x))
    try:
        if where == "set_default_device":
            torch.set_default_device("meta")
            context = contextlib.nullcontext()
        else:
            context = torch.device("meta")
        with context:
            got, want = jf(x), f(x)
    finally:
        torch.set_default_device(None)
    assert got.device == want.device == torch.device("meta")
    torch.testing.assert_close(jf(x), f(x))
    assert "guard default device: cpu" in str(torchneuron_jit.explain(jf))


def test_a_tensors_string_follows_torchs_print_options():
    """str(x) in the traced code is checked by x's bytes: after
    torch.set_printoptions(precision=2) a compiled call returned the
    string the old options made."""
    def f(x):
        return f"doubled: {x * 2}"

    jf = torchneuron_jit.jit(f)
    x = torch.tensor([1.23456])
    try:
        for precision in (4, 4, 2, 2, 6):
            torch.set_printoptions(precision=precision)
            assert jf(x) == f(x), precision
    finally:
        torch.set_printoptions(profile="default")


def test_a_call_under_forward_mode_ad_keeps_its_tangent():
    """A dual tensor took the compiled variant of its dtype and sizes, and
    its result came back without a tangent."""
    import torch.autograd.forward_ad as fwad

    def f(x):
        return x.sin() * 2

    jf = torchneuron_jit.jit(f)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(jf(x), f(x))
    with fwad.dual_level():
        dual = fwad.make_dual(x, torch.ones(3))
        got, want = fwad.unpack_dual(jf(dual)).tangent, fwad.unpack_dual(f(dual)).tangent
    assert got is not None
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(jf(x), f(x))


class _TimesTen(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 10 if func is torch.Tensor.mul else out


class _PlusOne(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out + 1 if func is torch.ops.aten.mul.Tensor else out


@pytest.mark.parametrize("mode", ["TorchFunctionMode", "TorchDispatchMode", "FlopCounterMode", "torch.device"])
def test_a_call_under_a_python_mode_runs_its_code(mode):
    """A TorchFunctionMode or TorchDispatchMode sees each op of an eager
    call; a compiled call ran none of its code (a mode that changes results
    got the unchanged ones, FlopCounterMode counted nothing). Under one,
    the call runs eagerly, with one warning; after it, compiled again.
    torch.device's mode (torch.set_default_device keeps one on) is the
    default device's state: the compiled variant serves it."""
    from torch.utils.flop_counter import FlopCounterMode

    def f(x, w):
        return (x @ w).mul(2) + 1

    jf = torchneuron_jit.jit(f)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jf(x, w), f(x, w))
        traces = torchneuron_jit.stats()["traces"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                if mode == "FlopCounterMode":
                    with FlopCounterMode(display=False) as ours:
                        got = jf(x, w)
                    with FlopCounterMode(display=False) as eager:
                        want = f(x, w)
                    assert ours.get_total_flops() == eager.get_total_flops() > 0
                else:
                    with (_TimesTen() if mode == "TorchFunctionMode" else _PlusOne() if mode == "TorchDispatchMode"
                          else torch.device("cpu")):
                        got, want = jf(x, w), f(x, w)
                torch.testing.assert_close(got, want)
        ours_words = [str(c.message) for c in caught if "torchneuron_jit" in str(c.message)]
        if mode == "torch.device":
            assert ours_words == [] and torchneuron_jit.stats()["traces"] == traces  # the compiled variant
        else:
            assert len(ours_words) == 1 and "TorchFunctionMode or TorchDispatchMode" in ours_words[0], ours_words
        torch.testing.assert_close(jf(x, w), f(x, w))


def test_the_generators_state_read_in_the_call_runs_eagerly_with_a_warning():
    def f(x):
        return x + torch.get_rng_state()[:4].float()

    _one_warning(_same_as_eager(f, lambda i: torch.manual_seed(i), lambda: None),
                 "it calls torch.get_rng_state() at", "test_jit_state.py:")
    assert torchneuron_jit.stats()["graphs_compiled"] == 0


W = torch.zeros(4)


def _sgd_step(p, x):
    with torch.no_grad():
        p.sub_(0.1 * p.grad)
    return p * x


def _scale_grad(p, x):
    p.grad.mul_(0.5)
    return x * 2 + p.grad


def _set_grad(p, x):
    p.grad = x * 3
    return p * 2


def _global_grad(p, x):
    return x + W.grad


class _ReadsItsGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4))

    def forward(self, p, x):
        with torch.no_grad():
            return x * self.w.grad


@pytest.mark.parametrize("f, words", [
    (_sgd_step, "it reads p.grad"), (_scale_grad, "it reads p.grad"), (_set_grad, "it sets p.grad during the call"),
    (_global_grad, "it reads global W.grad"), (_ReadsItsGrad, "it reads self.w.grad"),
], ids=["sgd step", "grad scaled in place", "grad set", "a global's grad", "a parameter's grad"])
def test_a_tensors_grad_read_or_set_runs_eagerly_with_a_warning(f, words):
    """No guard loads a tensor's .grad: a trace that read one kept the
    traced call's gradient tensor for every call (a hand-written SGD step
    used the first gradient for ever), and x.grad = ... was never set."""
    module = f() if isinstance(f, type) else None
    jf = torchneuron_jit.jit(copy.deepcopy(module) if module is not None else f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            results = []
            for fn in (jf, module or f):
                p, x = torch.zeros(4), torch.full((4,), 2.0)
                p.grad = torch.full((4,), float(i + 1))
                W.grad = torch.full((4,), float(i + 5))
                if isinstance(fn, torch.nn.Module):
                    fn.w.grad = torch.full((4,), float(i + 7))
                results.append((fn(p, x).clone(), p.clone(), p.grad.clone()))
            for got, want in zip(*results):
                torch.testing.assert_close(got, want, msg=lambda m: f"call {i}: {m}")
    _one_warning([str(w.message) for w in caught if "torchneuron_jit" in str(w.message)], words)


PARAMS = {"w": [torch.zeros(4)]}


def _sgd_steps(where):
    """A hand-written SGD step over parameters it reaches through where:
    a global dict, a closure's list, or an object its argument holds."""
    params = [torch.zeros(4)]

    class Opt:
        def __init__(self, ps):
            self.ps = ps

    def through_global(opt):
        with torch.no_grad():
            for q in PARAMS["w"]:
                q.sub_(0.1 * q.grad)

    def through_closure(opt):
        with torch.no_grad():
            for q in params:
                q.sub_(0.1 * q.grad)

    def through_argument(opt):
        with torch.no_grad():
            for q in opt.ps:
                q.sub_(0.1 * q.grad)

    step = {"global": through_global, "closure": through_closure, "argument": through_argument}[where]
    held = PARAMS["w"] if where == "global" else params
    return step, held, Opt(held) if where == "argument" else None


@pytest.mark.parametrize("where", ["global", "closure", "argument"])
def test_a_grad_read_through_a_container_of_parameters_runs_eagerly(where):
    """for p in params: p.sub_(lr * p.grad), params held by a global dict, a
    closure or an argument's object: the parameters were captured tensors,
    whose .grad no check looked at, and every compiled step subtracted the
    traced step's gradient (weights off by 0.15 after one step, silently)."""
    runs = []
    for door in ("jit", "eager"):
        step, held, opt = _sgd_steps(where)
        held[0] = held[0].clone().zero_()
        fn = torchneuron_jit.jit(step) if door == "jit" else step
        weights = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(4):
                held[0].grad = torch.full((4,), float(i + 1))
                fn(opt)
                weights.append(held[0].clone())
        runs.append((weights, [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]))
    for got, want in zip(runs[0][0], runs[1][0]):
        torch.testing.assert_close(got, want)
    _one_warning(runs[0][1], "it reads the .grad of a tensor that a container, an object or a closure holds"
                 if where != "argument" else "it reads opt.ps[0].grad")


GLOBAL_W = torch.ones(3)
WEIGHTS = {"w": torch.ones(3)}


class _Holder:
    w = torch.ones(3)


HOLDER = _Holder()


@pytest.mark.parametrize("where", ["global", "dict item", "object attribute", "closure list"])
def test_requires_grad_switched_on_a_held_tensor_is_a_miss(where):
    """A function-style model whose weights a global, a global dict, an
    object or a closure's list holds, warmed up before they require grad:
    requires_grad_() changes the tensor in place, its identity guard held,
    and the inference variant answered with no autograd history (backward
    raised "element 0 of tensors does not require grad")."""
    closure = [torch.ones(3)]
    get = {"global": lambda: GLOBAL_W, "dict item": lambda: WEIGHTS["w"],
           "object attribute": lambda: HOLDER.w, "closure list": lambda: closure[0]}[where]

    def model(x):
        return (x * get()).tanh()

    # the weights read the way the user's code reads them (get's own code is what the trace follows)
    jf = torchneuron_jit.jit(model)
    with torch.enable_grad():
        x = torch.randn(3)
        for _ in range(3):
            torch.testing.assert_close(jf(x), model(x))
        w = get()
        w.requires_grad_(True)
        try:
            out, want = jf(x), model(x)
            assert out.requires_grad and want.requires_grad
            torch.testing.assert_close(out, want)
            (g,) = torch.autograd.grad(out.sum(), w)
            (g_want,) = torch.autograd.grad(want.sum(), w)
            torch.testing.assert_close(g, g_want)
        finally:
            w.requires_grad_(False)


# -- records ---------------------------------------------------------------------------

CHILD = r"""
import json, sys, torch, torchneuron_jit
CFG = {"scale": float(sys.argv[1])}
@torchneuron_jit.jit
def f(x):
    return x * CFG["scale"]
out = f(torch.ones(2))
print(json.dumps([out.tolist(), torchneuron_jit.stats()["traces_loaded"]]))
"""


def test_a_record_applies_only_to_the_same_contents(run_python, tmp_path):
    """A fresh process whose global dict holds another value does not take
    the record made with the first (its content guards are in it)."""
    import json
    (tmp_path / "child.py").write_text(CHILD)

    def run(scale):
        proc = run_python("child.py", scale, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert run("2.0") == [[2.0, 2.0], 0]
    assert run("2.0") == [[2.0, 2.0], 1]
    assert run("5.0") == [[5.0, 5.0], 0]


STATE_CHILD = r"""
import json, sys, torch, torchneuron_jit
torch.use_deterministic_algorithms(sys.argv[1] == "on")
@torchneuron_jit.jit
def f(x):
    return x * (2 if torch.are_deterministic_algorithms_enabled() else 3)
out = f(torch.ones(2))
print(json.dumps([out.tolist(), torchneuron_jit.stats()["traces_loaded"]]))
"""


def test_a_record_holds_the_torch_state_its_trace_read(run_python, tmp_path):
    """A warm process finds the record of a trace that read
    torch.are_deterministic_algorithms_enabled() (the key is the state
    every call is guarded on), and takes it only with the same setting."""
    import json
    (tmp_path / "child.py").write_text(STATE_CHILD)

    def run(setting):
        proc = run_python("child.py", setting)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert run("off") == [[3.0, 3.0], 0]
    assert run("off") == [[3.0, 3.0], 1]
    assert run("on") == [[2.0, 2.0], 0]
    assert run("on") == [[2.0, 2.0], 1]


def test_attributes_of_a_users_module_are_guarded(monkeypatch):
    """import settings; settings.SCALE: the module's attributes the code
    names are guarded as that module's globals."""
    import types
    settings = types.ModuleType("tn_test_settings")
    settings.SCALE, settings.OPTS = 2.0, {"shift": 1.0}
    monkeypatch.setitem(sys.modules, "tn_test_settings", settings)
    scope = {"torch": torch, "settings": settings}
    exec("def f(x):\n    return x * settings.SCALE + settings.OPTS['shift']\n", scope)
    f = scope["f"]

    def set_state(i):
        settings.SCALE = [2.0, 5.0, 5.0, 1.0][i]
        settings.OPTS["shift"] = [1.0, 1.0, 3.0, 3.0][i]

    assert _same_as_eager(f, set_state, lambda: (settings.SCALE, dict(settings.OPTS))) == []
    settings.SCALE, settings.OPTS["shift"] = 2.0, 1.0
    out, log = _miss(torchneuron_jit.jit(f), lambda: setattr(settings, "SCALE", 5.0))
    torch.testing.assert_close(out, X * 5.0 + 1.0)
    assert "tn_test_settings.SCALE: 2.0 → 5.0" in log, log


def _env_get_scale(x):
    return x * float(os.environ.get("TN_TEST_SCALE", "1"))


def test_os_environ_get_is_seen_through_the_standard_library(monkeypatch):
    def set_state(i):
        monkeypatch.setenv("TN_TEST_SCALE", str(i + 2))

    _one_warning(_same_as_eager(_env_get_scale, set_state, lambda: None), "it calls os.environ at",
                 "test_jit_state.py:")


LOGGER = __import__("logging").getLogger("tn_test_state")


def _logs(x):
    LOGGER.debug("scaling %s", 2)
    return x * 2


def test_a_library_object_held_by_a_global_is_guarded_by_its_own_attributes():
    """A module-level logger: its level cache fills as it logs, which is
    the library's state, not a write of the call's; the variant compiles
    (the logging call itself warns that compiled calls skip it)."""
    jf = torchneuron_jit.jit(_logs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(jf(X), X * 2)
    messages = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    _one_warning(messages, "the logging call at", "test_jit_state.py")
    assert torchneuron_jit.stats()["graphs_compiled"] == 1


def test_assigning_an_attribute_of_a_users_module_runs_eagerly_with_a_warning(monkeypatch):
    import types
    settings = types.ModuleType("tn_test_counter")
    settings.COUNT = 0
    monkeypatch.setitem(sys.modules, "tn_test_counter", settings)
    scope = {"torch": torch, "settings": settings}
    exec("def f(x):\n    settings.COUNT += 1\n    return x * settings.COUNT\n", scope)

    def set_state(i):
        settings.COUNT = i

    _one_warning(_same_as_eager(scope["f"], set_state, lambda: settings.COUNT),
                 "it writes tn_test_counter.COUNT (an int)")


class _SetUpOnce(torch.nn.Module):
    """A module that finishes its set-up in its first call."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        if not getattr(self, "_ready", False):
            self._ready = True
        return self.lin(x) * 2


def test_a_set_up_in_the_first_call_makes_no_variant_and_no_warning():
    """The first call writes an attribute of the module that its own guards
    check: its variant would take no call. It makes none, warns nothing,
    and the next call traces and compiles."""
    model = _SetUpOnce().eval()
    ref = copy.deepcopy(model)
    torchneuron_jit.jit(model)
    x = torch.randn(3, 4)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            torch.testing.assert_close(model(x), ref(x))
    assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    report = torchneuron_jit.explain(model.forward)
    assert [(v["kind"], v["hits"]) for v in report.variants] == [("compiled", 2)], str(report)


def test_output_hidden_states_once_leaves_later_calls_compiled():
    """transformers installs its output-capturing hooks on the layers in the
    first call with output_hidden_states=True, and marks the model so: that
    call writes the model's state, and its guards fail on what it left. It
    makes no variant and says nothing (its eager variant would take no call,
    and its warning said the model runs eagerly); the next calls trace again
    and compile, hooks and all, with no backoff. Before, its eager variant
    took every later call with the same argument types: the model ran
    eagerly for good."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=500)
    model = transformers.BertModel(cfg).eval()
    ref = copy.deepcopy(model)
    torchneuron_jit.jit(model)
    ids = torch.randint(0, 500, (2, 12))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for hidden in (False, True, False, False, True, True, False):
            got, want = model(ids, output_hidden_states=hidden), ref(ids, output_hidden_states=hidden)
            torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
            assert (got.hidden_states is None) == (want.hidden_states is None)
            for g, e in zip(got.hidden_states or (), want.hidden_states or ()):
                torch.testing.assert_close(g, e)
    assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    report = torchneuron_jit.explain(model.forward)  # calls 4, 6 and 7 hit, with and without hidden states
    hits = {kind: sum(v["hits"] for v in report.variants if v["kind"] == kind) for kind in ("compiled", "eager")}
    assert hits == {"compiled": 3, "eager": 0}, str(report)
    assert "_output_capturing_hooks_installed" in str(report) and "no variant is made of it" in str(report)


class _ReadsItsWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.lin = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, ids):  # Python reads the parameters' metadata
        h = self.emb(ids)
        return self.lin(h) * self.lin.weight.shape[0] * self.scale[:self.lin.weight.shape[0]], h.dtype


@pytest.mark.parametrize("change", ["half", "double", "data", "buffer"])
def test_a_parameter_changed_in_place_is_a_miss(change):
    """model.half() and p.data = ... keep the Parameter objects and change
    their dtype or sizes in place: the variant traced before must not take
    the next call (it returned float32 as h.dtype after half(), and the old
    row count after the weight's rows changed)."""
    m = _ReadsItsWeight().eval()
    ref = copy.deepcopy(m)
    f = torchneuron_jit.jit(m)
    ids = torch.randint(0, 10, (2, 3))
    with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True):
        f(ids)
        f(ids)
        for mod in (m, ref):
            if change in ("half", "double"):
                getattr(mod, change)()
            elif change == "data":
                mod.lin.weight.data = torch.ones(2, 4)
                mod.lin.bias.data = torch.zeros(2)
            else:
                mod.scale.data = torch.ones(4, dtype=torch.float64)
        traces = torchneuron_jit.stats()["traces"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, reason = _recompile_reason(f, ids)
        want = ref(ids)
        assert got[1] == want[1]
        torch.testing.assert_close(got[0], want[0])
        assert torchneuron_jit.stats()["traces"] == traces + 1
        assert not [w for w in caught if "torchneuron" in str(w.message)], [str(w.message) for w in caught]
        assert "self." in reason and "→" in reason, reason  # which tensor changed, and how


def test_a_pre_hook_that_sets_the_weight_on_each_call_runs_eagerly_in_words_that_say_so():
    """torch.nn.utils.prune sets module.weight in a forward pre-hook on every
    call: each trace was dropped as changed "while its variant was built"
    (nothing else ran), four times, and the function ran eagerly for good
    in those words. The second trace's variant runs eagerly, naming the
    write; the first makes none (a set-up made once would compile next)."""
    from torch.nn.utils import prune

    def pruned():  # no deepcopy: a pruned weight is no graph leaf
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).eval()
        prune.l1_unstructured(m[0], "weight", amount=0.5)
        return m

    ref, f = pruned(), torchneuron_jit.jit(pruned())
    traces = torchneuron_jit.stats()["traces"]
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught, \
            torchneuron_jit.config.patch(compile_blocking=True):
        warnings.simplefilter("always")
        for _ in range(12):
            x = torch.randn(4, 6)
            torch.testing.assert_close(f(x), ref(x))
    assert torchneuron_jit.stats()["traces"] - traces == 2
    words = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(words) == 1 and "self.0.weight" in words[0] and "pre-hook" in words[0], words
    assert "while its variant was built" not in words[0], words
    # prune.remove before serving (remove_weight_norm likewise): the model is plain again, and compiles (the
    # eager variant took every call with these argument types, for good)
    prune.remove(f[0], "weight")  # jit(module) is the module, compiled
    prune.remove(ref[0], "weight")
    traces, graphs = torchneuron_jit.stats()["traces"], torchneuron_jit.stats()["graphs_compiled"]
    with torch.no_grad(), torchneuron_jit.config.patch(compile_blocking=True):
        for _ in range(4):
            x = torch.randn(4, 6)
            torch.testing.assert_close(f(x), ref(x))
    assert torchneuron_jit.stats()["traces"] - traces == 1
    assert torchneuron_jit.stats()["graphs_compiled"] - graphs == 1


def test_a_frame_that_fills_its_own_kwargs_is_no_write():
    """transformers' decorators set and pop keys of the frame's own **kwargs
    (use_cache, return_dict): a dict made for each call, no state of the
    caller's, so the variant compiles (checked on what the call left, it
    read as a write and ELECTRA ran eagerly)."""
    def f(x, **kwargs):
        kwargs["use_cache"] = True
        kwargs.pop("return_dict", None)
        return x * 2 + len(kwargs)

    jf = torchneuron_jit.jit(f)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught, \
            torchneuron_jit.config.patch(compile_blocking=True, jit_trace_records=False):
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(4)
            torch.testing.assert_close(jf(x, return_dict=True, scale=1), x * 2 + 2)
    assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    e = torchneuron_jit.explain(jf)
    assert e.variants[0]["kind"] == "compiled" and e.variants[0]["hits"] == 2, str(e)


def _is_tied(a, b):
    if a is b:  # q is kv, tied weights: another computation for one tensor passed twice
        return a * 2
    return a + b * 10


def test_one_tensor_passed_where_the_trace_had_two_is_a_miss():
    """Traced with two tensors, called with one twice: the variant's `a is
    b` was False (found by a helper's probe: 11 where eager gives 2). The
    tensor arguments are guarded to be as many different ones as in the
    trace, as one passed twice was already guarded to be one."""
    jf = torchneuron_jit.jit(_is_tied)
    a, b = torch.ones(2), torch.full((2,), 3.0)
    for args in [(a, b), (a, b), (b, b), (a, a), (a, b), (b, a)]:
        torch.testing.assert_close(jf(*args), _is_tied(*args))
    assert len(torchneuron_jit.explain(jf).variants) == 2


_BY_ID = {}


def _reads_by_identity(x, w):
    return x * _BY_ID[id(w)]


def _reads_by_address(x, w):
    return x * _BY_ID[w.data_ptr()]


@pytest.mark.parametrize("f, words", [(_reads_by_identity, "id()"), (_reads_by_address, "Tensor.data_ptr()")])
def test_a_lookup_by_a_tensors_identity_or_address_runs_eagerly_with_a_warning(f, words):
    """PACKED[id(w)], SCALE[w.data_ptr()]: a compiled call kept the entry
    of the traced call's tensor for another tensor of its sizes (found by a
    helper's probe). The value of id() or data_ptr() is no guard's: the
    function runs eagerly and says why."""
    ws = [torch.full((3,), float(i)) for i in range(3)]
    _BY_ID.clear()
    _BY_ID.update({id(w): i + 1.0 for i, w in enumerate(ws)})
    _BY_ID.update({w.data_ptr(): i + 1.0 for i, w in enumerate(ws)})
    jf = torchneuron_jit.jit(f)
    x = torch.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for w in (ws[0], ws[0], ws[0], ws[1], ws[2]):
            torch.testing.assert_close(jf(x, w), f(x, w))
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert ours and f"it calls {words} at {__file__}:" in ours[0], ours


def _float64_scope(pos):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return pos[:, None] / (10000 ** (torch.arange(0, 8, 2) / 8)), torch.ones(2)
    finally:
        torch.set_default_dtype(old)


def _flushes_denormals(x):
    torch.set_flush_denormal(True)
    return x * 2


def _warns_always(x):
    torch.set_warn_always(False)
    return x * 2


@pytest.mark.parametrize("f", [_float64_scope, _flushes_denormals, _warns_always])
def test_torchs_settings_set_inside_the_call_run_it_eagerly_with_a_warning(f):
    """A float64 scope around a RoPE table: compiled calls skipped the
    set_default_dtype calls, and their arange and division gave float32
    (found by a helper's probe); set_flush_denormal inside was skipped."""
    jf = torchneuron_jit.jit(f)
    pos = torch.arange(6)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                torch.set_flush_denormal(False)
                got = jf(pos)
                assert torch.get_default_dtype() is torch.float32
                flushed = (torch.tensor([1e-39]) * 1.0).item() == 0.0  # a denormal result
                assert flushed == (f is _flushes_denormals)
                torch.testing.assert_close(got, f(pos))
    finally:
        torch.set_flush_denormal(False)
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(ours) == 1 and "it calls torch.set_" in ours[0] and "which a compiled call would skip" in ours[0], ours


@functools.lru_cache(maxsize=None)
def _cached_slopes(n):
    return torch.tensor([2.0 ** -(i + 1) for i in range(n)]) * SLOPE_SCALE


SLOPE_SCALE = 1.0


def _scaled_by_cached_slopes(x):
    return x * _cached_slopes(x.shape[-1]) + 1


def test_an_lru_cache_helper_compiles_and_answers_from_its_cache_as_eager():
    """@lru_cache def alibi_slopes(n) called in the function: it ran eagerly
    ("a _lru_cache_wrapper, whose contents jit cannot guard"; found by a
    helper's probe). The wrapper is guarded by identity and its attributes,
    the function it wraps as a function the call ran; a cached answer stays
    the answer, as eagerly (SLOPE_SCALE changed after it was cached)."""
    global SLOPE_SCALE, _cached_slopes
    jf = torchneuron_jit.jit(_scaled_by_cached_slopes)
    compiled = torchneuron_jit.stats()["graphs_compiled"]
    original = _cached_slopes
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for n, scale in [(4, 1.0), (4, 1.0), (4, 3.0), (8, 3.0), (8, 3.0)]:
                SLOPE_SCALE = scale
                x = torch.randn(2, n)
                torch.testing.assert_close(jf(x), _scaled_by_cached_slopes(x))
            _cached_slopes = functools.lru_cache(lambda n: torch.full((n,), 5.0))  # another helper: a miss
            torch.testing.assert_close(jf(x), _scaled_by_cached_slopes(x))
    finally:
        _cached_slopes, SLOPE_SCALE = original, 1.0
    assert [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)] == []
    assert torchneuron_jit.stats()["graphs_compiled"] > compiled


class _TaggedParameters(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))
        self.w.scale = 2.0  # a per-parameter scale tagged on the parameter
        self.register_buffer("b", torch.ones(2))
        self.b.on = True

    def forward(self, x):
        y = x * self.w * self.w.scale
        return y + self.b if self.b.on else y


TAGGED = torch.ones(2)
TAGGED.k = 1.0


def _reads_a_tagged_global(x):
    return x * TAGGED.k


def test_python_attributes_of_parameters_buffers_and_global_tensors_are_guarded():
    """self.w.scale, self.b.on, a global tensor's T.k read in the code:
    changed after the trace, jit kept the traced values (found by a
    helper's probe: 3 where eager gives 6). The tensors' attributes the
    code names are guarded as a snapshot of their __dict__."""
    ref, m = _TaggedParameters().eval(), _TaggedParameters().eval()
    jm, jg = torchneuron_jit.jit(m), torchneuron_jit.jit(_reads_a_tagged_global)
    x = torch.ones(2)
    try:
        with torch.no_grad():
            for scale, on, k in [(2.0, True, 1.0)] * 2 + [(5.0, True, 1.0), (5.0, False, 1.0), (5.0, False, 3.0)]:
                ref.w.scale = m.w.scale = scale
                ref.b.on = m.b.on = on
                TAGGED.k = k
                torch.testing.assert_close(jm(x), ref(x))
                torch.testing.assert_close(jg(x), _reads_a_tagged_global(x))
    finally:
        TAGGED.k = 1.0
    assert "self.w's attributes" in str(torchneuron_jit.explain(jm))


_BY_TENSOR = {}


def _reads_by_tensor_key(x, w):
    return (x @ w) * _BY_TENSOR[w]


def test_a_lookup_in_a_dict_keyed_by_tensors_is_guarded_by_the_tensors_identity():
    """SCALE[w] with SCALE = {w1: 1.0, w2: 100.0}: a tensor's hash is its
    id(), taken in torch's own code, so the id() check did not see it, and
    w2's call got w1's entry (found by a helper's probe). A tensor user code
    hashes is guarded by identity (weakly)."""
    ws = [torch.randn(3, 3) for _ in range(3)]
    _BY_TENSOR.clear()
    _BY_TENSOR.update({w: 10.0 ** i for i, w in enumerate(ws)})
    jf = torchneuron_jit.jit(_reads_by_tensor_key)
    x = torch.randn(2, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in (0, 0, 1, 2, 1, 0):
            torch.testing.assert_close(jf(x, ws[i]), _reads_by_tensor_key(x, ws[i]))
    assert [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)] == []
    assert len(torchneuron_jit.explain(jf).variants) == 3
    assert "hashed: a dict or set keyed by tensors" in str(torchneuron_jit.explain(jf))
