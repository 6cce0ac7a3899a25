"""jit's trace records: a fresh process with a warm cache runs without
tracing; a record applies only while its guards and code hold."""
import collections
import dataclasses
import functools
import json
import os
import sys
import textwrap

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import _jit, _records, cache, config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks import models  # noqa: E402

COUNTERS = ("traces", "traces_loaded", "trace_records_stored", "graphs_lowered", "graphs_compiled", "plans_loaded")


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def counters():
    st = torchneuron_jit.stats()
    return {k: st[k] for k in COUNTERS}


def delta(before):
    now = counters()
    return {k: now[k] - before[k] for k in COUNTERS}


# -- in one process: another instance finds the first one's record ------------------------

@pytest.mark.parametrize("name", ["mlp", "pointwise", "encoder2", "gpt_block", "cnn"])
def test_second_instance_loads_the_record_with_its_own_weights(name):
    """A record holds no identities: a second instance of the model (other
    weights) takes the first one's record, with its own parameters."""
    torch.backends.mha.set_fastpath_enabled(False)
    build, make_input, shapes, _ = models.SUITE[name]
    x = make_input(shapes[0])
    torch.manual_seed(0)
    a = build().eval()
    torch.manual_seed(1)
    b = build().eval()
    want_a, want_b = a(x), b(x)
    before = counters()
    torchneuron_jit.jit(a)
    torchneuron_jit.jit(b)
    torch.testing.assert_close(a(x), want_a, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b(x), want_b, rtol=1e-4, atol=1e-4)
    d = delta(before)
    assert (d["traces"], d["traces_loaded"], d["trace_records_stored"]) == (1, 1, 1), d
    torch.testing.assert_close(b(x), want_b, rtol=1e-4, atol=1e-4)  # a hit now


def _twin(x):
    return (x * 3).tanh() + torch.tensor([0.5, -0.5, 1.0])


def _twice(make, call):
    """call(make()) twice (two JitFunctions of one program): both results
    and the counters' change."""
    before = counters()
    first, second = call(make()), call(make())
    return first, second, delta(before)


def _two_jitted_twins():
    x = torch.randn(3)
    first, second, d = _twice(lambda: torchneuron_jit.jit(_twin), lambda f: f(x))
    torch.testing.assert_close(first, _twin(x))
    torch.testing.assert_close(second, _twin(x))
    return d


def _with_defaults(fn):
    """A decorator as Hugging Face wraps its models' forward in
    (merge_with_config_defaults): the class's forward is the wrapper, and
    the function the trace runs is found through __wrapped__ only."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return wrapper


class _Decorated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    @_with_defaults
    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


def test_a_decorated_forward_is_stored_and_loaded():
    torch.manual_seed(0)
    a = _Decorated().eval()
    torch.manual_seed(1)
    b = _Decorated().eval()
    x = torch.randn(3, 8)
    want_a, want_b = a(x), b(x)
    before = counters()
    torchneuron_jit.jit(a)
    torchneuron_jit.jit(b)
    torch.testing.assert_close(a(x), want_a)
    torch.testing.assert_close(b(x), want_b)
    d = delta(before)
    assert (d["traces"], d["traces_loaded"], d["trace_records_stored"]) == (1, 1, 1), d


def test_records_off_stores_and_loads_nothing():
    config.jit_trace_records = False
    d = _two_jitted_twins()
    assert d["traces"] == 2 and d["traces_loaded"] == 0 and d["trace_records_stored"] == 0


def test_a_captured_literal_is_stored_by_value():
    """torch.tensor([...]) in the traced code is a constant the record
    stores; another JitFunction of the same function loads it."""
    d = _two_jitted_twins()
    assert d["traces"] == 1 and d["traces_loaded"] == 1, d


def test_local_functions_of_one_enclosing_function_do_not_share_records():
    """Two closures defined in one function are found by the name of the
    function around them; the key tells them apart by their own code."""
    def make():
        def inner(x):
            return x.exp()

        def outer(x):
            return x * 2
        return torchneuron_jit.jit(inner), torchneuron_jit.jit(outer)

    inner, outer = make()
    x = torch.randn(5)
    torch.testing.assert_close(outer(x), x * 2)
    torch.testing.assert_close(inner(x), x.exp())


class _ItemSettings(dict):  # its items are no attributes
    pass


class _Slotted:
    __slots__ = ("scale", "__dict__")  # a __dict__ too, empty

    def __init__(self, scale):
        self.scale = scale


class _Scaled(torch.nn.Module):
    """Scales by what one attribute holds, outside any __dict__."""

    def __init__(self, kind, scale):
        super().__init__()
        self.kind = kind
        self.held = {"partial": lambda: functools.partial(torch.nn.functional.leaky_relu, negative_slope=scale),
                     "dict": lambda: _ItemSettings(scale=scale), "slots": lambda: _Slotted(scale)}[kind]()

    def forward(self, x):
        if self.kind == "partial":
            return self.held(x)
        return x * (self.held["scale"] if self.kind == "dict" else self.held.scale)


@pytest.mark.parametrize("kind", ["partial", "dict", "slots"])
def test_a_second_instance_whose_attribute_keeps_its_state_outside_its_dict_gets_its_own_answer(kind):
    """A partial's arguments, a dict subclass's items and a slot's value are
    not in the object's __dict__: the records described each by its type
    and an empty __dict__, so a second instance took the first one's record
    and answered with the first one's slope or scale."""
    a, b = _Scaled(kind, 0.1), _Scaled(kind, 0.5)
    x = torch.randn(8)
    want_a, want_b = a(x), b(x)
    torchneuron_jit.jit(a)
    torchneuron_jit.jit(b)
    torch.testing.assert_close(a(x), want_a)
    torch.testing.assert_close(b(x), want_b)



FLAG = 2.0


def _reads_flag(x):
    return x * FLAG


def test_a_record_whose_global_differs_says_so_and_traces(capsys):
    global FLAG
    x = torch.randn(4)
    torch.testing.assert_close(torchneuron_jit.jit(_reads_flag)(x), x * 2.0)
    config.log = "cache"
    FLAG = 3.0
    try:
        before = counters()
        torch.testing.assert_close(torchneuron_jit.jit(_reads_flag)(x), x * 3.0)
        assert delta(before)["traces"] == 1
    finally:
        FLAG = 2.0
    assert "does not apply: global FLAG: 2.0 → 3.0" in capsys.readouterr().err


def _reads_builtin_abs(x):
    return x * abs(-3)


