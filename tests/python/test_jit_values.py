"""jit and what a traced call's Python sees of tensors: values read
without an ATen op (tolist(), str(), numpy()), tensors the code makes
(torch.tensor(...)) or captures and returns, the autograd state of what it
returns, and one tensor passed as two arguments. Each call is compared
with eager's: values, identity, requires_grad."""
import warnings

import pytest
import torch

import torchneuron_jit

pytestmark = pytest.mark.usefixtures("fresh_backend")


def _calls(f, inputs, check=None):
    """jit(f) and f on each input (a tuple of arguments, cloned for each
    side): results compared; check(got, want) for more. Returns the jit
    door's warnings."""
    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, args in enumerate(inputs):
            got = jf(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            want = f(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            torch.testing.assert_close(got, want, msg=lambda m: f"call {i}: {m}")
            if check is not None:
                check(got, want)
    return [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]


def _positives(x):
    return torch.tensor([v * 2 for v in x.tolist() if v > 0])


def _two_values(x):
    a, b = x.tolist()
    return x * a + b


def _with_words(x):
    # str() and repr() read a tensor without an ATen op (format() of a 0-dim tensor reads it with item())
    return x * 2, str(x.max()), repr(x)


@pytest.mark.parametrize("f", [_positives, _two_values])
def test_values_read_with_tolist_are_checked_on_every_call(f):
    # the values change on every other call; a variant whose read values differ takes a side exit
    inputs = [(torch.tensor([1.0 + i, -1.0 if i % 2 else 2.0]),) for i in range(6)] * 2
    _calls(f, inputs)


def test_values_read_by_str_and_format_are_checked_on_every_call():
    inputs = [(torch.tensor([1.0, 2.0 + i % 3]),) for i in range(6)]
    jf = torchneuron_jit.jit(_with_words)
    for i, (x,) in enumerate(inputs):
        got, want = jf(x), _with_words(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:], f"call {i}: {got[1:]} != {want[1:]}"


def test_values_that_repeat_run_the_compiled_variant():
    x = torch.tensor([3.0, -1.0])
    jf = torchneuron_jit.jit(_two_values)
    for _ in range(4):
        torch.testing.assert_close(jf(x), _two_values(x))
    assert torchneuron_jit.stats()["traces"] == 1
    assert [v["hits"] for v in torchneuron_jit.explain(jf).variants] == [3]


def test_numpy_of_a_tensor_runs_eagerly_with_one_warning():
    def f(x):
        return torch.from_numpy(x.numpy() * 2) + x

    words = _calls(f, [(torch.tensor([1.0 + i, 2.0]),) for i in range(4)])
    assert len(words) == 1 and "reads a tensor's memory through numpy()" in words[0], words


def _offset_scale(x):
    return x * x.storage_offset()


def _inference_scale(x):
    return x * (2 if x.is_inference() else 3)


def _inference_tensor(i):
    with torch.inference_mode():
        return torch.ones(4) * i


def _shared_scale(x):
    return x * (2 if x.is_shared() else 3)


def _storage_scale(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        return x * x.storage().size()


def _version_scale(x):
    return x * x._version


def _base_scale(x):
    return x * (2 if x._base is None else 3)


def _bumped(i):
    t = torch.ones(4)
    for _ in range(i):
        t.add_(0)  # each in-place op moves its version counter on
    return t


@pytest.mark.parametrize("f, inputs, words", [
    (_offset_scale, lambda i: torch.arange(10.0)[i:i + 4], "calls Tensor.storage_offset()"),  # one layout, 4 offsets
    (_inference_scale, lambda i: _inference_tensor(i) if i % 2 else torch.ones(4) * i, "calls Tensor.is_inference()"),
    (_shared_scale, lambda i: torch.ones(4).share_memory_() if i % 2 else torch.ones(4), "calls Tensor.is_shared()"),
    (_storage_scale, lambda i: torch.ones(4 + i)[:4], "calls Tensor.storage()"),
    (_version_scale, _bumped, "reads ._version"),
    (_base_scale, lambda i: torch.ones(8)[:4] if i % 2 else torch.ones(4), "reads ._base"),
], ids=["storage_offset", "is_inference", "is_shared", "storage", "_version", "_base"])
def test_what_no_guard_checks_read_off_a_tensor_runs_eagerly_with_one_warning(f, inputs, words):
    """x.storage_offset(), x.is_inference(), x.is_shared(), x.storage(),
    x._version and x._base answer what no guard of the argument checks
    (its sizes, strides, dtype, device and requires_grad are): a slice at
    another offset, a tensor in shared memory (a DataLoader worker's
    batch), a weight updated in place (a cache refreshed when its version
    moves) got the traced call's answer. The code runs eagerly, with one
    warning naming the read and its line (as for x.data_ptr():
    test_jit_state)."""
    with torch.no_grad():
        caught = _calls(f, [(inputs(i),) for i in range(4)])
    assert len(caught) == 1 and f"it {words} at {__file__}:" in caught[0], caught


def test_a_modules_own_attribute_named_as_a_tensors_unguarded_one_compiles():
    """self._base, a submodule of the user's, is no tensor's base: the
    forward compiles, without a warning."""
    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self._base = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self._base(x) * 2

    m = Wrapped()
    want = m(torch.ones(2, 4)).detach()
    torchneuron_jit.jit(m)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(m(torch.ones(2, 4)), want)
    assert not [w for w in caught if "torchneuron_jit" in str(w.message)], [str(w.message) for w in caught]
    assert "variant 0 (compiled)" in str(torchneuron_jit.explain(m))


def test_an_attribute_the_caller_sets_on_an_argument_tensor_after_the_trace_is_a_miss():
    """The variant traced with a bare tensor guards that the tensor has no
    Python attributes: one the caller sets later (x.scale = 5.0), which
    the code reads, took the traced answer."""
    def f(x):
        s = getattr(x, "scale", None)
        return x * 2 if s is None else x * s

    jf = torchneuron_jit.jit(f)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the variant with attributes runs eagerly, with one warning
        for scale in (None, None, None, 5.0, 7.0, None):
            x = torch.ones(3)
            if scale is not None:
                x.scale = scale
            torch.testing.assert_close(jf(x), f(x), msg=lambda m: f"scale {scale}: {m}")


def test_a_tensor_literal_is_a_new_tensor_on_every_call():
    def f(x):
        t = torch.tensor([1.0, 2.0, 3.0])
        t.add_(x)
        return t

    _calls(f, [(torch.ones(3) * i,) for i in range(4)])

    def g(x):
        return x * 2, torch.tensor([1.0, 2.0])

    jg = torchneuron_jit.jit(g)
    for _ in range(4):
        _, lit = jg(torch.ones(1))
        torch.testing.assert_close(lit, torch.tensor([1.0, 2.0]))
        lit.add_(100)  # the caller owns it, as eager's


G = torch.ones(2)


def test_a_captured_tensor_returned_as_it_is_is_that_tensor():
    def f(x):
        return G, x + G

    _calls(f, [(torch.ones(2),)] * 3, check=lambda got, want: got[0] is G or pytest.fail("not G itself"))


def test_detach_of_an_argument_that_requires_grad_does_not_require_grad():
    def f(x):
        return x.detach(), x[1:]

    def same_grad(got, want):
        assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == [False, True]

    with torch.no_grad():
        jf = torchneuron_jit.jit(f)
        for _ in range(4):
            x = torch.randn(3, requires_grad=True)
            same_grad(jf(x), f(x))


def test_grad_mode_turned_on_inside_the_function_keeps_autograd():
    def f(x, w):
        with torch.enable_grad():
            return (x * w).sum()

    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            x, w = torch.randn(3), torch.randn(3, requires_grad=True)
            got = jf(x, w)
            assert got.requires_grad and got.grad_fn is not None
            got.backward()
            torch.testing.assert_close(w.grad, x)
    words = [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)]
    assert len(words) == 1 and "grad mode is on inside the traced code" in words[0], words


def _writes_first(a, b):
    a.add_(1)
    return b * 2


@pytest.mark.parametrize("order", [[True, False, True, False], [False, True, False, True]])
def test_one_tensor_passed_twice_and_two_tensors_are_different_variants(order):
    inputs = []
    for aliased in order:
        a = torch.zeros(3)
        inputs.append((a, a) if aliased else (a, torch.zeros(3)))
    jf = torchneuron_jit.jit(_writes_first)
    for i, (a, b) in enumerate(inputs):
        a2 = a.clone()
        b2 = a2 if b is a else b.clone()
        torch.testing.assert_close(jf(a, b), _writes_first(a2, b2), msg=lambda m: f"call {i}: {m}")
        torch.testing.assert_close(a, a2)
    text = str(torchneuron_jit.explain(jf))
    assert "args[1]: the same tensor as args[0]" in text or "b: the same tensor as a" in text, text


def test_an_attribute_set_on_an_argument_tensor_runs_eagerly_with_a_warning():
    def f(x):
        x.seen = x.shape[0]  # Python state on the tensor, which no compiled call would set
        return x + 1

    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(4):
            x = torch.randn(3)
            torch.testing.assert_close(jf(x), x + 1)
            assert x.seen == 3, f"call {n}"
    words = [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)]
    assert len(words) == 1 and "argument x's attributes['seen'] (set)" in words[0], words


def test_an_exception_of_the_users_code_in_a_compiled_variant_prints_nothing(capfd):
    """Python's own error inside a compiled variant (an int argument that
    became a symbol, divided by): eager's exception, and nothing on stderr
    (torch.fx printed its generated code there when the graph's eager
    original ran as a module)."""
    def f(x, n):
        return x * (1 / n)

    jf = torchneuron_jit.jit(f)
    for n in (1, 2, 3, 4):
        torch.testing.assert_close(jf(torch.ones(2), n), f(torch.ones(2), n))
    capfd.readouterr()
    with pytest.raises(ZeroDivisionError):
        jf(torch.ones(2), 0)
    assert "FX-traced" not in capfd.readouterr().err
    torch.testing.assert_close(jf(torch.ones(2), 5), f(torch.ones(2), 5))


def test_a_draw_before_a_value_check_that_fails_is_drawn_again_as_eager_draws_it():
    """A variant whose value check fails takes a side exit and the call
    runs again: the numbers its graph drew are drawn again from the same
    state, as eager's call draws them."""
    def f(x):
        r = torch.rand(3)
        return x * 2 if r[0].item() > 0.5 else x - r

    jf = torchneuron_jit.jit(f)
    for seed in range(8):
        torch.manual_seed(seed)
        want = f(torch.ones(3))
        after = torch.rand(2)
        torch.manual_seed(seed)
        torch.testing.assert_close(jf(torch.ones(3)), want, msg=lambda m: f"seed {seed}: {m}")
        torch.testing.assert_close(torch.rand(2), after)  # the generator where eager's call left it


@pytest.mark.parametrize("make", [lambda x: torch.ones(3, requires_grad=True), lambda x: (x * 2).requires_grad_(),
                                  lambda x: x.detach().requires_grad_()])
def test_a_result_the_call_made_require_grad_requires_grad(make):
    jf = torchneuron_jit.jit(make)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert jf(torch.ones(3)).requires_grad
    assert len([m for m in caught if "torchneuron_jit" in str(m.message)]) <= 1


def test_a_mutable_value_in_the_result_is_the_callers_own():
    def f(x):
        return x * 2, {"k": {1, 2}}, bytearray(b"ab")

    jf = torchneuron_jit.jit(f)
    for i in range(4):
        got = jf(torch.ones(1))
        assert got[1:] == ({"k": {1, 2}}, bytearray(b"ab")), f"call {i}: {got[1:]}"
        got[1]["k"].add(10 + i)  # the caller changes its result, as it may change eager's
        got[2].append(1)


def test_python_attributes_and_data_of_tensors_are_eagers():
    """Python state on tensors, which no graph reads or sets: an attribute
    the caller set and the code reads, one the call sets on a tensor it
    returns or on one in a list argument, and x.data = y; each runs
    eagerly (with one warning per cause), as its answer needs."""
    def reads(x):
        return x * x.scale

    def tags_result(x):
        r = x * 2
        r.tag = "made"
        return r

    def tags_item(xs):
        xs[0].tag = 1
        return xs[0] + 1

    def rebinds(x, y):
        x.data = y
        return x * 2

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        jr, jt, ji, jb = (torchneuron_jit.jit(f) for f in (reads, tags_result, tags_item, rebinds))
        for i in range(3):
            x = torch.ones(2)
            x.scale = i + 1
            torch.testing.assert_close(jr(x), reads(x))
            assert jt(torch.ones(2)).tag == "made"
            xs = [torch.ones(2)]
            ji(xs)
            assert xs[0].tag == 1
            xj, y = torch.zeros(2), torch.full((2,), float(i + 1))
            torch.testing.assert_close(jb(xj, y), y * 2)
            torch.testing.assert_close(xj, y)


def test_the_words_for_an_in_place_view_op_and_a_quantized_argument_name_them():
    """x.unsqueeze_(0) on an argument said it "writes argument x's memory or
    sizes (x.data = y, an out= or resize_ that grows it) (a tuple)"; a
    quantized argument was "a cpu torch.strided tensor; only dense CPU
    tensors are compiled", a nested one an internal error of torch's. The
    words name what changed, the dtype, the nested tensor."""
    def grows(x):
        x.unsqueeze_(0)
        return x * 2

    def dequantized(x):
        return x.dequantize() * 2

    def words_of(f, make):
        jf = torchneuron_jit.jit(f)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                a, b = make(), make()
                torch.testing.assert_close(jf(a), f(b))
                torch.testing.assert_close(a, b)
        return [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]

    words = words_of(grows, lambda: torch.ones(3))
    assert len(words) == 1 and "argument x's sizes and strides (an in-place view op" in words[0], words
    assert "(a tuple)" not in words[0], words
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.quint8)
    words = words_of(dequantized, lambda: q)
    assert len(words) == 1 and "x is a quantized (torch.quint8) tensor" in words[0], words
    # a nested tensor said "guarding the arguments failed (RuntimeError: Internal error: NestedTensorImpl ...)"
    jf = torchneuron_jit.jit(lambda x: x * 2)
    nested = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = jf(nested)
    assert [torch.equal(a, b * 2) for a, b in zip(got.unbind(), nested.unbind())] == [True, True]
    words = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(words) == 1 and "x is a nested tensor" in words[0], words


