"""The recompilation manager (_manager.py): storm words, backoff,
blacklist, explain(), and the same words for torch.compile(backend="neuron")."""
import threading
import contextlib
import copy
import functools
import io
import re
import sys
import warnings

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import _jit, config


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def storm_warnings(w):
    return [str(m.message) for m in w if "changes" in str(m.message) or "took" in str(m.message)
            or "changed" in str(m.message)]


STEP = 0


def _stepping():
    def f(x):
        return x * STEP + 1
    return f


def _run_steps(jf, n):
    global STEP
    try:
        for i in range(n):
            STEP = i
            x = torch.randn(4)
            torch.testing.assert_close(jf(x), x * i + 1)
    finally:
        STEP = 0


def test_a_global_that_changes_on_every_call_is_named_with_its_line():
    jf = torchneuron_jit.jit(_stepping())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _run_steps(jf, 6)
    words = storm_warnings(w)
    assert len(words) == 1, words
    assert "f (" in words[0] and "global STEP changes on every call (0 → 1, 1 → 2, 2 → 3, 3 → 4)" in words[0], words
    assert "read at " + __file__ in words[0] and "pass it as an argument" in words[0], words


def test_a_storm_evicts_no_variant_and_warns_of_the_limit_once():
    """Past the limit, a variant unused for jit_evict_after calls makes room
    for a call none takes, but not in a storm the manager warned of: each
    variant of a global that changes on every call takes one call, and
    evicting traced again and again (32 traces in 300 calls). The limit's
    warning comes once."""
    jf = torchneuron_jit.jit(_stepping())
    before = torchneuron_jit.stats()
    with warnings.catch_warnings(record=True) as w, config.patch(jit_evict_after=4):
        warnings.simplefilter("always")
        _run_steps(jf, 60)
    after = torchneuron_jit.stats()
    assert after["traces"] - before["traces"] == config.jit_cache_limit
    assert after["variants_evicted"] == before["variants_evicted"]
    assert len([m for m in w if "limit of traced variants" in str(m.message)]) == 1