def test_a_record_read_where_a_global_shadows_its_builtin_says_so_and_traces(capsys):
    """A record guards the builtins its code read as absent from the
    module's globals: loaded where a global of that name exists, it does
    not apply (and the new trace gives the global's answer)."""
    x = torch.randn(4)
    torch.testing.assert_close(torchneuron_jit.jit(_reads_builtin_abs)(x), x * 3)
    config.log = "cache"
    globals()["abs"] = lambda v: 5
    try:
        before = counters()
        torch.testing.assert_close(torchneuron_jit.jit(_reads_builtin_abs)(x), x * 5)
        assert delta(before)["traces"] == 1
    finally:
        del globals()["abs"]
    assert "does not apply: global abs: defined, where the builtin abs was read" in capsys.readouterr().err


class _Opaque:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale


def test_an_unguardable_closure_object_runs_eagerly_and_stays_out_of_the_cache():
    """An object without a __dict__ (slots) in a closure: its attributes
    cannot be guarded, so the variant runs eagerly (a change to obj.scale
    is seen on every call) and no record is stored."""
    def make(obj):
        def f(x):
            return x * obj.scale
        return f

    before = counters()
    x = torch.randn(4)
    obj = _Opaque(2.0)
    f = torchneuron_jit.jit(make(obj))
    with pytest.warns(RuntimeWarning, match="runs eagerly: closure obj is a _Opaque, whose contents jit cannot guard"):
        torch.testing.assert_close(f(x), x * 2.0)
    obj.scale = 3.0
    torch.testing.assert_close(f(x), x * 3.0)
    torch.testing.assert_close(torchneuron_jit.jit(make(_Opaque(4.0)))(x), x * 4.0)
    d = delta(before)
    assert d["trace_records_stored"] == 0 and d["traces_loaded"] == 0


def test_a_record_that_cannot_be_rebuilt_warns_and_traces():
    f = torchneuron_jit.jit(_twin)
    x = torch.randn(3)
    f(x)
    trace = _jit._Trace(_twin, (x,), [])
    trace.guard_arguments()
    key = _records.trace_key(_twin, trace)
    variants = _records.read(key)
    assert len(variants) == 1
    call = next(node for node in variants[0]["graph"] if node[0] == "c")
    call[1] = "aten::no_such_op.default"
    del variants[0]["compiled"]  # a record without a plan: its graph is compiled (the plan's own test is below)
    variants[0]["id"] = "changed"
    assert cache.put(cache.TRACES, key, json.dumps({"format": _records.FORMAT, "variants": variants}).encode())
    before = counters()
    with pytest.warns(RuntimeWarning, match="rebuilding a trace record of _twin .* failed, tracing instead"):
        torch.testing.assert_close(torchneuron_jit.jit(_twin)(x), _twin(x))
    assert delta(before)["traces"] == 1


def _stored(fn, x):
    """(key, variants) of fn's trace records for a call on x."""
    trace = _jit._Trace(fn, (x,), [])
    trace.guard_arguments()
    key = _records.trace_key(fn, trace)
    return key, _records.read(key)


def _concat_scan(x):
    """Kernels writing into a cat, an arange the back end folds into a
    tensor constant, keyword arguments, an integer index, a reduction."""
    idx = torch.tensor([2, 0, 1])
    y = torch.cat([torch.sigmoid(x) * 2.0, x.tanh() + 1.0], dim=1)
    pos = torch.arange(y.shape[1], dtype=torch.float32)
    z = torch.nn.functional.layer_norm(y[idx] + pos, (y.shape[1],))
    return z.sum(dim=1, keepdim=True), z.amax(dim=-1)


def test_a_warm_start_runs_the_stored_plan():
    """A record keeps the compiled plan: another JitFunction runs it with
    nothing imported, fused, lowered or compiled (graphs_compiled and
    kernels_compiled do not move), every kind of constant made again, and
    the same answers."""
    x = torch.randn(3, 8)
    want = _concat_scan(x)
    torch.testing.assert_close(torchneuron_jit.jit(_concat_scan)(x), want)
    _, variants = _stored(_concat_scan, x)
    form = variants[0]["compiled"]
    tags = {next(iter(c)) for c in form["consts"] if isinstance(c, dict)}
    assert {"kernel", "op", "fn", "tensor"} <= tags, tags
    st0 = torchneuron_jit.stats()
    for _ in range(2):
        torch.testing.assert_close(torchneuron_jit.jit(_concat_scan)(x), want)
    st = torchneuron_jit.stats()
    assert st["plans_loaded"] - st0["plans_loaded"] == 2 and st["traces"] == st0["traces"]
    assert st["graphs_compiled"] == st0["graphs_compiled"], "the stored plan was not used"
    # its kernels come as object code: relocated, not compiled
    kernels = sum(1 for c in form["consts"] if isinstance(c, dict) and "kernel" in c)
    assert st["kernels_loaded"] - st0["kernels_loaded"] == 2 * kernels and st["kernels_compiled"] == st0["kernels_compiled"]
    # the stored report counts what the plan runs through PyTorch, as compiling it did
    assert st["fallback_nodes"] - st0["fallback_nodes"] == 2 * sum(n for _, _, n in form["report"]["ops"])


def test_a_stored_plan_that_cannot_be_made_warns_and_compiles_the_graph():
    x = torch.randn(3, 8)
    torchneuron_jit.jit(_concat_scan)(x)
    key, variants = _stored(_concat_scan, x)
    intact = json.loads(json.dumps(variants))
    op = next(c for c in variants[0]["compiled"]["consts"] if isinstance(c, dict) and "op" in c)
    op["op"] = "aten::no_such_op.default"
    variants[0]["id"] = "changed"
    assert cache.put(cache.TRACES, key, json.dumps({"format": _records.FORMAT, "variants": variants}).encode())
    st0 = torchneuron_jit.stats()
    with pytest.warns(RuntimeWarning, match="a stored compiled plan could not be loaded, compiling its graph"):
        torch.testing.assert_close(torchneuron_jit.jit(_concat_scan)(x), _concat_scan(x))
    st = torchneuron_jit.stats()
    assert st["traces"] == st0["traces"] and st["plans_loaded"] == st0["plans_loaded"]
    assert st["graphs_compiled"] == st0["graphs_compiled"] + 1
    # damaged bytes: the binary form's own check refuses them
    variants = intact
    variants[0]["compiled"]["plan"] = variants[0]["compiled"]["plan"][:-8]
    variants[0]["id"] = "changed again"
    assert cache.put(cache.TRACES, key, json.dumps({"format": _records.FORMAT, "variants": variants}).encode())
    with pytest.warns(RuntimeWarning, match=r"could not be loaded, compiling its graph \(ValueError: plan: trunc"):
        torch.testing.assert_close(torchneuron_jit.jit(_concat_scan)(x), _concat_scan(x))