def _split_sums(x, idx):
    return [p.sum(0) for p in torch.tensor_split(x, idx)]


def _packed(x, lengths):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, got = pad_packed_sequence(packed, batch_first=True)
    return out * 2, got


@pytest.mark.parametrize("f, values", [
    (_split_sums, ([3, 7], [2, 5], [1, 9])),
    (_packed, ([5, 4, 4], [5, 2, 3], [5, 5, 1])),
], ids=["tensor_split", "packed sequence"])
def test_ops_that_read_a_tensors_values_in_cpp_are_no_stale_graph(f, values):
    """torch.tensor_split by a tensor of indices cuts with plain slices, and
    packing reads its lengths, in C++, with no op the recording sees read
    them: the graph replayed the first call's cuts (pieces of 2/3/5 where
    eager gives 3/4/3), and pad_packed_sequence's lengths, filled in place,
    came back as uninitialised memory. Such a call runs eagerly."""
    jf = torchneuron_jit.jit(f)
    x = torch.randn(3, 5, 2) if f is _packed else torch.randn(10, 3)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for v in values * 2:
            torch.testing.assert_close(jf(x, torch.tensor(v)), f(x, torch.tensor(v)))
    words = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(words) == 1 and "data-dependent" in words[0], words


def test_inference_mode_switched_inside_the_call_makes_eagers_tensors():
    def inside(x):
        with torch.inference_mode():
            return x * 2

    def outside(x):
        with torch.inference_mode(False):
            return x * 2

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ji, jo = torchneuron_jit.jit(inside), torchneuron_jit.jit(outside)
        for _ in range(3):
            assert ji(torch.ones(2)).is_inference()
        with torch.inference_mode():
            for _ in range(3):
                assert not jo(torch.ones(2)).is_inference()