def test_a_storm_that_settles_gets_a_variant_again():
    """transformers' generate() with a static cache sets the model's
    _previous_max_cache_length to the longest prompt so far: it takes a
    value per new length, then stays. The storm's variants filled the limit
    with its past values, and no miss of it evicted one: every call after
    ran eagerly for good. A value that stays put at two asks in a row
    evicts a variant unused long enough, and is compiled. (Here forward
    reads it: an attribute no code of the call names is guarded to be
    there only, and takes no variant per value.)"""
    class Longest(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.longest = 0

        def forward(self, x):
            y = self.lin(x).relu()
            return y if self.longest >= 0 else -y

    torch.manual_seed(0)
    m = Longest().eval()
    jf = torchneuron_jit.jit(copy.deepcopy(m))
    with torch.no_grad(), warnings.catch_warnings(record=True) as w, \
            config.patch(jit_evict_after=4, compile_blocking=True):
        warnings.simplefilter("always")
        for i in range(1, 31):
            jf.longest = min(i, config.jit_cache_limit + 2)
            x = torch.randn(4, 8)
            torch.testing.assert_close(jf(x), m(x))
    assert len(storm_warnings(w)) == 1, storm_warnings(w)
    e = torchneuron_jit.explain(jf)
    assert max(v["hits"] for v in e.variants) >= 10, str(e)
    assert "self.longest has stayed 10" in str(e), str(e)


def test_a_global_that_changes_while_background_builds_run_gets_the_storm_words_at_the_users_line():
    """With builds in the background (the default), a global that changes
    on every call drops each build (what the trace read changed while it
    was built): no miss was counted, no storm words came, and the function
    was blacklisted with a warning that pointed at threading.py."""
    global STEP
    jf = torchneuron_jit.jit(_stepping())
    try:
        with warnings.catch_warnings(record=True) as w, config.patch(compile_blocking=False, build_worker="thread"):
            warnings.simplefilter("always")
            for i in range(20):
                x = torch.randn(4)
                torch.testing.assert_close(jf(x), x * i + 1); line = sys._getframe().f_lineno  # noqa: E702
                STEP = i + 1
                _jit.wait(60)
    finally:
        STEP = 0
    ours = [m for m in w if "torchneuron_jit" in str(m.message)]
    words = [s for s in storm_warnings(w) if "global STEP changes" in s]
    assert len(words) == 1 and "pass it as an argument" in words[0], words
    assert ours and all((m.filename, m.lineno) == (__file__, line) for m in ours), \
        [(m.filename, m.lineno, str(m.message)[:80]) for m in ours]


def test_explain_counts_the_calls_that_ran_eagerly_while_a_variant_was_built():
    """jit builds one variant at a time in the background: another
    function's calls meanwhile run eagerly untraced, and explain() said
    only "3 calls, 0 variants", with no miss and no reason."""
    def long(x):
        for _ in range(200):
            x = torch.sin(x) * 1.0001 + 1e-6
        return x

    def other(x):
        return x * 2

    a, b = torchneuron_jit.jit(long), torchneuron_jit.jit(other)
    x = torch.randn(4)
    with config.patch(compile_blocking=False, build_worker="thread", build_pause_ms=5000):
        a(x)  # its build starts, and pauses while jitted calls run
        assert _jit._builds.busy()
        for _ in range(3):
            torch.testing.assert_close(b(x), x * 2)
        _jit.wait(120)
    head = str(torchneuron_jit.explain(b)).splitlines()[0]
    assert "3 calls, 0 variants, 3 of its calls ran eagerly while a variant was built" in head, head


def test_the_limit_warning_names_the_limit_the_function_has():
    """jit(f, cache_limit=2) at its limit of 2 was said to have reached
    "config.jit_cache_limit = 8"."""
    jf = torchneuron_jit.jit(_stepping(), cache_limit=2)
    with warnings.catch_warnings(record=True) as w, config.patch(storm_misses=0):
        warnings.simplefilter("always")
        _run_steps(jf, 4)
    words = [str(m.message) for m in w if "limit of traced variants" in str(m.message)]
    assert len(words) == 1 and "(jit(cache_limit=2))" in words[0] and "config.jit_cache_limit" not in words[0], words
    assert "the last reason was: global STEP: 1 → 2" in words[0], words


def test_no_storm_words_without_the_detector():
    jf = torchneuron_jit.jit(_stepping())
    with warnings.catch_warnings(record=True) as w, config.patch(storm_misses=0):
        warnings.simplefilter("always")
        _run_steps(jf, 6)
    assert storm_warnings(w) == []


def test_under_w_error_a_storm_warning_raises_from_the_call_as_itself(monkeypatch):
    """python -W error (pytest's filterwarnings = error) makes the storm
    warning an exception: it was caught as a failure of ours, wrapped twice
    ("explaining a guard failure failed (... counting a miss of f failed
    (...)") and, raised once more, printed as "Exception ignored" while the
    call went on. It comes out of the call that missed, as itself, and the
    calls after it are eager's."""
    global STEP
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    jf = torchneuron_jit.jit(_stepping())
    raised = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(8):
                STEP = i
                x = torch.randn(4)
                try:
                    torch.testing.assert_close(jf(x), x * i + 1)
                except RuntimeWarning as w:
                    raised.append(str(w))
    finally:
        STEP = 0
    assert unraisable == [], [u.exc_value for u in unraisable]
    assert len(raised) == 1 and "global STEP changes on every call" in raised[0], raised
    assert "failed" not in raised[0], raised


def test_calls_in_grad_mode_from_several_threads_at_once_leave_no_grad_calls_compiled():
    """Four threads calling at once in grad mode, over parameters that
    require grad, each traced before any entry was there: each eager entry
    counted as a failed trace, four reached config.blacklist_after, and the
    model ran eagerly for good, no_grad calls too (found by a helper's
    probe). Such an entry is the call's modes' decision, not a failure."""
    model = torchneuron_jit.jit(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))
    barrier = threading.Barrier(4)

    def grad_call(i):
        barrier.wait()
        return model(torch.randn(i + 1, 8)).shape

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one "runs eagerly: grad mode is on" warning
        threads = [threading.Thread(target=grad_call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    jf = model.forward._tn_jit
    assert not jf.gave_up
    x = torch.randn(5, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(model(x), torch.relu(model[0](x)))
    assert any(v["kind"] == "compiled" and v["hits"] for v in torchneuron_jit.explain(model).variants)


def test_a_module_attribute_set_between_calls():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 1.0

        def forward(self, x):
            return x * self.scale

    m = torchneuron_jit.jit(Scaled())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(6):
            m.scale = float(i)
            x = torch.randn(3)
            torch.testing.assert_close(m(x), x * float(i))
    words = storm_warnings(w)
    assert len(words) == 1 and "Scaled.forward" in words[0], words
    assert "self.scale changes on every call, set between calls by the caller or code around" in words[0], words


class _Named:
    def __init__(self):
        self.name = ""


def _grow(x, s):
    s.name = s.name + "x"  # the call's own doing: the next call reads what this one set
    return x * len(s.name)


def test_an_argument_objects_attribute_the_call_sets_on_every_call_is_named_as_the_calls_doing():
    """The words said "set from outside between calls" for an attribute
    the function itself sets on its argument object; now they say the
    call sets it, and what to do."""
    jf = torchneuron_jit.jit(_grow)
    s, want = _Named(), _Named()
    with warnings.catch_warnings(record=True) as w, config.patch(compile_blocking=True):
        warnings.simplefilter("always")
        for _ in range(6):
            x = torch.randn(3)
            torch.testing.assert_close(jf(x, s), _grow(x, want))
            assert s.name == want.name
    words = storm_warnings(w)
    assert len(words) == 1 and "s.name changes on every call ('' → 'x', 'x' → 'xx'" in words[0], words
    assert "each call sets it" in words[0] and "from outside" not in words[0], words


def test_sizes_that_stay_static_are_explained():
    def g(x):
        return x[x > 0] * 2  # data-dependent: every variant runs eagerly

    jf = torchneuron_jit.jit(g)
    with warnings.catch_warnings(record=True) as w, config.patch(trace_backoff=0, blacklist_after=0):
        warnings.simplefilter("always")
        for n in range(5, 13):
            x = torch.randn(n)
            torch.testing.assert_close(jf(x), g(x))
    words = [s for s in storm_warnings(w) if "took" in s]
    assert len(words) == 1 and "x dim 0 took" in words[0], words
    assert "its traces run eagerly (aten.index.Tensor has a data-dependent result)" in words[0], words


def _wraps_forward(forward):  # as transformers' decorators (can_return_tuple, check_model_inputs) do
    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        return forward(self, *args, **kwargs)
    return wrapper


class _Decorated(torch.nn.Module):
    @_wraps_forward
    def forward(self, hidden, scale=2.0):
        return hidden * scale


def test_arguments_through_a_decorators_args_are_named_as_the_wrapped_function_names_them():
    """model(x) through a wrapper(self, *args, **kwargs): guards, misses and
    the manager's decisions said "args[0]", not the parameter's name."""
    model = torchneuron_jit.jit(_Decorated())
    for n in (2, 3, 4, 5):
        x = torch.randn(n)
        torch.testing.assert_close(model(x), x * 2.0)
    text = str(torchneuron_jit.explain(model))
    assert "hidden dim 0 took 2 or more values; dynamic now" in text and "args[" not in text, text


def test_warnings_point_at_the_users_line():
    """A jitted module's storm and limit warnings, and a variant that runs
    eagerly, pointed inside torchneuron_jit (its forward wrapper, give_up,
    _eager_entry): the user's line that called it is where they point."""
    import inspect

    class M(torch.nn.Module):
        def forward(self, x):
            print("side effect")
            return x * 2

    m = torchneuron_jit.jit(M())
    jf = torchneuron_jit.jit(lambda x: x * 2, cache_limit=2)
    with warnings.catch_warnings(record=True) as w, torchneuron_jit.config.patch(dynamic_after=0), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        for n in range(2, 8):
            line = inspect.currentframe().f_lineno + 1
            m(torch.randn(n)), jf(torch.randn(n))
    ours = [(x.filename, x.lineno) for x in w if "torchneuron_jit" in str(x.message)]
    assert len(ours) >= 3 and set(ours) == {(__file__, line)}, [(x.filename, x.lineno, str(x.message)[:60])
                                                               for x in w]


def test_a_dimension_python_needs_the_value_of_stays_static_in_words_that_say_so():
    """range(x.size(1)): each new size took a symbolic trace that came back
    pinned to that size (Eq(x.size(1), k)), a variant said to have dynamic
    sizes, and no storm warning, or one per size blaming "a relation of
    sizes". The dimension now stays static at its first pinned trace, the
    batch dimension still becomes dynamic, and one warning says why."""
    def h(x):
        out = torch.zeros_like(x)
        for i in range(x.size(1)):
            out[:, i] = x[:, :i + 1].sum(1)
        return out

    jf = torchneuron_jit.jit(h, cache_limit=16)
    shapes = [(2, 3), (3, 4), (4, 5), (5, 6), (2, 7), (3, 3), (6, 8), (4, 9)]
    before = torchneuron_jit.stats()["dynamic_traces"]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for b, n in shapes:
            x = torch.randn(b, n)
            torch.testing.assert_close(jf(x), h(x))
    words = [s for s in storm_warnings(w) if "took" in s]
    assert len(words) == 1 and ": x dim 1 took " in words[0], words
    assert "stays static because x.size(1) is used where Python needs its value" in words[0], words
    took, calls = (int(v) for v in re.search(r"took (\d+) values in (\d+) calls", words[0]).groups())
    assert took == len({n for _, n in shapes[:calls]}), words  # the call that warns counts its own size
    from torchneuron_jit import _manager
    assert ("x", 1) in _manager.site(jf).pinned
    assert ("x", 0) in _manager.site(jf).dynamic  # the batch: one variant per width serves every batch
    assert torchneuron_jit.stats()["dynamic_traces"] - before >= 1


def test_an_int_argument_that_stays_static_is_explained():
    """range(n) needs n's value, so every value of n is a variant: the
    words name n and why it stays static."""
    def h(x, n):
        for _ in range(n):
            x = x * 0.5 + 1
        return x

    jf = torchneuron_jit.jit(h, cache_limit=16)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(2, 9):
            x = torch.randn(3)
            torch.testing.assert_close(jf(x, n), h(x, n))
    words = [s for s in storm_warnings(w) if "took" in s]
    assert len(words) == 1 and "h (" in words[0] and ": n took " in words[0], words
    assert "stays static because n is used where Python needs its value" in words[0], words
    assert "pass it as a tensor" in words[0], words
    took, calls = (int(v) for v in re.search(r"took (\d+) values in (\d+) calls", words[0]).groups())
    assert took == calls, words  # n took a new value on every call, the warning's own call's included


def _data_dependent():
    def g(x):
        return x[x > 0] * 2
    return g


def _traces_for(n_calls, **settings):
    jf = torchneuron_jit.jit(_data_dependent(), cache_limit=64)
    before = torchneuron_jit.stats()
    with config.patch(**settings):
        for n in range(5, 5 + n_calls):
            x = torch.randn(n)
            torch.testing.assert_close(jf(x), x[x > 0] * 2)
    after = torchneuron_jit.stats()
    return jf, after["traces"] - before["traces"], after["calls_backing_off"] - before["calls_backing_off"]


def test_failing_traces_back_off_exponentially():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, traced, backed_off = _traces_for(15, trace_backoff=2, blacklist_after=0)
        # traces at misses 1, 3, 7, 15 (1, 3, 7 untraced between them)
        assert (traced, backed_off) == (4, 11)
        _, traced, backed_off = _traces_for(15, trace_backoff=0, blacklist_after=0)
        assert (traced, backed_off) == (15, 0)


def test_blacklist_runs_the_function_eagerly_for_good():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        jf, traced, _ = _traces_for(10, trace_backoff=0, blacklist_after=3)
    assert traced == 3 and jf.gave_up
    text = [str(m.message) for m in w if "runs eagerly from now on" in str(m.message)]
    assert len(text) == 1 and "3 of its traces failed" in text[0], text


def test_explain_shows_variants_guards_misses_and_decisions():
    def f(x, w):
        b, s, d = x.shape
        return (x @ w).view(b, s, 2, d // 2).softmax(-1)

    jf = torchneuron_jit.jit(f)
    w = torch.randn(8, 8)
    for s in [5, 6, 7, 8, 1]:
        jf(torch.randn(2, s, 8), w)
    text = str(torchneuron_jit.explain(jf))
    assert text.startswith(f"{f.__qualname__} (") and "5 calls, 3 variants" in text, text
    assert "dynamic sizes" in text and "guard sizes: x.size(1) >= 2" in text, text
    assert "guard x: float32 (2, *, 8) row-major" in text, text
    assert "misses by reason:" in text and "x: size[1]" in text, text
    assert "x dim 1 took 2 or more values; dynamic now" in text, text
    assert "nodes lowered" in text, text
    hits = [line for line in text.splitlines() if "hits;" in line]
    assert any(" 2 hits;" in line for line in hits), hits  # 7 and 8 took the dynamic variant
    html = torchneuron_jit.explain(jf)._repr_html_()
    assert "<table>" in html and "x.size(1) &gt;= 2" in html
    with pytest.raises(TypeError, match="not a jitted function"):
        torchneuron_jit.explain(f)


def test_explain_says_a_variant_whose_graph_is_being_built_is_building(monkeypatch):
    """A variant whose build is in flight runs eagerly until it is
    published: explain() said "(eager) ... runs eagerly (no compiled
    graph)", the words of a variant that never compiles."""
    from torchneuron_jit import backend
    release, inner = threading.Event(), backend.compile_inference

    def held(*args, **kwargs):
        release.wait(60)
        return inner(*args, **kwargs)

    monkeypatch.setattr(backend, "compile_inference", held)
    jf = torchneuron_jit.jit(lambda x: torch.relu(x) * 2)
    with config.patch(compile_blocking=False, build_worker="thread"):
        try:
            jf(torch.randn(8))
            text = str(torchneuron_jit.explain(jf))
        finally:
            release.set()
            assert _jit.wait(60)
    assert "variant 0 (building): 0 hits; runs eagerly while its graph is built in the background" in text, text
    assert "(eager)" not in text and "no compiled graph" not in text, text
    text = str(torchneuron_jit.explain(jf))
    assert "variant 0 (compiled)" in text, text


def test_explain_names_the_ops_of_most_nodes_first_and_counts_the_rest():
    """A graph with more kinds of ops through PyTorch than a line names:
    the line says so, and names those of the most nodes."""
    def f(x):
        y = x.cumsum(0) + x.cumsum(1) + x.cumsum(0).cumsum(1)
        z = x.flip(0) + x.cumprod(1) + x.sort(1).values + x.argsort(0) + x.cummin(1).values
        return y + z + x.topk(2, 1).values.sum() + x.cummax(0).values + x.logcumsumexp(1)

    x = torch.randn(6, 5)
    with config.patch(compile_blocking=True):
        jf = torchneuron_jit.jit(f)
        torch.testing.assert_close(jf(x), f(x))
    line = next(line for line in str(torchneuron_jit.explain(jf)).splitlines() if "through PyTorch" in line)
    named = line.split("through PyTorch: ", 1)[1]
    # x.cumsum(0) twice is one node (backend._merge_repeats): 3 cumsum, then sort's 2
    assert named.startswith("aten::cumsum (no lowering, 3), aten::sort (no lowering, 2), "), line
    assert named.count("(no lowering") + named.count("(not fused") == 8 and ", and 1 more op (1 node)" in named, line


class _Scaled(torch.nn.Module):
    def forward(self, x):
        return x * len(STEP) + 1


@pytest.mark.parametrize("what", ["function", "module"])
def test_the_dynamo_door_gets_the_same_words(what):
    """A compiled module's storm counts at its own site too (not at the
    frame of Dynamo's every compiled module runs through) and explain()
    tells it."""
    global STEP

    def f(x):
        return x * len(STEP) + 1

    cf = torch.compile(f if what == "function" else _Scaled(), backend="neuron")
    saved = STEP
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for i in range(6):
                STEP = "a" * (i + 1)
                x = torch.randn(4)
                torch.testing.assert_close(cf(x), x * (i + 1) + 1)
    finally:
        STEP = saved
    words = [str(m.message) for m in w if "under torch.compile" in str(m.message)]
    assert len(words) == 1, words
    assert "global STEP changed 4 times" in words[0] and "pass it as an argument" in words[0], words
    assert "global STEP" in str(torchneuron_jit.explain(cf)), str(torchneuron_jit.explain(cf))


def test_models_compiled_once_each_are_no_storm_of_the_code_they_share():
    """Every torch.compile'd module runs through one frame of Dynamo's
    (wrap_inline's inner, calling the module): five models of five widths,
    one call each, warned that a bias "dim 0 changed 4 times"."""
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(5):
            m = torch.nn.Sequential(torch.nn.Linear(4, 4 + i), torch.nn.ReLU()).eval()
            torch.testing.assert_close(torch.compile(m, backend="neuron")(x), m(x))
    assert not [str(m.message) for m in w if "torchneuron_jit" in str(m.message)]


class _Block(torch.nn.Module):
    """A layer of a user's class with a constant of its own (a name; an int
    Dynamo makes dynamic after one change)."""

    def __init__(self, idx):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
        self.name = "b" * (idx + 1)

    def forward(self, x):
        return torch.relu(self.l(x)) * len(self.name)


def test_instances_of_a_users_class_compiled_once_each_are_no_storm():
    """Six layers of one class, each torch.compile'd once (the per-layer
    recipe): Dynamo's frame is the class's forward, self a different layer
    each time, and its recompiles for self.name were one storm ("self.name
    changed 4 times ... an attribute the code reads is set between calls").
    An attribute of one layer that does change is still one."""
    blocks = [_Block(i).eval() for i in range(6)]
    compiled = [torch.compile(b, backend="neuron") for b in blocks]
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as w, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            for b, c in zip(blocks, compiled):
                torch.testing.assert_close(c(x), b(x))
    assert not [str(m.message) for m in w if "torchneuron_jit" in str(m.message)]
    # the six layers' entries and these, under Dynamo's recompile_limit (8) for the code they share
    with warnings.catch_warnings(record=True) as w, torch.no_grad(), torch._dynamo.config.patch(recompile_limit=64):
        warnings.simplefilter("always")
        for i in range(6):
            blocks[0].name = "c" * (10 + i)
            torch.testing.assert_close(compiled[0](x), blocks[0](x))
    words = [str(m.message) for m in w if "torchneuron_jit" in str(m.message)]
    assert len(words) == 1 and "self.name changed" in words[0], words


class _Breaking(torch.nn.Module):
    """A linear layer, a graph break (print), then a cumsum: two code objects' entries in Dynamo."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
        self.scale = 2.0

    def forward(self, x):
        y = self.l(x).relu() * self.scale
        print(end="")  # a graph break: the rest runs in Dynamo's resume function
        return y.cumsum(0) * 2


def test_explain_of_a_torch_compile_model_shows_dynamos_entries_their_graphs_and_hits():
    """explain() of what torch.compile(backend="neuron") returned: each of
    Dynamo's entries (those after the graph break too) with our graph's
    words, its hits (its plan's runs), Dynamo's guards in our words, and
    the recompiles by reason."""
    torch._dynamo.reset()
    model = _Breaking().eval()
    eager = _Breaking().eval()
    eager.load_state_dict(model.state_dict())
    cm = torch.compile(model, backend="neuron")
    for b in (2, 3, 5, 6):
        x = torch.randn(b, 4)
        torch.testing.assert_close(cm(x), eager(x))
    model.scale = eager.scale = 3.0
    x = torch.randn(6, 4)
    torch.testing.assert_close(cm(x), eager(x))
    e = torchneuron_jit.explain(cm)
    text = str(e)
    assert text.startswith(f"{_Breaking.forward.__qualname__} (") and "under torch.compile(backend='neuron')" in text, text
    first = [v for v in e.variants if "graph break" not in v["name"]]
    resumed = [v for v in e.variants if "after the graph break at line" in v["name"]]
    assert first and resumed, text
    # every call ran one graph of each part: the hits of each part add up to the calls
    assert sum(v["hits"] for v in first) == 5 and sum(v["hits"] for v in resumed) == 5, text
    assert all(v["kind"].startswith("compiled") for v in e.variants), text
    assert any(v["kind"] == "compiled, dynamic sizes" and "x: float32 (*, 4)" in v["guards"]
               and "sizes: 2 <= x.size(0)" in v["guards"] for v in first), text
    assert "self.scale == 2.0" in first[0]["guards"] and "x: float32 (2, 4)" in first[0]["guards"], text
    assert "2 tensors of modules as traced (parameters, buffers, settings)" in first[0]["guards"], text
    assert all("aten::cumsum (no lowering, 1)" in v["graph"] for v in resumed), text
    assert "misses by reason:" in text and "tensor 'x' dim 0" in text and "self.scale" in text, text
    assert "<table>" in e._repr_html_()


def test_explain_of_a_model_compiled_in_place_shows_dynamos_entries():
    """model.compile(backend="neuron") compiles the module in place: explain(model)
    raised TypeError ("not a jitted function or module") for it."""
    torch._dynamo.reset()

    class _Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).relu() * 2

    net = _Net().eval()
    net.compile(backend="neuron")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 4)
            torch.testing.assert_close(net(x), (net.lin(x).relu() * 2))
    e = torchneuron_jit.explain(net)
    assert "under torch.compile(backend='neuron')" in str(e) and e.variants[0]["hits"] == 2, str(e)


def test_explain_of_a_compiled_torch_nn_module_shows_its_entries_and_no_other_classes():
    """torch.compile(nn.Sequential(...)): Dynamo's entries sit on its
    wrap_inline wrapper's code, which every compiled torch.nn module
    shares; explain said "0 compiled entries" after calls had run."""
    torch._dynamo.reset()
    seq = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    lin = torch.nn.Linear(8, 3).eval()
    cs, cl = torch.compile(seq, backend="neuron"), torch.compile(lin, backend="neuron")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 8)
            torch.testing.assert_close(cs(x), seq(x))
        torch.testing.assert_close(cl(x), lin(x))
    e = torchneuron_jit.explain(cs)
    text = str(e)
    assert "Sequential.forward" in text and ": 1 compiled entry" in text, text
    assert [v["hits"] for v in e.variants] == [2] and e.variants[0]["kind"] == "compiled", text
    e = torchneuron_jit.explain(cl)
    assert [v["hits"] for v in e.variants] == [1], str(e)  # the Linear's own, not the Sequential's


def _shared_decorator(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):  # one code for every forward it wraps (transformers' decorators)
        return fn(self, *args, **kwargs)
    return wrapper


class _DecoratedA(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    @_shared_decorator
    def forward(self, x):
        return self.lin(x).relu()


class _DecoratedB(_DecoratedA):
    @_shared_decorator
    def forward(self, x):
        return self.lin(x) * 2


def test_explain_lists_no_entry_of_another_model_on_a_decorators_shared_code():
    """Dynamo's entries sit on the decorator's wrapper, one code for both
    models' forwards: explain(b) listed a's entries before b ever ran."""
    torch._dynamo.reset()
    a, b = _DecoratedA().eval(), _DecoratedB().eval()
    ca, cb = torch.compile(a, backend="neuron"), torch.compile(b, backend="neuron")
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(ca(x), a(x))
        assert torchneuron_jit.explain(cb).variants == [], str(torchneuron_jit.explain(cb))
        torch.testing.assert_close(cb(x), b(x))
    assert [v["hits"] for v in torchneuron_jit.explain(cb).variants] == [1], str(torchneuron_jit.explain(cb))
    assert [v["hits"] for v in torchneuron_jit.explain(ca).variants] == [1], str(torchneuron_jit.explain(ca))


def test_explain_of_a_torch_compile_function_lists_each_entry_after_two_graph_breaks_once():
    """The function Dynamo resumes in after the second break is reached
    from the function itself and from the one resumed after the first:
    its entries were listed twice."""
    torch._dynamo.reset()

    def f(x):
        y = x * 2
        torch._dynamo.graph_break()
        z = y.relu()
        torch._dynamo.graph_break()
        return z + 1

    c = torch.compile(f, backend="neuron")
    with torch.no_grad():
        for n in [8, 17, 33]:
            x = torch.randn(n)
            torch.testing.assert_close(c(x), f(x))
    e = torchneuron_jit.explain(c)
    names = [v["name"] for v in e.variants]
    assert len(names) == len(set(names)), names
    assert sum("after the graph break" in n for n in names) == 4, names  # two resumes, a static and a dynamic entry


def test_explains_timeline_plot_leaves_the_users_matplotlib_backend_as_it_was(run_python):
    """A notebook's inline backend stays in use after explain() drew its
    timeline: before, _repr_html_ called matplotlib.use("Agg"), so the
    user's next plt.show() drew nothing."""
    pytest.importorskip("matplotlib")
    out = run_python("-c", """if True:
        import sys, matplotlib
        matplotlib.use("svg")  # the user's backend
        import torch, torchneuron_jit
        f = torchneuron_jit.jit(lambda x: x * 2)
        for n in range(3, 9):
            f(torch.randn(n))
        html = torchneuron_jit.explain(f)._repr_html_()
        print("<img" in html, matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "svg", "False"], out.stdout


def test_explain_of_a_torch_compile_function_says_which_graphs_run_eagerly_and_why():
    torch._dynamo.reset()

    def f(x, y):
        return torch.nn.functional.gelu(x @ y) + 1

    cf = torch.compile(f, backend="neuron")
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(cf(x, y), f(x, y))
    with torch.enable_grad():
        xg = x.clone().requires_grad_()
        torch.testing.assert_close(cf(xg, y), f(xg, y))
    e = torchneuron_jit.explain(cf)
    assert [v["kind"] for v in e.variants] == ["compiled", "runs eagerly"], str(e)
    assert e.variants[0]["hits"] == 1 and "nodes lowered" in e.variants[0]["graph"], str(e)
    assert "the graph needs gradients" in e.variants[1]["graph"], str(e)
    assert "x: float32 (3, 4) requires_grad" in e.variants[1]["guards"], str(e)
    with pytest.raises(TypeError, match="not a jitted function"):
        torchneuron_jit.explain(torch.compile)
    with pytest.raises(TypeError, match=r"not a jitted function or module: Linear\(in_features=2"):
        torchneuron_jit.explain(torch.nn.Linear(2, 3))  # the module named, not its forward (None)


@pytest.mark.parametrize("building", [True, False])
def test_misses_of_a_dynamic_dimension_while_its_variant_is_built_warn_nothing(building):
    """Calls that miss while the dynamic variant of their dimension is
    built run eagerly meanwhile: no storm (HF BERT's serving loop warned
    "x dim 1 took 32 values; it is dynamic now" mid-build). The same misses
    with no build in flight still warn."""
    from torchneuron_jit import _manager

    jf = _jit._jit_function_of(torchneuron_jit.jit(lambda x: x + 1))
    jf(torch.randn(2, 3))
    _manager.site(jf).dynamic.add(("x", 1))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(4, 9):
            _manager.miss(jf, f"x: size[1] 3 → {n}", building=building)
    words = storm_warnings(w)
    assert len(words) == (0 if building else 1), words
    assert "x dim 1 took" in str(torchneuron_jit.explain(jf)) and "it is dynamic now" in str(torchneuron_jit.explain(jf))


class _Opaque:
    """An argument jit cannot guard: its state is in slots, not a __dict__
    (a DynamicCache, an object of plain attributes, is guarded by them)."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


def test_an_argument_jit_cannot_guard_is_one_trace_and_one_warning_whatever_the_sizes():
    """A loop passes an object jit cannot guard, whose tensors grow: its
    eager entry takes every call with such a value there, so the loop
    makes one trace and one warning (it traced every step, warned of a
    storm and ran eagerly for good after 4); calls without it compile."""
    def f(x, state=None):
        return x * 2 + (state.t.sum() if state is not None else 0)

    jf = torchneuron_jit.jit(f)
    before = torchneuron_jit.stats()["traces"]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(2, 10):
            x, state = torch.randn(n), _Opaque(torch.randn(n, n))
            torch.testing.assert_close(jf(x, state=state), f(x, state=state))
        for n in (3, 3, 3):
            x = torch.randn(n)
            torch.testing.assert_close(jf(x), f(x))
    words = [str(m.message) for m in w if "torchneuron_jit" in str(m.message)]
    assert len(words) == 1 and "state is a _Opaque" in words[0], words
    assert torchneuron_jit.stats()["traces"] - before == 2, str(torchneuron_jit.explain(jf))
    assert sorted(v["kind"] for v in torchneuron_jit.explain(jf).variants) == ["compiled", "eager"]


def _normalised(x):
    return torch.tanh(x * 3) / x.abs().max().item()


def test_a_value_read_from_a_tensor_that_keeps_changing_runs_eagerly_with_one_warning():
    """x / x.abs().max().item(): each call reads a new value, so each variant
    ran its graph and side-exited on every later call (up to 8 graphs a
    call), evicted and traced again, with no storm warning. Once the value
    has taken as many values as the variants' limit, the function runs
    eagerly, said once with what to do; side exits count as no hits."""
    jf = torchneuron_jit.jit(_normalised)
    before = torchneuron_jit.stats()["traces"]
    with warnings.catch_warnings(record=True) as w, config.patch(jit_evict_after=4):
        warnings.simplefilter("always")
        for _ in range(60):
            x = torch.randn(16)
            torch.testing.assert_close(jf(x), _normalised(x))
    assert torchneuron_jit.stats()["traces"] - before == config.jit_cache_limit
    words = [str(m.message) for m in w if "torchneuron_jit" in str(m.message)]
    assert len(words) == 1, words
    assert "a value read from a tensor (item(), bool(), tolist(), str()) took 8 values in 8 calls" in words[0], words
    assert "runs eagerly from now on" in words[0] and "x.abs().max().item()" in words[0], words
    e = torchneuron_jit.explain(jf)
    assert "runs eagerly for good" in e.head and all(v["hits"] == 0 for v in e.variants), str(e)


def test_a_value_read_from_a_tensor_with_a_few_values_keeps_its_variants():
    """A flag read with item() that takes 5 values: a variant each, which
    serve every later call; no warning."""
    def scaled(x, mode):
        return x * 2 if mode.item() == 0 else x + mode.item()

    jf = torchneuron_jit.jit(scaled)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(40):
            x, mode = torch.randn(8), torch.tensor(i % 5)
            torch.testing.assert_close(jf(x, mode), scaled(x, mode))
    assert not [str(m.message) for m in w if "torchneuron_jit" in str(m.message)]
    e = torchneuron_jit.explain(jf)
    assert len(e.variants) == 5 and sum(v["hits"] for v in e.variants) >= 35, str(e)


def test_a_relation_of_sizes_is_named_whole():
    """A relation with parentheses of its own (Longformer's padding) was cut
    at the first " (": explain() said "sizes: Ne(Mod(8 -"."""
    from torchneuron_jit._manager import _subject
    words = "sizes: Ne(Mod(8 - (Mod(s0, 8)), 8), 0) fails (input_ids.size(1) is 15)"
    assert _subject(words) == "sizes: Ne(Mod(8 - (Mod(s0, 8)), 8), 0)"
    assert _subject("sizes: x.size(1) >= 2 fails (x.size(1) is 1)") == "sizes: x.size(1) >= 2"


def _doubled(x):
    return x * 2 + 1


def test_calls_that_run_eagerly_while_a_build_is_in_flight_count_no_recompile(monkeypatch):
    """Back-to-back calls of new sizes while the first variant builds in
    the background run eagerly untraced: each was counted in recompiles
    (a serving loop showed 796 recompiles for 2 traces: a storm that was
    not there; found by a helper's serving probe)."""
    import time

    from torchneuron_jit import backend
    inner = backend.compile_inference

    def slow(*args, **kwargs):
        time.sleep(0.3)
        return inner(*args, **kwargs)

    monkeypatch.setattr(backend, "compile_inference", slow)
    jf = torchneuron_jit.jit(_doubled)
    before = torchneuron_jit.stats()
    with torchneuron_jit.config.patch(compile_blocking=False, build_worker="thread"):
        torch.testing.assert_close(jf(torch.ones(3)), _doubled(torch.ones(3)))
        for n in range(4, 12):  # while it builds: eagerly, untraced
            torch.testing.assert_close(jf(torch.ones(n)), _doubled(torch.ones(n)))
        assert _jit.wait(60)
    after = torchneuron_jit.stats()
    assert after["calls_while_building"] > before["calls_while_building"]
    traces, recompiles = (after[k] - before[k] for k in ("traces", "recompiles"))
    assert recompiles <= max(traces - 1, 0), (traces, recompiles)


def test_explain_of_a_compiled_partial_and_a_compiled_module_shows_each_its_own_entries():
    """torch.compile runs a module of torch.nn's own class and a
    functools.partial through one wrapper code (Dynamo's wrap_inline):
    explain() of the partial listed the Linear's graph, named the wrapper,
    and each listed a "miss" that was the other's first compile."""
    torch._dynamo.reset()  # an entry of another test's Linear would serve this one (Dynamo guards its class)
    lin = torch.nn.Linear(8, 8).eval()

    def addf(x, other):
        return x + other

    cm = torch.compile(lin, backend="neuron")
    cp = torch.compile(functools.partial(addf, other=1.0), backend="neuron")
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(cm(x), lin(x))
            torch.testing.assert_close(cp(x), x + 1.0)
    ep, em = str(torchneuron_jit.explain(cp)), str(torchneuron_jit.explain(cm))
    assert ep.startswith("test_explain_of_a_compiled_partial_") and ".<locals>.addf (" in ep.splitlines()[0]
    assert "aten::linear" not in ep and "aten::add" in ep, ep
    assert em.startswith("Linear.forward (") and "1 compiled entry" in em and "aten::add" not in em, em
    assert "misses" not in ep and "misses" not in em, (ep, em)


def test_a_relation_of_sizes_that_keeps_failing_is_named_in_its_storm_words():
    """A storm of misses on one relation of sizes (a sliding window's
    `seq >= 15`, each side its own variant) names the relation, not only
    the values that failed it (the words were "a relation of sizes keeps
    failing (x.size(1) is 12, ...)": which relation, the user could not
    tell)."""
    from torchneuron_jit import _manager

    jf = _jit._jit_function_of(torchneuron_jit.jit(lambda x: x + 1))
    jf(torch.randn(2, 3))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(4, 9):
            _manager.miss(jf, f"sizes: x.size(1) >= 15 fails (x.size(1) is {n})")
    words = [str(m.message) for m in w if "keeps failing" in str(m.message)]
    assert len(words) == 1, words
    assert "the relation of sizes x.size(1) >= 15 keeps failing (x.size(1) is 4, x.size(1) is 5" in words[0], words