def test_an_unreadable_record_is_a_miss():
    f = torchneuron_jit.jit(_twin)
    x = torch.randn(3)
    trace = _jit._Trace(_twin, (x,), [])
    trace.guard_arguments()
    assert cache.put(cache.TRACES, _records.trace_key(_twin, trace), b"{not json")
    before = counters()
    torch.testing.assert_close(f(x), _twin(x))
    assert delta(before)["traces"] == 1


_Pair = collections.namedtuple("_Pair", "scaled total")


def _structured(x, *, scale=2.0):
    return {"pair": _Pair(x * scale, x.sum()), "rest": [x + 1, None, 3]}


def _adds_into(x, y):
    x.add_(y)
    return x * 2


class _Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(x).relu()


def _loaded_once(make, call):
    """_twice, where the second must load the first's record."""
    first, second, d = _twice(make, call)
    assert (d["traces"], d["traces_loaded"], d["trace_records_stored"]) == (1, 1, 1), d
    return first, second


def test_records_keep_keywords_result_structures_and_write_backs():
    x = torch.randn(3, 4)
    _, got = _loaded_once(lambda: torchneuron_jit.jit(_structured), lambda f: f(x, scale=3.0))
    assert type(got["pair"]) is _Pair and got["rest"][1:] == [None, 3]  # a namedtuple (its generated __new__ ran)
    torch.testing.assert_close(got["pair"].scaled, x * 3.0)
    torch.testing.assert_close(got["rest"][0], x + 1)

    xs, y = [torch.randn(3, 4) for _ in range(2)], torch.randn(3, 4)
    want = [t + y for t in xs]
    targets = iter(xs)
    _, got = _loaded_once(lambda: torchneuron_jit.jit(_adds_into), lambda f: f(next(targets), y))
    torch.testing.assert_close(xs[1], want[1])  # the loaded entry wrote back into its argument
    torch.testing.assert_close(got, want[1] * 2)

    torch.manual_seed(0)
    a, b, ref = _Norm().train(), _Norm().train(), _Norm().train()
    ref.load_state_dict(b.state_dict())
    x = torch.randn(8, 4)
    want = ref(x)
    modules = iter([a, b])
    _, got = _loaded_once(lambda: torchneuron_jit.jit(next(modules)), lambda m: m(x))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(b.bn.running_mean, ref.bn.running_mean)  # buffers updated as in eager
    assert int(b.bn.num_batches_tracked) == 1


@dataclasses.dataclass
class _Settings:
    scale: float = 2.0


def _with_settings(x):
    return x * _Settings().scale


def test_a_dataclass_constructed_in_the_traced_code():
    """A dataclass's generated __init__ is found through its class, and
    checked by hash like any method."""
    x = torch.randn(3)
    first, second = _loaded_once(lambda: torchneuron_jit.jit(_with_settings), lambda f: f(x))
    torch.testing.assert_close(second, x * 2.0)


# -- fresh processes --------------------------------------------------------------------

PROGRAM = textwrap.dedent('''
    import json, os, sys
    import torch
    import torchneuron_jit

    SCALE = float(os.environ.get("SCALE", "2.0"))


    def act(y, floor=0.0):
        return torch.relu(y - floor) + floor


    class Gate(torch.nn.Module):
        def forward(self, y):
            return y * torch.sigmoid(y)


    class Block(torch.nn.Module):
        def __init__(self, eps):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)
            self.norm = torch.nn.LayerNorm(16, eps=eps)
            self.register_buffer("shift", torch.linspace(-1, 1, 16))
            self.gate = Gate()

        def forward(self, x):
            y = self.norm(self.lin(x)) * SCALE + self.shift
            return act(self.gate(y)) + torch.tensor(0.5)


    @torchneuron_jit.jit
    def branch(x):
        if x.sum() > 0:
            return x * 2
        return x - 100


    def main():
        torch.manual_seed(int(os.environ.get("SEED", "0")))
        m = Block(float(os.environ.get("EPS", "1e-5"))).eval()
        x = torch.randn(int(os.environ.get("BATCH", "4")), 16)
        with torch.no_grad():
            want = m(x)
            torchneuron_jit.jit(m)
            got, again = m(x), m(x)
            pos, neg = torch.ones(3), -torch.ones(3)
            branches = [branch(pos), branch(neg), branch(pos)]
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(again, want)
        for out, w in zip(branches, [pos * 2, neg - 100, pos * 2]):
            torch.testing.assert_close(out, w)
        st = torchneuron_jit.stats()
        print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))


    main()
''')