def _masked():
    """A new function each time (records and sizes are per function)."""
    def masked(x, mask):
        if (mask == 1).all():  # transformers' masks check this (is_nonzero of all())
            return x + 1
        return x * mask[:, :, None].to(x.dtype)
    return masked


def test_values_read_under_inference_mode_compile_as_under_no_grad():
    """Under torch.inference_mode (sentence-transformers' encode, pipelines)
    composite ops reach the recorder whole: is_nonzero of a mask check went
    into the graph and failed to compile, item() was a data-dependent
    result, and the symbolic trace failed the same way: every call ran
    eagerly. Their decompositions are recorded, as under no_grad."""
    calls = [(2, 5, 1), (2, 7, 1), (3, 9, 1), (2, 11, 0), (4, 6, 1), (1, 13, 1), (3, 4, 0), (2, 8, 0)]
    counts = []
    for context in (torch.no_grad, torch.inference_mode):
        f = _masked()
        jf = torchneuron_jit.jit(f)
        before = torchneuron_jit.stats()
        # no trace records: the second function (the same code) would load the first's variants
        with context(), warnings.catch_warnings(record=True) as caught, torchneuron_jit.config.patch(
                jit_trace_records=False):
            warnings.simplefilter("always")
            for b, s, pad in calls:
                x, mask = torch.randn(b, s, 8), torch.ones(b, s, dtype=torch.long)
                mask[0, s // 2:] = 0 if pad else 1
                torch.testing.assert_close(jf(x, mask), f(x, mask), rtol=0, atol=0)
        assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)], context
        after = torchneuron_jit.stats()
        counts.append((after["traces"] - before["traces"], after["dynamic_traces"] - before["dynamic_traces"]))
        kinds = {v["kind"].split(",")[0] for v in torchneuron_jit.explain(jf).variants}
        assert kinds == {"compiled"}, (context, str(torchneuron_jit.explain(jf)))
    assert counts[0] == counts[1] and counts[1][1] >= 2, counts