@pytest.fixture
def program(tmp_path, run_python):
    """program(env=None, source=PROGRAM) -> the counters a fresh process
    running source (a model, and a function with a data-dependent branch)
    reports; it checks its own results against eager."""
    path = tmp_path / "prog.py"

    def run(env=None, source=PROGRAM):
        path.write_text(source)
        r = run_python(str(path), ",".join(COUNTERS), env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    return run


_PRINTS = """
import torch, torchneuron_jit
@torchneuron_jit.jit
def p(x):
    y = x * 2
    print("debug", tuple(y.shape))
    return y + 1
with torch.no_grad():
    for _ in range(2):
        torch.testing.assert_close(p(torch.ones(3)), torch.full((3,), 3.0))
print("loaded", torchneuron_jit.stats()["traces_loaded"])
"""


def test_a_loaded_records_skipped_print_is_named_at_the_file_that_runs(run_python, tmp_path):
    """A notebook's cell is another file in each kernel (ipykernel_<pid>/...):
    the warning that a compiled call skips a print named the file of the
    process that stored the record (found by a helper's notebook probe)."""
    for run, name in enumerate(("cell_a.py", "cell_b.py")):
        (tmp_path / name).write_text(_PRINTS)
        r = run_python("-W", "always", name)
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"loaded {run}" in r.stdout, r.stdout
        assert f"print call at {tmp_path / name}:" in r.stderr, r.stderr[-2000:]


def test_fresh_process_with_a_warm_cache_does_not_trace(program):
    cold = program()
    assert cold["traces"] == 3 and cold["trace_records_stored"] == 3, cold  # the model, both branches
    assert cold["graphs_compiled"] == 3 and cold["plans_loaded"] == 0, cold
    warm = program()
    # each record's plan runs as stored: no graph imported, fused or lowered
    assert warm == {"traces": 0, "traces_loaded": 3, "trace_records_stored": 0, "graphs_lowered": 0,
                    "graphs_compiled": 0, "plans_loaded": 3}, warm
    other_weights = program(env={"SEED": "7"})  # parameters are inputs, not part of the record
    assert other_weights["traces"] == 0, other_weights


def test_what_the_records_depend_on_sends_a_fresh_process_tracing(program):
    program()
    assert program(env={"SCALE": "3.0"})["traces"] == 1  # a global the model reads
    changed = PROGRAM.replace("return torch.relu(y - floor) + floor", "return torch.sigmoid(y - floor) + floor")
    assert program(source=changed)["traces"] == 1  # a function the model calls changed
    assert program()["traces"] == 0  # each variant keeps its record


GENERATE = textwrap.dedent('''
    import json, sys
    import torch, transformers
    import torchneuron_jit

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=500, pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 500, (1, 9))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=8, do_sample=False)
        torchneuron_jit.jit(model)
        got = model.generate(ids, max_new_tokens=8, do_sample=False)
        # a loop of one's own: DynamicCache() appends its layers in the first call
        cache, x = transformers.DynamicCache(), ids
        for _ in range(3):
            x = model(x, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
    assert torch.equal(got, want)
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


OWN_CACHE = textwrap.dedent('''
    import copy, json, sys
    import torch, transformers
    import torchneuron_jit

    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2,
                                                                vocab_size=100)).eval()
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(num_layers=2, d_model=64, d_ff=128,
                                                                       num_heads=2, d_kv=32, vocab_size=100)).eval()
    with torch.no_grad():
        for model in (gpt2, t5):
            eager = copy.deepcopy(model)
            torchneuron_jit.jit(model)
            for n in (5, 7):  # a variant per size, then one dynamic
                ids = torch.randint(0, 100, (2, n))
                kw = {"decoder_input_ids": ids[:, :3]} if model is t5 else {}
                got, again, want = model(ids, **kw), model(ids, **kw), eager(ids, **kw)
                torch.testing.assert_close(got.logits, want.logits)
                # the cache each call returns is its own, and decodes on as eager's does
                assert type(got.past_key_values) is type(want.past_key_values)
                nxt = torch.randint(0, 100, (2, 1))
                for out in (got, again):
                    kw = {"decoder_input_ids": nxt, "encoder_outputs": (out.encoder_last_hidden_state,)} \
                        if model is t5 else {}
                    step = eager(nxt if model is gpt2 else ids, past_key_values=out.past_key_values, **kw)
                    ref = eager(nxt if model is gpt2 else ids, past_key_values=want.past_key_values, **kw) \
                        if out is got else ref
                    torch.testing.assert_close(step.logits, ref.logits)
    st = torchneuron_jit.stats()
    assert st["eager_reruns"] == 0 and st["eager_fallbacks"] == 0, st
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_a_model_returning_the_cache_it_made_loads_in_a_fresh_process(program):
    """A causal LM in its default config (use_cache=True) returns the
    DynamicCache its call made, and an encoder-decoder its
    EncoderDecoderCache: "the result holds a DynamicCache" stored no
    record, and every new process traced again. The result's objects are
    described by their classes and attributes."""
    pytest.importorskip("transformers")
    cold = program(source=OWN_CACHE)
    assert cold["traces"] >= 4 and cold["trace_records_stored"] == cold["traces"], cold
    warm = program(source=OWN_CACHE)
    assert warm["traces"] == 0 and warm["traces_loaded"] == cold["traces"], warm


def test_a_result_object_a_record_cannot_describe_is_unportable():
    """Objects whose state is not their __dict__ alone, or one object at two
    places of the result, are refused, not described wrong."""
    class Slotted:
        __slots__ = ("t",)

    class Reduces:
        def __reduce__(self):
            return (Reduces, ())

    for value in (Slotted(), Reduces(), collections.OrderedDict(a=1)):
        with pytest.raises(_records.Unportable):
            _records.encode_template(value)
    shared = [None]
    with pytest.raises(_records.Unportable, match="twice"):
        _records.encode_template({"a": shared, "b": shared})
    desc = _records.encode_template({"a": [None, (1, 2.5)], "d": torch.device("cpu"), "t": torch.float16})
    assert _records.decode_template(json.loads(json.dumps(desc))) == \
        {"a": [None, (1, 2.5)], "d": torch.device("cpu"), "t": torch.float16}


AT_THE_LIMIT = textwrap.dedent('''
    import json, sys
    import torch
    import torchneuron_jit

    torchneuron_jit.config.jit_evict_after = 2

    @torchneuron_jit.jit(cache_limit=2)
    def f(x):
        return (x * 2 + 1).relu()

    with torch.no_grad():
        for shape in ((4,), (4, 4), (4, 4, 4), (2, 3, 4, 5)):  # a rank each: the last two evict a cold one
            for _ in range(4):
                x = torch.randn(shape)
                torch.testing.assert_close(f(x), (x * 2 + 1).relu())
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_a_function_at_its_limit_loads_the_record_of_a_call_that_evicts(program):
    """At its limit of variants, a miss that a variant gone cold makes room
    for traced, and stored its record again, in every new process: records
    were looked up only below the limit. A record for the call takes the
    cold one's place."""
    cold = program(source=AT_THE_LIMIT)
    assert cold["traces"] == 4 and cold["trace_records_stored"] == 4, cold
    warm = program(source=AT_THE_LIMIT)
    assert warm["traces"] == 0 and warm["traces_loaded"] == 4 and warm["trace_records_stored"] == 0, warm


LAST_TOKEN = textwrap.dedent('''
    import json, sys
    import torch
    import torchneuron_jit

    def step(last, table):  # a view of the argument: the graph's, over the row-major copy
        return table[last.reshape(-1)].sum(-1) * 2 + last.reshape(-1).float()

    f = torchneuron_jit.jit(step)
    torch.manual_seed(0)
    table, ids = torch.randn(100, 16), torch.randint(0, 100, (2, 5))
    with torch.no_grad():
        for _ in range(8):
            torch.testing.assert_close(f(ids[:, -2:], table), step(ids[:, -2:], table))
            ids = torch.cat([ids, torch.randint(0, 100, (2, 1))], 1)
    st = torchneuron_jit.stats()
    assert st["eager_reruns"] == 0, st
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_a_variant_that_copies_an_argument_dense_loads_in_a_fresh_process(program):
    """ids[:, -2:] of growing ids: the variant that takes any strides (and
    copies them row-major, as its graph's view needs) is a record; a fresh
    process runs it on every step without tracing or rerunning eagerly."""
    cold = program(source=LAST_TOKEN)
    assert cold["traces"] == 2 and cold["trace_records_stored"] == 2, cold
    warm = program(source=LAST_TOKEN)
    assert warm["traces"] == 0 and warm["traces_loaded"] == 2, warm


ROPE = textwrap.dedent('''
    import json, sys
    import torch
    import torchneuron_jit

    def rope(x, cos, sin):  # transposed heads and rotate_half's cat, in kernels of the dynamic variant
        b, s, _ = x.shape
        q = x.view(b, s, 4, 16).transpose(1, 2)
        return q * cos + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * sin

    f = torchneuron_jit.jit(rope)
    torch.manual_seed(0)
    with torch.no_grad():
        for b, s in [(2, 5), (3, 7), (4, 9), (2, 11)]:
            x, cos, sin = torch.randn(b, s, 64), torch.randn(1, 1, s, 16), torch.randn(1, 1, s, 16)
            got, want = f(x, cos, sin), rope(x, cos, sin)
            torch.testing.assert_close(got, want)
            assert got.stride() == want.stride(), (got.stride(), want.stride())
    st = torchneuron_jit.stats()
    assert st["eager_reruns"] == 0 and st["eager_fallbacks"] == 0, st
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_a_dynamic_variant_writing_into_a_cat_loads_in_a_fresh_process(program):
    """The dynamic variant's plan allocates the cat its kernels write into
    at sizes read off its input: a record a fresh process runs as stored."""
    cold = program(source=ROPE)
    assert cold["traces"] == 2 and cold["trace_records_stored"] == 2, cold
    warm = program(source=ROPE)
    assert warm["traces"] == 0 and warm["traces_loaded"] == 2 and warm["plans_loaded"] == 2, warm


def test_a_generation_loops_variants_load_in_a_fresh_process(program):
    """generate() passes a DynamicCache (guarded by its attributes): its
    prefill, first step and dynamic variant are records a fresh process
    loads, and so is the prefill of a loop whose DynamicCache() appends its
    layers. generate() notes a hash of the model's GenerationConfig on it
    (_original_object_hash, salted per process), which the records
    describe as any int: with its value no other process matched them."""
    pytest.importorskip("transformers")
    cold = program(source=GENERATE)
    assert cold["traces"] >= 4 and cold["trace_records_stored"] == cold["traces"], cold
    warm = program(source=GENERATE)
    assert warm["traces"] == 0 and warm["traces_loaded"] == cold["traces"], warm


EXPERTS = textwrap.dedent('''
    import json, sys, warnings
    import torch
    import torchneuron_jit

    def experts(x, router, w):  # transformers' MoE experts: tokens sorted by expert, one grouped_mm
        idx = (x @ router).topk(2, dim=-1).indices.reshape(-1)
        order = idx.argsort()
        tokens = x.repeat_interleave(2, dim=0)[order]
        offs = torch.histc(idx.float(), bins=4, min=0, max=3).cumsum(0).to(torch.int32)
        return torch.nn.functional.grouped_mm(tokens, w, offs=offs).relu() * 2

    f = torchneuron_jit.jit(experts)
    torch.manual_seed(0)
    router, w = torch.randn(16, 4), torch.randn(4, 16, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (6, 9, 13, 20):
            x = torch.randn(n, 16)
            torch.testing.assert_close(f(x, router, w), experts(x, router, w))
    assert not [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)]
    st = torchneuron_jit.stats()
    assert st["eager_reruns"] == 0 and st["eager_fallbacks"] == 0, st
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


@pytest.mark.skipif(not hasattr(torch.nn.functional, "grouped_mm"), reason="this torch has no grouped_mm")
def test_grouped_mm_in_float32_gets_a_dynamic_variant_a_fresh_process_loads(program):
    """grouped_mm in float32 (Mixtral's and Qwen2-MoE's experts): its meta
    kernel wants bfloat16, so the symbolic trace failed and every token
    count was a static variant up to the limit. torchneuron::grouped_mm
    runs the CPU kernel with a fake kernel that takes float32: the second
    count makes the variant dynamic, and a fresh process resolves the op."""
    cold = program(source=EXPERTS)
    assert cold["traces"] == 2 and cold["trace_records_stored"] == 2, cold
    warm = program(source=EXPERTS)
    assert warm["traces"] == 0 and warm["traces_loaded"] == 2 and warm["plans_loaded"] == 2, warm


RECURRENT = textwrap.dedent('''
    import json, sys, warnings
    import torch
    import torchneuron_jit

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(6, 8, num_layers=2, batch_first=True, bidirectional=True)
            self.lstm = torch.nn.LSTM(16, 8, proj_size=4)
            self.head = torch.nn.Linear(4, 3)

        def forward(self, x):
            y, _ = self.gru(x)
            z, (h, c) = self.lstm(y.transpose(0, 1))
            return self.head(z).log_softmax(-1), h, c

    torch.manual_seed(0)
    m = Tagger().eval()
    f = torchneuron_jit.jit(Tagger().eval())
    f.load_state_dict(m.state_dict())
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in (5, 9, 12):
            x = torch.randn(2, t, 6)
            torch.testing.assert_close(f(x), m(x))
    assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_recurrent_layers_load_in_a_fresh_process(program):
    """nn.RNNBase holds weak references to its weights (_flat_weight_refs):
    a record could not describe them, and a fresh process traced every
    GRU and LSTM model again. They are described by what they refer to."""
    cold = program(source=RECURRENT)
    assert cold["traces"] == 2 and cold["trace_records_stored"] == 2, cold
    warm = program(source=RECURRENT)
    assert warm["traces"] == 0 and warm["traces_loaded"] == 2 and warm["plans_loaded"] == 2, warm


SCALED = textwrap.dedent('''
    import json, sys
    import torch
    import torch.nn.functional as F
    import torchneuron_jit

    @torchneuron_jit.jit
    def down(x):
        return F.interpolate(x, scale_factor=0.5, mode="bilinear") * 2

    with torch.no_grad():
        for s in (16, 21, 30):
            x = torch.randn(1, 3, s, s)
            torch.testing.assert_close(down(x), F.interpolate(x, scale_factor=0.5, mode="bilinear") * 2)
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_a_size_at_a_scale_factor_loads_in_a_fresh_process(program):
    """The dynamic variant of F.interpolate at a scale factor below 1 calls
    torch.sym_float in its graph, which a record could not name."""
    cold = program(source=SCALED)
    assert cold["traces"] == 2 and cold["trace_records_stored"] == 2, cold
    warm = program(source=SCALED)
    assert warm["traces"] == 0 and warm["traces_loaded"] == 2, warm


WRAPPED = textwrap.dedent('''
    import json, os, sys
    import torch
    import torchneuron_jit

    def _two(self):
        return 2.0

    def _five(self):
        return 5.0

    SECOND = os.environ.get("SECOND") == "1"

    class Scaled(torch.nn.Module):  # what the class's dict holds differs in the second run
        scale = property(_five if SECOND else _two)

        def forward(self, x):
            return x * self.scale

    m = Scaled()
    x = torch.randn(4)
    want = m(x)
    torchneuron_jit.jit(m)
    with torch.no_grad():
        torch.testing.assert_close(m(x), want)
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_a_property_of_another_function_sends_a_fresh_process_tracing(program):
    """A record described a property in a class's dict by its type, and its
    getter's code was checked by the name the getter has, not by the
    property holding it: a run whose class built it of another function
    answered with the first run's."""
    assert program(source=WRAPPED)["trace_records_stored"] == 1
    second = program(source=WRAPPED, env={"SECOND": "1"})
    assert second["traces"] == 1 and second["traces_loaded"] == 0, second
    assert program(source=WRAPPED)["traces"] == 0


GLOBAL_MODULE = textwrap.dedent('''
    import json, os, sys
    import torch
    import torchneuron_jit

    torch.manual_seed(int(os.environ.get("SEED", "0")))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    head = model[2]  # a submodule of another global module

    def predict(x):  # the common serving shape: a function over global modules
        return head(model[:2](x)).softmax(-1)

    jf = torchneuron_jit.jit(predict)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 4)
            torch.testing.assert_close(jf(x), predict(x))
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_a_function_over_global_modules_loads_in_a_fresh_process(program):
    """The globals' snapshot describes a global module by the slot that
    loads it, which comes after the snapshot: the record's check read a
    slot not yet loaded (IndexError), so it never applied, and each process
    traced and stored the record again."""
    cold = program(source=GLOBAL_MODULE)
    assert cold["traces"] == 1 and cold["trace_records_stored"] == 1, cold
    warm = program(source=GLOBAL_MODULE, env={"SEED": "1"})
    assert warm["traces"] == 0 and warm["traces_loaded"] == 1, warm


TORCH_VERSION_HELD = textwrap.dedent('''
    import json, sys, warnings
    import torch
    import torchneuron_jit

    class Card:  # sentence-transformers' model card data keeps {"torch": torch.__version__}
        def __init__(self):
            self.versions = {"torch": torch.__version__}

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.card = torch.nn.Linear(8, 8), Card()

        def forward(self, x):
            if self.card.versions:
                x = x + 1
            return torch.relu(self.lin(x)) * 2

    torch.manual_seed(0)
    model = Model()
    x = torch.randn(4, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        want = model(x)
        torchneuron_jit.jit(model)
        for _ in range(2):
            torch.testing.assert_close(model(x), want)
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_torch_version_a_module_holds_is_guarded_by_value_and_loads_in_a_fresh_process(program):
    """torch.__version__ is a str subclass (TorchVersion): a module's
    attribute holding it (sentence-transformers' model card does) was
    taken for state jit cannot guard, so the call ran eagerly, and a
    record could not describe it."""
    cold = program(source=TORCH_VERSION_HELD)
    assert cold["traces"] == 1 and cold["trace_records_stored"] == 1 and cold["graphs_compiled"] == 1, cold
    warm = program(source=TORCH_VERSION_HELD)
    assert warm["traces"] == 0 and warm["traces_loaded"] == 1, warm


PATCHED = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.nn.functional as F
    import torchneuron_jit

    if os.environ.get("PATCH") == "1":  # a tool that patches torch at startup (liger-kernel does transformers')
        F.gelu = lambda x, approximate="none": x * 2.0
        torch.nn.LayerNorm.forward = lambda self, x: x + 100.0

    torch.manual_seed(0)
    for m in (torch.nn.GELU(), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))):
        x = torch.randn(3, 8)
        with torch.no_grad():
            want = m(x)
            torchneuron_jit.jit(m)
            for _ in range(2):
                torch.testing.assert_close(m(x), want)
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_library_code_patched_in_one_process_and_not_the_other_sends_it_tracing(program):
    """Library code is identified by its distribution's version, and jit
    guards none of the globals it reads: a process that replaced F.gelu
    (which nn.GELU's forward calls) or LayerNorm.forward at startup loaded
    the other process's records and answered with the original ops. The
    records note what library code found by name, and check it."""
    assert program(source=PATCHED)["trace_records_stored"] == 2
    patched = program(source=PATCHED, env={"PATCH": "1"})
    assert patched["traces_loaded"] == 0 and patched["traces"] == 2, patched
    assert program(source=PATCHED)["traces"] == 0


DECORATED = textwrap.dedent('''
    import json, sys, warnings
    import torch
    import torchneuron_jit

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)  # its parameters require grad

    @torch.no_grad()
    def predict(x):
        return layer(x).relu() * 2

    @torch.inference_mode()
    def embed(x):
        return layer(x).tanh()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for f in (predict, embed):
            jf = torchneuron_jit.jit(f)
            for _ in range(2):
                x = torch.randn(3, 4, requires_grad=True)
                got, want = jf(x), f(x)
                torch.testing.assert_close(got, want)
                assert (got.requires_grad, got.is_inference()) == (want.requires_grad, want.is_inference())
    assert not [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)]
    st = torchneuron_jit.stats()
    print(json.dumps({k: st[k] for k in sys.argv[1].split(",")}))
''')


def test_functions_decorated_to_run_without_grad_load_in_a_fresh_process(program):
    """The variant of an @torch.inference_mode() function runs its graph in
    inference mode: its record says so, so a fresh process's results are
    inference tensors as eager's."""
    cold = program(source=DECORATED)
    assert cold["traces"] == 2 and cold["trace_records_stored"] == 2, cold
    warm = program(source=DECORATED)
    assert warm["traces"] == 0 and warm["traces_loaded"] == 2 and warm["plans_loaded"] == 2, warm


@pytest.mark.long
def test_more_of_what_the_records_depend_on_sends_a_fresh_process_tracing(program):
    program()
    assert program(env={"EPS": "1e-3"})["traces"] == 1   # an attribute of a submodule
    assert program(env={"BATCH": "2"})["traces"] == 1    # an input's shape
    assert program(env={"BATCH": "2"})["traces"] == 0    # ... now recorded too
    changed = PROGRAM.replace("floor=0.0", "floor=0.5")
    assert program(source=changed)["traces"] == 1  # a function's default changed (its code is the same)
    changed = PROGRAM.replace("return y * torch.sigmoid(y)", "return y * torch.tanh(y)")
    assert program(source=changed)["traces"] == 1  # a submodule's forward changed
    assert program()["traces"] == 0


def test_a_record_graph_compiled_in_place_falls_back_to_its_original_decoded_again(monkeypatch):
    """A warm start hands the decoded graph to the back end to rewrite (no
    copy); if a step of the plan then fails, the eager original is the
    record's graph decoded again: the answer is eager's, with one warning."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchneuron_jit import _C, backend

    def f(x, y):
        return torch.tanh(x * 2.0 + y) - 1.0

    x, y = torch.randn(6, 5), torch.randn(6, 5)
    with torch.no_grad():
        nodes = _records.encode_graph(make_fx(f)(x, y))
        real = backend._op_callable

        def boom(*args):
            raise RuntimeError("kernel exploded")

        monkeypatch.setattr(backend, "_op_callable", lambda t: boom if isinstance(t, _C.Kernel) else real(t))
        eager = _records.EagerGraph(nodes)
        fallbacks = torchneuron_jit.stats()["eager_fallbacks"]
        plan = backend.compile_inference(_records.decode_graph(nodes), [x, y], eager=eager)
        assert isinstance(plan, _C.Plan) and eager.gm is None  # not decoded until needed
        with pytest.warns(RuntimeWarning, match="kernel exploded"):
            out = plan([x, y])
    torch.testing.assert_close(out, f(x, y))  # the graph returns one tensor, as the plan does
    assert eager.gm is not None and torchneuron_jit.stats()["eager_fallbacks"] == fallbacks + 1


def test_a_plan_that_cannot_be_stored_warns_and_the_record_keeps_the_graph(monkeypatch):
    """Our failure to describe the plan costs the warm start its plan, not
    the record: one warning, and another JitFunction compiles the graph."""
    from torchneuron_jit import _planform

    def broken(plan):
        raise RuntimeError("object code exploded")

    monkeypatch.setattr(_planform, "encode", broken)
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match=r"storing the compiled plan of _twin .* failed.*object code exploded"):
        torch.testing.assert_close(torchneuron_jit.jit(_twin)(x), _twin(x))
    _, variants = _stored(_twin, x)
    assert len(variants) == 1 and "compiled" not in variants[0]
    before = counters()
    torch.testing.assert_close(torchneuron_jit.jit(_twin)(x), _twin(x))
    d = delta(before)
    assert (d["traces"], d["traces_loaded"], d["plans_loaded"], d["graphs_compiled"]) == (0, 1, 0, 1), d


def test_a_miss_of_arguments_already_looked_up_reads_no_record(monkeypatch):
    """Looking a miss's trace records up describes its arguments' guards
    (HF BERT: 10-14 ms of each such call). A miss whose arguments are of a
    kind this function looked up already (same dtypes, ranks and modules;
    other sizes) finds what that lookup found, and reads nothing; another
    dtype, and reset(), look again."""
    reads = []
    real = _jit._Tracer._load
    monkeypatch.setattr(_jit._Tracer, "_load", lambda self, fn, args, jf: reads.append(fn) or real(self, fn, args, jf))
    monkeypatch.setattr(_records, "has_records", lambda fn: True)  # as in a cache that holds some of f's

    @torchneuron_jit.jit
    def f(x):
        return torch.relu(x) * 2

    with config.patch(compile_blocking=True):
        for n in (3, 4, 5, 6):
            x = torch.randn(n, 8)
            torch.testing.assert_close(f(x), torch.relu(x) * 2)
        assert len(reads) == 1
        x = torch.randn(3, 8, dtype=torch.float64)
        torch.testing.assert_close(f(x), torch.relu(x) * 2)
        assert len(reads) == 2
        _jit.reset(f)
        x = torch.randn(7, 8)
        torch.testing.assert_close(f(x), torch.relu(x) * 2)
        assert len(reads) == 3


def test_a_miss_of_a_function_the_cache_holds_no_record_of_makes_no_record_key(monkeypatch):
    """The record key describes the arguments' guards (HF BERT's first
    miss: 7-10 ms on a cold cache). A function whose mark is not stored
    (no record of its code) skips it; once a record is stored, a second
    instance's miss looks it up and loads it."""
    keys = []
    real = _records.trace_key
    monkeypatch.setattr(_records, "trace_key", lambda fn, trace, pspec=None: keys.append(pspec) or
                        real(fn, trace, pspec))
    a, b = torch.nn.Linear(8, 4).eval(), torch.nn.Linear(8, 4).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 8)
    with config.patch(compile_blocking=True):
        torchneuron_jit.jit(a)
        assert not _records.has_records(torch.nn.Linear.forward)
        torch.testing.assert_close(a(x), torch.nn.functional.linear(x, a.weight, a.bias))
        # the lookup made none (the record's store, at the build, makes one with its portable spec)
        assert all(pspec is not None for pspec in keys), keys
        assert _records.has_records(torch.nn.Linear.forward)
        before = counters()
        torchneuron_jit.jit(b)
        torch.testing.assert_close(b(x), torch.nn.functional.linear(x, b.weight, b.bias))
    d = delta(before)
    assert (d["traces"], d["traces_loaded"]) == (0, 1), d
    assert any(pspec is None for pspec in keys)  # b's miss made the record key to look it up


def test_a_second_instance_loads_each_sizes_record_at_its_own_miss():
    """One record key holds every size's variants (which apply depends on
    the sizes): a second instance's miss at a second size looks it up
    again, and loads that size's variant instead of tracing."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 4).eval(), torch.nn.Linear(8, 4).eval()
    b.load_state_dict(a.state_dict())
    xs = [torch.randn(n, 8) for n in (3, 1)]  # size 1 stays a variant of its own
    with config.patch(compile_blocking=True):
        torchneuron_jit.jit(a)
        for x in xs:
            torch.testing.assert_close(a(x), torch.nn.functional.linear(x, a.weight, a.bias))
        before = counters()
        torchneuron_jit.jit(b)
        for x in xs:
            torch.testing.assert_close(b(x), torch.nn.functional.linear(x, a.weight, a.bias))
    d = delta(before)
    assert d["traces"] == 0 and d["traces_loaded"] == 2, d



def test_threads_storing_records_of_one_key_at_once_keep_each_others(monkeypatch):
    """Workers that trace one function for different calls and store at the
    same moment: each read the key's variants, added its own and put the
    list back, so the last writer's list was all a fresh process found
    (found by a helper's cache probe with 3 processes: 1 record of 3).
    Threads here, each encoding its list only once both have read theirs."""
    import threading

    both_read = threading.Barrier(2, timeout=30)
    waited = set()

    def dumps(obj, **kw):
        if threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            both_read.wait()
        return json.dumps(obj, **kw)

    monkeypatch.setattr(_records, "json", type("Json", (), {"dumps": staticmethod(dumps), "loads": json.loads}))
    key, stored = os.urandom(16), []
    writers = [threading.Thread(target=lambda n=n: stored.append(_records.store(_twin, key, {"id": n}, 4)))
               for n in ("a", "b")]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert stored == [True, True]
    assert sorted(v["id"] for v in _records.read(key)) == ["a", "b"]


def test_calls_passing_one_tensor_twice_or_two_are_records_of_other_kinds():
    """A call passing x twice has another record key ("same" guard) than
    one passing x and y: the memo of kinds that held no record took them
    for one kind, and after f(x, x) found none, f(x, y) did not look for
    the record another process had stored (found by a helper's probe)."""
    x, y = torch.randn(5), torch.randn(5)
    assert _jit._records_kind((x, x)) != _jit._records_kind((x, y))
    assert _jit._records_kind((x, y)) == _jit._records_kind((y, x)) == _jit._records_kind((torch.randn(5), y))


_TEAM_PACKAGE = '''
import os
import torch

ACT = os.environ.get("TEAM_ACT", "relu")


def head(x):
    return torch.relu(x * 2) if ACT == "relu" else torch.tanh(x * 2)


def scale(x):
    return x * 2


SETTINGS = {"shift": 1.0, "act": "relu"}


def shifted(x):
    return (torch.relu(x) if SETTINGS["act"] == "relu" else torch.tanh(x)) + SETTINGS["shift"]


def scaled(x):
    return torch.relu(scale(x)) + 1


class Head(torch.nn.Module):
    temperature = 1.0

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.softmax(self.lin(x) / self.temperature, -1)
'''

_TEAM_CHILD = '''
import sys
sys.path.insert(0, sys.argv[1])
import torch, torchneuron_jit, teamflag
f = torchneuron_jit.jit(teamflag.head)
x = torch.linspace(-2, 2, 12).reshape(3, 4)
torch.testing.assert_close(f(x), teamflag.head(x))
print(torchneuron_jit.stats()["traces_loaded"])
'''


def _installed_package(tmp_path):
    """A team's package as pip installs it: under a site-packages directory."""
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "teamflag").mkdir(parents=True)
    (site / "teamflag" / "__init__.py").write_text(_TEAM_PACKAGE)
    (site / "teamflag-0.1.0.dist-info").mkdir()
    (site / "teamflag-0.1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: teamflag\nVersion: 0.1.0\n")
    return site


def test_the_globals_an_installed_package_reads_are_guarded(tmp_path, monkeypatch):
    """A team's own package installed with pip is under site-packages, as
    transformers is: the numbers, strings and flags among the globals its
    code reads are guarded by value (they were not guarded at all: a flag
    changed, the answer did not)."""
    monkeypatch.syspath_prepend(str(_installed_package(tmp_path)))
    monkeypatch.delitem(sys.modules, "teamflag", raising=False)
    import teamflag
    assert _records.library_code(teamflag.__file__)  # as transformers is
    f = torchneuron_jit.jit(teamflag.head)
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    torch.testing.assert_close(f(x), torch.relu(x * 2))
    monkeypatch.setattr(teamflag, "ACT", "tanh")
    torch.testing.assert_close(f(x), torch.tanh(x * 2))


def test_the_settings_dict_an_installed_package_reads_is_guarded_by_its_contents(tmp_path, monkeypatch):
    """A team package's SETTINGS = {"shift": 1.0, ...}, a global its code
    reads at call time: set at run time, the compiled call kept the traced
    value. Its contents are guarded, as a dict of the user's is; a process
    whose settings differ does not take the other's record."""
    monkeypatch.syspath_prepend(str(_installed_package(tmp_path)))
    monkeypatch.delitem(sys.modules, "teamflag", raising=False)
    import teamflag
    f = torchneuron_jit.jit(teamflag.shifted)
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    for shift, act in [(1.0, "relu"), (1.0, "relu"), (5.0, "relu"), (5.0, "tanh")]:
        monkeypatch.setitem(teamflag.SETTINGS, "shift", shift)
        monkeypatch.setitem(teamflag.SETTINGS, "act", act)
        torch.testing.assert_close(f(x), teamflag.shifted(x))
    assert "SETTINGS" in str(torchneuron_jit.explain(f))


def test_the_class_attributes_of_an_installed_packages_class_are_guarded(tmp_path, monkeypatch):
    """The numbers, strings and flags among an installed package's class
    attributes, by value, as its globals: Head.temperature = 0.1 set at run
    time answered with 1.0."""
    monkeypatch.syspath_prepend(str(_installed_package(tmp_path)))
    monkeypatch.delitem(sys.modules, "teamflag", raising=False)
    import teamflag
    torch.manual_seed(0)
    m = teamflag.Head().eval()
    jm = torchneuron_jit.jit(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(jm(x), m(x))
        monkeypatch.setattr(teamflag.Head, "temperature", 0.1)
        torch.testing.assert_close(jm(x), m(x))
    assert "temperature" in str(torchneuron_jit.explain(jm))


def test_an_installed_packages_function_or_method_patched_and_restored_is_a_miss(tmp_path, monkeypatch):
    """A notebook cell patches transformers' apply_rotary_pos_emb (a global
    of its module) or LlamaMLP.forward (a method of its class), then undoes
    it: library code's functions were not guarded, and jit kept the first
    answer; a variant traced under the patch kept the patched answer once
    it was undone. Its functions and classes are guarded by identity."""
    monkeypatch.syspath_prepend(str(_installed_package(tmp_path)))
    monkeypatch.delitem(sys.modules, "teamflag", raising=False)
    import teamflag
    f = torchneuron_jit.jit(teamflag.scaled)
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    original = teamflag.scale
    for patched in (None, lambda t: t * 3, None):
        monkeypatch.setattr(teamflag, "scale", patched or original)
        for _ in range(2):
            torch.testing.assert_close(f(x), teamflag.scaled(x))


    class Outer(torch.nn.Module):  # the user's model around the library's layer (LlamaModel around LlamaMLP)
        def __init__(self):
            super().__init__()
            self.head = teamflag.Head()

        def forward(self, t):
            return self.head(t) + 1

    torch.manual_seed(0)
    m = Outer().eval()
    jm = torchneuron_jit.jit(Outer().eval())
    jm.load_state_dict(m.state_dict())
    forward = teamflag.Head.forward
    with torch.no_grad():
        for patched in (None, lambda self, t: forward(self, t) * 2, None):
            monkeypatch.setattr(teamflag.Head, "forward", patched or forward)
            for _ in range(2):
                torch.testing.assert_close(jm(x), m(x))


def test_a_warm_start_checks_an_installed_packages_flag(tmp_path, run_python):
    """A flag an installed package reads from the environment at import: a
    process with another value does not load the record the first one
    stored (it answered relu where eager gives tanh); one with the same
    value does."""
    site = _installed_package(tmp_path)
    (tmp_path / "child.py").write_text(_TEAM_CHILD)
    loaded = []
    for act in ("relu", "tanh", "tanh"):
        r = run_python("child.py", str(site), env={"TEAM_ACT": act}, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        loaded.append(int(r.stdout.split()[-1]))
    assert loaded == [0, 0, 1]