def test_item_under_inference_mode_is_a_value_check():
    def f(x):
        if x.sum().item() > 0:
            return x * 2
        return x - 100

    jf = torchneuron_jit.jit(f)
    with torch.inference_mode():
        for v in (1.0, 1.0, -1.0, 1.0, -1.0):
            x = torch.full((3,), v)
            torch.testing.assert_close(jf(x), f(x))
    assert {v["kind"].split(",")[0] for v in torchneuron_jit.explain(jf).variants} == {"compiled"}


_BOTH_DOORS = """
import torch, torchneuron_jit
def f3(x):
    print("a graph break")
    return x + 1
try:
    torch.compile(f3, backend="neuron", fullgraph=True)(torch.ones(2))
except Exception as exc:
    print("fullgraph raised", type(exc).__name__)
j = torchneuron_jit.jit(lambda x: x * 3)
j(torch.ones(2))
print(torch.compile(j, backend="neuron")(torch.ones(2)).tolist())
print(torchneuron_jit.jit(torch.compile(lambda x: x * 4, backend="neuron"))(torch.ones(2)).tolist())
"""


def test_torch_compile_of_a_jitted_function_and_jit_of_a_compiled_one_answer(tmp_path):
    """Dynamo's frame hook installed while ours was chains to ours, and
    ours chained back to it: the stack overflowed (a segfault), or memory
    grew without end. Ours now evaluates with CPython's own function."""
    import subprocess
    import sys

    from conftest import subprocess_env
    env = subprocess_env(tmp_path, TORCHNEURON_COMPILE_BLOCKING="0")
    done = subprocess.run([sys.executable, "-c", _BOTH_DOORS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[3.0, 3.0]\n[4.0, 4.0]" in done.stdout, done.stdout


@pytest.mark.parametrize("kind", ["function", "module"])
def test_jit_of_code_calling_a_torch_compiled_function_compiles_it(kind):
    """Dynamo runs a torch.compile'd function's frames as they are under
    the recording (their ops are recorded), but its frame callback read
    random's state, which the trace took for the code's (the call ran
    eagerly, blaming random.Random.getstate()), and it marked their code to
    be skipped for good: the function, called directly after, was never
    compiled again. The jitted call compiles, and the function after."""
    def scaled(x):
        return torch.sin(x) * 2

    inner = torch.compile(scaled, backend="neuron") if kind == "function" else \
        torch.compile(torch.nn.Sequential(torch.nn.Tanh()), backend="neuron")
    ref = scaled if kind == "function" else torch.tanh

    def outer(x):
        return inner(x + 1) - 1

    jf = torchneuron_jit.jit(outer)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(4)
            torch.testing.assert_close(jf(x), ref(x + 1) - 1)
        assert [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)] == []
        (_, runner), = jf.entries()
        assert runner is not None  # a compiled variant
        compiled = torchneuron_jit.stats()["graphs_compiled"]
        torch.testing.assert_close(inner(x), ref(x))
        assert torchneuron_jit.stats()["graphs_compiled"] == compiled + 1  # Dynamo's graph, through our back end


def test_the_func_guard_loads_a_functions_fields():
    def f(x, scale=2.0):
        return x * scale

    spec = [("arg", 0), ("func", 0, "code"), ("is", 1, f.__code__), ("func", 0, "defaults"), ("eq", 3, (2.0,)),
            ("func", 0, "closure"), ("is", 5, None)]
    assert torchneuron_jit._C.GuardSet(spec).check(f) == -1
    f.__defaults__ = (3.0,)
    assert torchneuron_jit._C.GuardSet(spec).check(f) == 4
    assert torchneuron_jit._C.GuardSet(spec).check(len) == 1  # no Python function: the load fails, nothing raises
    with pytest.raises(ValueError, match="func reads code"):
        torchneuron_jit._C.GuardSet([("arg", 0), ("func", 0, "globals")])


def test_the_bare_guard_passes_a_tensor_without_python_attributes_but_torchs_marks():
    gs = torchneuron_jit._C.GuardSet([("arg", 0), ("bare", 0)])
    x = torch.ones(2)
    assert gs.check(x) == -1
    x._dynamo_static_input_type = "unguarded"  # what torch.compile marks an input with
    torch._dynamo.mark_dynamic(x, 0)  # sets x._dynamo_dynamic_indices
    assert gs.check(x) == -1
    x.scale = 2.0
    assert gs.check(x) == 1
    p = torch.nn.Parameter(torch.ones(2))  # a Python subclass keeps its attributes as Python objects do
    assert gs.check(p) == -1
    p.flag = True
    assert gs.check(p) == 1
    with pytest.raises(ValueError, match="wrong number of operands"):
        torchneuron_jit._C.GuardSet([("arg", 0), ("bare", 0, True)])
