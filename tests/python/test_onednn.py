"""Linear layers run by oneDNN (torchneuron_jit/gemm.py, backend._Artifact):
a float32 aten.linear that stays in PyTorch, with the op after it (a bias
added separately, relu, gelu, a residual add), becomes one
mkldnn._linear_pointwise call where a measurement finds that faster.

The measurement is replaced here (gemm.measure patched) so that each test
decides the choice itself; one test runs the real measurement. Results are
compared with eager: the sums run in another order, so within the float32
tolerance of a GEMM (a float64 reference bounds ours by twice eager's
error).
"""
import copy
import textwrap
import time
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchneuron_jit
from torchneuron_jit import backend, config, gemm

pytestmark = [pytest.mark.usefixtures("fresh_backend"),
              pytest.mark.skipif(not gemm.available(), reason="this torch has no oneDNN")]

ONEDNN = "mkldnn._linear_pointwise.default"
ONEDNN_ADD = "mkldnn._linear_pointwise.binary"
LINEAR = "aten.linear.default"


@pytest.fixture
def choose(monkeypatch):
    """choose(True | False | "packed"): every unit measures as oneDNN
    faster than aten.linear (or slower; or the packed variant fastest, when
    it is timed at all); returns the list of units measured."""
    measured = []

    def set_choice(winner):
        def fake(unit, kinds=("onednn",), fewest=False):
            measured.append(unit.describe())
            times = {"aten": 0.5 if winner is False else 1.0}
            times.update({k: 0.4 if k == winner or (winner is True and k == "onednn") else 0.9 for k in kinds})
            return times
        monkeypatch.setattr(gemm, "measure", fake)
        monkeypatch.setattr(backend, "_gemm_choices", backend._GemmChoices())
        return measured

    return set_choice


@pytest.fixture
def ops(compiled):
    """ops() -> Counter of the ops run through PyTorch since the fixture
    (or the last call)."""
    def read():
        got = compiled.fallbacks()
        compiled.mark()
        return got
    return read


def _t(shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale


def _close_to_eager(got, f, *args):
    """got matches f(*args) in eager, and is at most twice as far from a
    float64 run of f as eager is (plus 1e-6 of the magnitude)."""
    want = f(*args)
    ref = f(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args))
    _as_close_as_eager(got, want, ref)


def _model_close_to_eager(got, model, x):
    """_close_to_eager for a module: its float64 run is a float64 copy of
    it. The comparison with eager allows 1e-6 of the magnitude too: a
    weight of 1.0 over 256 inputs gives sums where float32's summation
    orders differ by more than a fixed 1e-5."""
    want = model(x)
    ref = copy.deepcopy(model).double()(x.double())
    _as_close_as_eager(got, want, ref, atol=max(1e-5, 1e-6 * ref.abs().max().item()))


def _as_close_as_eager(got, want, ref, atol=1e-5):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=atol)
    ours, eagers = (got.double() - ref).abs().max().item(), (want.double() - ref).abs().max().item()
    assert ours <= 2 * eagers + 1e-6 * ref.abs().max().item(), (ours, eagers)


def _run(f, *args, dynamic=False):
    with torch.no_grad():
        return torch.compile(f, backend="neuron", dynamic=dynamic)(*args)


x, w, b = _t((4, 64, 256)), _t((384, 256), 1, 0.06), _t((384,), 2)


@pytest.mark.parametrize("name,f,folded", [
    ("alone", lambda x, w, b: F.linear(x, w, b), []),
    ("no_bias", lambda x, w, b: F.linear(x, w), []),
    ("relu", lambda x, w, b: F.relu(F.linear(x, w, b)), ["aten.relu.default"]),
    ("gelu", lambda x, w, b: F.gelu(F.linear(x, w, b)), ["aten.gelu.default"]),
    ("gelu_tanh", lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"), ["aten.gelu.default"]),
    ("bias_added", lambda x, w, b: F.linear(x, w) + b, ["aten.add.Tensor"]),
    ("bias_added_first", lambda x, w, b: b + F.linear(x, w), ["aten.add.Tensor"]),
    ("bias_added_relu", lambda x, w, b: F.relu(F.linear(x, w) + b), ["aten.add.Tensor", "aten.relu.default"]),
])
def test_linear_and_its_epilogue_are_one_onednn_call(name, f, folded, choose, ops):
    measured = choose(True)
    got = _run(f, x, w, b)
    _close_to_eager(got, f, x, w, b)
    ran = ops()
    assert ran[ONEDNN] == 1 and ran[LINEAR] == 0, dict(ran)
    for op in folded:
        assert ran[op] == 0, (op, dict(ran))
    assert len(measured) == 1, measured
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("residual_first", [False, True])
def test_residual_add_is_onednns_binary_post_op(residual_first, choose, ops):
    choose(True)
    y = _t((4, 64, 384), 3)

    def f(x, w, b, y):
        return y + F.linear(x, w, b) if residual_first else F.linear(x, w, b) + y

    got = _run(f, x, w, b, y)
    _close_to_eager(got, f, x, w, b, y)
    ran = ops()
    assert ran[ONEDNN_ADD] == 1 and ran[LINEAR] == 0 and ran["aten.add.Tensor"] == 0, dict(ran)
    assert torch.equal(y, _t((4, 64, 384), 3))  # the residual is read, not written


def test_measured_slower_keeps_aten_linear(choose, ops):
    measured = choose(False)

    def f(x, w, b):
        return F.relu(F.linear(x, w, b))

    got = _run(f, x, w, b)
    torch.testing.assert_close(got, f(x, w, b))
    ran = ops()
    assert ran[LINEAR] == 1 and ran[ONEDNN] == 0 and ran["aten.relu.default"] == 1, dict(ran)
    assert measured == ["linear 256x256->384 + bias + relu"]


def test_each_shape_is_measured_once_per_process(choose, ops):
    measured = choose(True)
    w2, b2 = _t((256, 384), 4, 0.05), _t((256,), 5)

    def f(x, w, b, w2, b2):  # two layers of one shape (with their relus), a third of another
        h = F.relu(F.linear(x, w, b))
        h2 = F.relu(F.linear(x * 2, w, b))
        return F.linear(h + h2, w2, b2)

    got = _run(f, x, w, b, w2, b2)
    torch.testing.assert_close(got, f(x, w, b, w2, b2), rtol=1e-4, atol=1e-4)
    assert sorted(measured) == ["linear 256x256->384 + bias + relu", "linear 256x384->256 + bias"]
    assert ops()[ONEDNN] == 3


def test_chained_units_rewrite_on_the_live_graph(choose, ops):
    """The second layer's input is the first layer's folded relu: it must
    read the oneDNN call that replaced it."""
    choose(True)
    w2 = _t((256, 384), 4, 0.05)

    def f(x, w, b, w2):
        return F.gelu(F.linear(F.relu(F.linear(x, w, b)), w2))

    got = _run(f, x, w, b, w2)
    torch.testing.assert_close(got, f(x, w, b, w2), rtol=1e-4, atol=1e-4)
    ran = ops()
    assert ran[ONEDNN] == 2 and ran[LINEAR] == 0 and ran["aten.relu.default"] == 0, dict(ran)


def test_a_product_read_twice_folds_nothing(choose, ops):
    choose(True)

    def f(x, w, b):
        h = F.linear(x, w, b)
        return F.relu(h), h

    got = _run(f, x, w, b)
    for g, e in zip(got, f(x, w, b)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    ran = ops()
    assert ran[ONEDNN] == 1, dict(ran)


@pytest.mark.parametrize("case", ["transposed_input", "sliced_input", "transposed_weight", "one_row"])
def test_layouts_and_shapes(case, choose):
    choose(True)
    xx, ww = x, w
    if case == "transposed_input":
        xx = _t((64, 4, 256)).transpose(0, 1)
    elif case == "sliced_input":
        xx = _t((4, 64, 512))[..., ::2]
    elif case == "transposed_weight":
        ww = _t((256, 384), 1, 0.06).t()
    else:
        xx = _t((256,))

    def f(x, w, b):
        return F.relu(F.linear(x, w, b))

    got = _run(f, xx, ww, b)
    _close_to_eager(got, f, xx, ww, b)
    assert got.shape == f(xx, ww, b).shape and got.is_contiguous()


@pytest.mark.parametrize("f", [lambda x, y: x @ y.t(), lambda x, y: F.linear(x, y, torch.ones(3))],
                         ids=["product", "linear_with_bias"])
def test_an_empty_inner_dimension_is_no_onednn_unit(f, choose):
    """x (4, 0) @ y (3, 0).t(): oneDNN makes no primitive for K = 0, and the
    graph went eagerly with a warning; eager's answer is 0s (or the bias)."""
    choose(True)
    x, y = torch.randn(4, 0), torch.randn(3, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="neuron")(x, y)
    torch.testing.assert_close(got, f(x, y))
    assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]


class Conv1D(torch.nn.Module):
    """GPT-2's layer (transformers' pytorch_utils.Conv1D): x @ W + b with a
    stored (in, out) matrix, through addmm on the flattened rows."""

    def __init__(self, nx, nf, seed=1):
        super().__init__()
        self.weight = torch.nn.Parameter(_t((nx, nf), seed, 0.06))
        self.bias = torch.nn.Parameter(_t((nf,), seed + 1))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


def _conv1d_door(model, door):
    if door == "compile":
        return torch.compile(model, backend="neuron")
    config.compile_blocking = True
    return torchneuron_jit.jit(model)


@pytest.mark.parametrize("door", ["compile", "jit"])
def test_a_product_with_a_stored_matrix_is_a_linear_layer(door, choose, ops):
    """GPT-2's addmm(b, x, W) and a bare x @ W are timed as linear layers on
    W's transposed view, and run by oneDNN where that measured faster."""
    measured = choose(True)
    model = torch.nn.Sequential(Conv1D(256, 384), torch.nn.GELU(approximate="tanh"), Conv1D(384, 256, 3)).eval()
    w3 = torch.nn.Parameter(_t((256, 128), 5, 0.06))
    run = _conv1d_door(model, door)

    def f(x):
        return run(x) @ w3

    with torch.no_grad():
        for _ in range(2):
            got = f(x)
    c1, c2 = model[0], model[2]

    def as_eager(x, w1, b1, w2, b2, w3):
        return (F.gelu(x @ w1 + b1, approximate="tanh") @ w2 + b2) @ w3
    _close_to_eager(got, as_eager, x, c1.weight.detach(), c1.bias.detach(), c2.weight.detach(), c2.bias.detach(),
                    w3.detach())
    ran = ops()
    assert ran[ONEDNN] >= 2 and ran["aten.addmm.default"] == 0 and ran[LINEAR] == 0, dict(ran)
    assert sorted(set(measured)) == ["linear 256x256->384 + bias + gelu", "linear 256x384->256 + bias"], measured


def test_a_stored_matrix_measured_slower_keeps_eagers_product(choose, ops):
    measured = choose(False)
    model = Conv1D(256, 384).eval()
    with torch.no_grad():
        got = torch.compile(model, backend="neuron")(x)
    _model_close_to_eager(got, model, x)
    ran = ops()
    assert ran[ONEDNN] == 0 and ran[LINEAR] == 1 and measured == ["linear 256x256->384 + bias"], dict(ran)


@pytest.mark.parametrize("weight", ["stored", "transposed"])
def test_a_bias_of_the_flat_rows_stays_on_the_flat_rows(weight, choose, recwarn):
    """addmm(B, x3.view(M, K), W).view(x3's dims) with B of (M, N): the
    views stay, or B would be broadcast against x3's dims."""
    choose(True)
    xs, bias = _t((4, 8, 16)), _t((32, 12), 7)
    w_ = _t((16, 12), 8) if weight == "stored" else _t((12, 16), 8).t()

    def f(x, w, b):
        return torch.addmm(b, x.view(-1, 16), w).view(4, 8, 12)

    torch.testing.assert_close(_run(f, xs, w_, bias), f(xs, w_, bias), rtol=1e-5, atol=1e-5)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0
    assert not [w for w in recwarn if "torchneuron_jit" in str(w.message)], [str(w.message) for w in recwarn]


def test_a_product_of_two_computed_matrices_is_no_linear_layer(choose, ops):
    measured = choose(True)

    def f(a, c):
        return (a * 2).view(-1, 256) @ (c + 1)

    c = _t((256, 384), 6)
    got = _run(f, x, c)
    torch.testing.assert_close(got, f(x, c), rtol=1e-5, atol=1e-5)
    assert measured == [] and ops()[ONEDNN] == 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_dtypes_keep_aten_linear(dtype, choose, ops):
    measured = choose(True)

    def f(x, w, b):
        return F.relu(F.linear(x, w, b))

    args = (x.to(dtype), w.to(dtype), b.to(dtype))
    got = _run(f, *args)
    torch.testing.assert_close(got, f(*args))
    assert ops()[ONEDNN] == 0 and measured == []


def test_dynamic_shapes_keep_aten_linear(choose, ops):
    measured = choose(True)

    def f(x, w, b):
        return F.relu(F.linear(x, w, b))

    for rows in (5, 7, 9):
        xs = _t((rows, 256), rows)
        torch.testing.assert_close(_run(f, xs, w, b, dynamic=True), f(xs, w, b))
    assert measured == []
    assert ops()[ONEDNN] == 0


def test_setting_off_keeps_aten_linear(choose, ops):
    measured = choose(True)
    config.onednn_linear = False

    def f(x, w, b):
        return F.relu(F.linear(x, w, b))

    torch.testing.assert_close(_run(f, x, w, b), f(x, w, b))
    assert ops()[ONEDNN] == 0 and measured == []


def test_in_place_change_of_a_weight_is_seen(choose):
    """oneDNN reads the weight at every call: an update between calls
    (a fine-tuning step, load_state_dict) shows in the next result."""
    choose(True)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.ReLU()).eval()
    with torch.no_grad():
        compiled = torch.compile(model, backend="neuron")
        _model_close_to_eager(compiled(x), model, x)
        model[0].weight.mul_(-1)
        _model_close_to_eager(compiled(x), model, x)
    assert backend.fallback_ops[ONEDNN] >= 1


def test_real_measurement_decides_and_logs(capsys):
    config.log = "compile"

    def f(x, w, b):
        return F.relu(F.linear(x, w, b))

    torch.testing.assert_close(_run(f, x, w, b), f(x, w, b), rtol=1e-5, atol=1e-5)
    err = capsys.readouterr().err
    assert "linear 256x256->384 + bias + relu: aten " in err and " us, onednn " in err and " us -> " in err, err


@pytest.mark.parametrize("f", [lambda x, w: F.gelu(x @ w) + 1, lambda x, w: F.relu(F.linear(x, w.t()))],
                         ids=["product", "linear"])
def test_an_expanded_input_is_measured_on_an_example_of_its_layout(f):
    """x = row.expand(3, 33) (stride 0): the measurement's example of the
    input, drawn with normal_ into that layout, raised (its elements
    overlap), and the whole graph ran eagerly with a warning."""
    xx, ww = _t((1, 33)).expand(3, 33), _t((33, 8), 1, 0.2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="neuron")(xx, ww)
    torch.testing.assert_close(got, f(xx, ww))
    assert not [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)]
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("door", ["neuron", "jit"])
def test_measuring_leaves_the_callers_random_numbers_as_they_were(door, monkeypatch):
    """The measurement runs the GEMMs on random examples, drawn from a
    generator of its own: before, from torch's, so a jit build moved the
    caller's random numbers on (a sampling generate() drew other tokens
    than eager's in the calls that built a variant; TorchDynamo restores
    them around its back end's compile itself)."""
    monkeypatch.setattr(backend, "_gemm_choices", backend._GemmChoices())  # measured here, not remembered
    measured = []
    real = gemm.measure

    def counted(*args, **kwargs):
        measured.append(1)
        return real(*args, **kwargs)

    def f(x, w, b):
        return F.relu(F.linear(x, w, b))

    compiled = torchneuron_jit.jit(f) if door == "jit" else torch.compile(f, backend="neuron")
    torch.manual_seed(7)
    want = torch.rand(8)
    torch.manual_seed(7)
    gemm.measure = counted
    try:
        with torch.no_grad():
            got = compiled(x, w, b)
    finally:
        gemm.measure = real
    assert measured, "no GEMM was measured: the test tests nothing"
    torch.testing.assert_close(got, f(x, w, b), rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.rand(8), want)


def test_a_second_process_reuses_the_choice_without_measuring(run_python):
    script = textwrap.dedent("""
        import json, sys
        import torch
        import torch.nn.functional as F
        import torchneuron_jit
        from torchneuron_jit import backend, gemm
        measured = []
        gemm.measure = lambda unit, kinds: measured.append(unit.describe()) or {"aten": 1.0, "onednn": 0.5}
        g = torch.Generator().manual_seed(0)
        x, w, b = torch.randn(64, 128, generator=g), torch.randn(96, 128, generator=g), torch.randn(96, generator=g)
        f = lambda x, w, b: F.relu(F.linear(x, w, b))
        with torch.no_grad():
            got = torch.compile(f, backend="neuron")(x, w, b)
        torch.testing.assert_close(got, f(x, w, b), rtol=1e-5, atol=1e-5)
        st = torchneuron_jit.stats()
        print(json.dumps({"measured": measured, "hits": st["cache_hits"], "lowered": st["graphs_lowered"],
                          "onednn": backend.fallback_ops["mkldnn._linear_pointwise.default"]}))
    """)
    first = run_python("-c", script)
    assert first.returncode == 0, first.stderr
    import json
    one = json.loads(first.stdout.strip().splitlines()[-1])
    assert one["measured"] == ["linear 64x128->96 + bias + relu"] and one["onednn"] == 1 and one["lowered"] == 1
    second = run_python("-c", script)
    assert second.returncode == 0, second.stderr
    two = json.loads(second.stdout.strip().splitlines()[-1])
    assert two == {"measured": [], "hits": 1, "lowered": 0, "onednn": 1}, two


def test_training_graphs_are_untouched(choose):
    measured = choose(True)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.ReLU())
    xs = x.clone().requires_grad_(True)
    out = torch.compile(model, backend="neuron")(xs)
    out.sum().backward()
    ref = x.clone().requires_grad_(True)
    model(ref).sum().backward()
    torch.testing.assert_close(xs.grad, ref.grad)
    assert measured == []


# -- packed weights (config.onednn_packed_weights) ----------------------------------------

PACKED = "oneDNN packed linear"


@pytest.fixture
def packed_on(choose):
    config.onednn_packed_weights = True
    return choose("packed")


@pytest.fixture
def packs(monkeypatch):
    """The list that gets an item each time a weight is packed."""
    made = []
    real = torch.ops.mkldnn._reorder_linear_weight

    class Counting:  # the op's other attributes (.default, which torch reads) are the real op's
        def __call__(self, *args):
            made.append(1)
            return real(*args)

        def __getattr__(self, name):
            return getattr(real, name)
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", Counting())
    return made


@pytest.mark.parametrize("epilogue", ["none", "relu", "gelu_tanh", "residual"])
def test_packed_weights_match_eager(packed_on, ops, epilogue):
    y = _t((4, 64, 384), 3)
    f = {"none": lambda x, w, b, y: F.linear(x, w, b),
         "relu": lambda x, w, b, y: F.relu(F.linear(x, w, b)),
         "gelu_tanh": lambda x, w, b, y: F.gelu(F.linear(x, w, b), approximate="tanh"),
         "residual": lambda x, w, b, y: F.linear(x, w, b) + y}[epilogue]
    got = _run(f, x, w, b, y)
    _close_to_eager(got, f, x, w, b, y)
    ran = ops()
    assert ran[PACKED] == 1 and ran[LINEAR] == 0 and ran[ONEDNN] == 0, dict(ran)


def test_packed_weight_follows_in_place_updates_and_replacement(packed_on):
    """The packed copy is remade when the weight was written in place
    (version counter), loaded (load_state_dict), or replaced (.data), and
    reused otherwise."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.ReLU()).eval()
    with torch.no_grad():
        compiled = torch.compile(model, backend="neuron")
        for step in range(4):
            _model_close_to_eager(compiled(x), model, x)
            if step == 0:
                model[0].weight.mul_(-0.5)
            elif step == 1:
                model.load_state_dict({k: v * 2 for k, v in model.state_dict().items()})
            elif step == 2:
                model[0].weight.data = torch.randn(384, 256) * 0.05
    assert backend.fallback_ops[PACKED] >= 1


def test_packed_weight_is_packed_once_while_it_stays_put(packed_on, packs):
    model = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.ReLU()).eval()
    with torch.no_grad():
        compiled = torch.compile(model, backend="neuron")
        for _ in range(5):
            compiled(x)
        assert len(packs) == 1
        model[0].weight.add_(1.0)
        _model_close_to_eager(compiled(x), model, x)
    assert len(packs) == 2


def test_a_stored_matrix_is_packed_once_while_it_stays_put(packed_on, packs):
    """A Conv1D weight's transposed view is made on every call: the packed
    copy follows the matrix it views, not the view."""
    model = Conv1D(256, 384).eval()
    with torch.no_grad():
        compiled = torch.compile(model, backend="neuron")
        for _ in range(5):
            compiled(x)
        assert len(packs) == 1
        model.weight.mul_(-0.5)
        _model_close_to_eager(compiled(x), model, x)
    assert len(packs) == 2 and backend.fallback_ops[PACKED] >= 1


def test_packed_is_only_timed_when_asked(choose, ops):
    choose("packed")  # packed would win, but the setting is off: oneDNN unpacked does

    def f(x, w, b):
        return F.relu(F.linear(x, w, b))

    _close_to_eager(_run(f, x, w, b), f, x, w, b)
    ran = ops()
    assert ran[ONEDNN] == 1 and ran[PACKED] == 0, dict(ran)


def test_an_activation_chained_on_goes_to_onednn_not_to_a_kernel(choose, ops, compiled):
    """linear -> gelu -> + x: the gelu is left out of pointwise kernels
    (TN_FUSE_LINEAR_ACT) so that oneDNN takes it as its post-op; with the
    setting off, gelu and the add are one generated kernel."""
    choose(True)
    x2 = _t((4, 64, 256), 5)
    w2 = _t((256, 256), 6, 0.06)

    def f(x, w, b):
        return x + F.gelu(F.linear(x, w, b))

    config.log = "compile"
    got = _run(f, x2, w2, b[:256])
    _close_to_eager(got, f, x2, w2, b[:256])
    ran = ops()
    assert ran[ONEDNN] == 1 and ran["aten.gelu.default"] == 0 and ran["aten.add.Tensor"] == 1, dict(ran)
    torch._dynamo.reset()
    config.onednn_linear = False
    compiled.mark()
    torch.testing.assert_close(_run(f, x2, w2, b[:256]), f(x2, w2, b[:256]))
    assert ["aten.gelu.default", "aten.add.Tensor"] in compiled.groups()


@pytest.mark.parametrize("packed", [False, True])
def test_four_threads_share_one_compiled_model(choose, in_threads, packed):
    """Concurrent calls of one compiled model: oneDNN linears (packed ones
    racing to pack on the first call), an argmax kernel, eager's numbers."""
    choose("packed" if packed else True)
    config.onednn_packed_weights = packed
    model = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.GELU(), torch.nn.Linear(384, 64)).eval()
    def f(t):
        logits = model(t)
        return logits, logits.argmax(-1)

    compiled = torch.compile(f, backend="neuron")
    inputs = [_t((32, 256), 10 + i) for i in range(4)]
    with torch.no_grad():
        want = [model(t) for t in inputs]

    def body(i):
        with torch.no_grad():
            for _ in range(25):
                logits, best = compiled(inputs[i])
                torch.testing.assert_close(logits, want[i], rtol=1e-5, atol=1e-5)
                assert torch.equal(best, logits.argmax(-1))  # the kernel's argmax of what it got

    with torch.no_grad():
        compiled(inputs[0])  # compiled once, on this thread
    in_threads(body)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_a_new_graph_with_a_timed_shape_times_nothing_in_a_new_process(run_python):
    """The choice per layer shape is kept in the persistent cache: another
    graph (a different head on the same layer), in another process, times
    only its new shape."""
    script = textwrap.dedent("""
        import json, sys
        import torch
        import torch.nn.functional as F
        import torchneuron_jit
        from torchneuron_jit import gemm
        measured = []
        gemm.measure = lambda unit, kinds: measured.append(unit.describe()) or {"aten": 1.0, "onednn": 0.5}
        g = torch.Generator().manual_seed(0)
        x, w, b = torch.randn(64, 128, generator=g), torch.randn(96, 128, generator=g), torch.randn(96, generator=g)
        w2 = torch.randn(10, 96, generator=g)
        heads = {"a": lambda x: F.relu(F.linear(x, w, b)) * 2,
                 "b": lambda x: F.linear(F.relu(F.linear(x, w, b)), w2)}
        f = heads[sys.argv[1]]
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(f, backend="neuron")(x), f(x), rtol=1e-5, atol=1e-5)
        print(json.dumps(measured))
    """)
    import json
    first = run_python("-c", script, "a")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout.strip().splitlines()[-1]) == ["linear 64x128->96 + bias + relu"]
    second = run_python("-c", script, "b")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.strip().splitlines()[-1]) == ["linear 64x96->10"]


@pytest.mark.parametrize("winner", ["packed", True])
def test_a_stored_plan_keeps_the_gemm_choice(choose, winner, monkeypatch):
    """jit's warm start runs the stored plan: the oneDNN call (packed or
    not) comes back as the cold process chose it, with nothing timed."""
    from torchneuron_jit import _planform
    config.onednn_packed_weights = winner == "packed"
    measured = choose(winner)
    loaded, real_load = [], _planform.load
    monkeypatch.setattr(_planform, "load", lambda form, eager: loaded.append(real_load(form, eager)) or loaded[-1])
    model = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.GELU(approximate="tanh")).eval()
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(torchneuron_jit.jit(model)(x), want, rtol=1e-5, atol=1e-5)
        timed, st0, ran0 = len(measured), torchneuron_jit.stats(), backend.fallback_ops.copy()
        again = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.GELU(approximate="tanh")).eval()
        again.load_state_dict(model.state_dict())
        jitted = torchneuron_jit.jit(again)
        for _ in range(2):
            torch.testing.assert_close(jitted(x), want, rtol=1e-5, atol=1e-5)
    st = torchneuron_jit.stats()
    assert st["plans_loaded"] - st0["plans_loaded"] == 1 and st["graphs_compiled"] == st0["graphs_compiled"]
    assert len(measured) == timed >= 1  # nothing measured again
    ran = backend.fallback_ops - ran0
    assert ran[PACKED if winner == "packed" else ONEDNN] == 1 and ran[LINEAR] == 0, dict(ran)
    (plan,) = loaded
    called = [c for _, c in plan.steps()]
    if winner == "packed":
        assert [type(c) for c in called if isinstance(c, gemm.PackedLinear)] == [gemm.PackedLinear], plan.dump()
    else:
        assert any(c is torch.ops.mkldnn._linear_pointwise.default._op for c in called), plan.dump()


# -- units whose rows change: a jit variant with dynamic sizes ----------------------------------------

@pytest.fixture
def crossing(monkeypatch):
    """Every unit measures oneDNN faster at the trace's rows and slower at
    the fewest rows (as MKL's sgemm is at a few rows); returns the list of
    (unit, fewest) measured."""
    measured = []

    def fake(unit, kinds=("onednn",), fewest=False):
        measured.append((unit.describe(), fewest))
        return {"aten": 0.1, "onednn": 0.3} if fewest else {"aten": 1.0, "onednn": 0.4}

    monkeypatch.setattr(gemm, "measure", fake)
    monkeypatch.setattr(backend, "_gemm_choices", backend._GemmChoices())
    return measured


def _switched(jf):
    """The SwitchedLinear steps of jf's variants' plans."""
    out = []
    for _, runner in jf.entries():
        plan = getattr(getattr(runner, "__self__", runner), "compiled", None)
        out.extend(c for c in (getattr(plan, "form", None) or {}).get("consts", ()) if isinstance(c, gemm.SwitchedLinear))
    return out


def test_dynamic_rows_run_onednn_from_where_the_measurements_cross(crossing):
    """A jit variant with dynamic lengths keeps its linear layers in
    oneDNN: from the rows where oneDNN's time crosses MKL's (taken linear
    between the fewest rows, 2 x 2, and the trace's, 2 x 40) up; below,
    the graph's own ops. Every length matches eager either way."""
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)

    def block(x):
        return lin2(F.gelu(lin1(x))) + x

    jf = torchneuron_jit.jit(block)
    with torch.no_grad(), config.patch(compile_blocking=True):
        for s in (3, 40, 5, 64, 9, 2, 100, 12):
            x = _t((2, s, 256), s)
            torch.testing.assert_close(jf(x), block(x), rtol=1e-5, atol=1e-5)
    switched = _switched(torchneuron_jit._jit._jit_function_of(jf))
    assert [u.rows for u in switched] == [25, 25], (switched, crossing)  # 4 + 76 * 0.205 / 0.755, rounded up
    # their epilogues in the oneDNN call as in a static variant (the views around a flat linear of symbolic
    # rows go too): left out, a dynamic BERT's steady p50 was 0.75x its static variant's
    assert [d for d, fewest in crossing if fewest] == ["linear 80 (dynamic)x256->512 + bias + gelu",
                                                       "linear 80 (dynamic)x512->256 + bias + residual"], crossing


def test_rows_that_divide_by_a_size_are_measured_where_they_are_whole():
    """The fewest rows put each symbol at 2; rows that divide by a size
    derived from another (transformers' Swin counts its windows as
    (s // 4 + 1) // 8 and divides by it) raised ZeroDivisionError there,
    and Swin's whole graph ran eagerly with a warning. The symbols go up
    from 2 to where every size is a whole number of 1 or more."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    env = ShapeEnv()
    s = env.create_symintnode(env.create_symbol(40, ConstantSource("s"), dynamic_dim=DimDynamic.DYNAMIC), hint=40)
    k = s // 8
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    with FakeTensorMode(shape_env=env):
        x.meta["val"] = torch.empty(2, (s // k) * k, 64)  # s // 8 is 0 at s = 2, 4: whole from s = 8 (s // 1 * 1)
        w.meta["val"] = torch.empty(96, 64)
    unit = gemm.Unit([x], x, w, None)
    assert (unit.rows(), unit.rows(fewest=True)) == (2 * 40, 2 * 8)
    assert gemm._hinted(x, fewest=True) == ((2, 8, 64), (512, 64, 1))


def test_switched_linear_is_the_graphs_ops_below_its_rows_and_onednn_from_them():
    w, b, other = _t((384, 256), 1, 0.06), _t((384,), 2), _t((4, 8, 384), 3)
    for attr, algorithm, bias_added in [("gelu", "tanh", False), ("relu", "", True), ("add", "", False),
                                        ("none", "", True)]:
        unit = gemm.SwitchedLinear(attr, algorithm, 16, bias_added)
        for rows in (8, 16, 32):
            x = _t((4, rows // 4, 256), rows)
            o = other[:, :rows // 4]
            got = unit(x, w, b, o if attr == "add" else None)
            if rows < 16:
                y = F.linear(x, w) + b if bias_added else F.linear(x, w, b)
                want = {"gelu": lambda: F.gelu(y, approximate=algorithm), "relu": lambda: F.relu(y),
                        "add": lambda: y + o, "none": lambda: y}[attr]()
            elif attr == "add":
                want = torch.ops.mkldnn._linear_pointwise.binary(x, o, w, b, "add")
            else:
                want = torch.ops.mkldnn._linear_pointwise.default(x, w, b, attr, [], algorithm)
            assert torch.equal(got, want), (attr, rows)


def test_a_switched_unit_survives_the_plans_stored_form():
    from torchneuron_jit import _planform
    unit = gemm.SwitchedLinear("gelu", "none", 25, True)
    back = _planform._value(_planform._const(unit, unit))
    assert isinstance(back, gemm.SwitchedLinear) and vars(back) == vars(unit)


def test_a_sample_beside_a_jitted_call_does_not_count(monkeypatch):
    """A background build of jit times oneDNN against MKL while calls are
    served: a sample during which a jitted call began (their PyTorch threads
    on the same cores) is dropped, and sampling goes on until enough quiet
    ones are taken. Here the first six runs of one variant each overlap a
    call and take 20 ms; taken, they made it the slower one."""
    runs, calls = [0], [0]

    class Counters:  # what _C reports of the jitted calls of other threads
        @staticmethod
        def build_calls():
            return 0, calls[0]

        @staticmethod
        def build_pauses():
            return 0

    def beside_calls():
        runs[0] += 1
        if runs[0] <= 6:
            calls[0] += 1
            time.sleep(0.02)

    monkeypatch.setattr(gemm, "_C", Counters)
    overlapped, quiet = gemm._least_seconds([beside_calls, lambda: None])
    assert overlapped < 0.01 and quiet < 0.01
    assert runs[0] >= 6 + gemm.MIN_SAMPLES


def test_a_background_build_runs_its_ops_on_one_openmp_thread_and_measures_on_the_callers(monkeypatch):
    """GNU OpenMP keeps a team for each thread that ran a parallel region,
    alive with the thread, and more threads than cores make every call's
    parallel regions wake theirs from sleep (an idle second team: eager
    calls 1.12-1.20x slower). A build's own ops run on one thread; its GEMM
    measurements on the calling thread's count, on a thread that ends with
    them. Also after torch.set_num_threads, whose count PyTorch gives each
    thread at its first op."""
    import threading
    if torch.get_num_threads() < 2:
        pytest.skip("one OpenMP thread here: nothing to tell apart")
    torch.set_num_threads(torch.get_num_threads())
    seen = {}
    measure, least = gemm.measure, gemm._least_seconds

    def measure_here(*args, **kwargs):
        seen.setdefault("build", torch.get_num_threads())
        return measure(*args, **kwargs)

    def least_here(fns):
        seen.setdefault("measure", (torch.get_num_threads(), threading.current_thread().name))
        return least(fns)

    monkeypatch.setattr(gemm, "measure", measure_here)
    monkeypatch.setattr(gemm, "_least_seconds", least_here)
    monkeypatch.setattr(backend, "_gemm_choices", backend._GemmChoices())
    model = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.ReLU()).eval()
    x = torch.randn(24, 96)
    with torch.no_grad(), config.patch(compile_blocking=False, jit_trace_records=False):
        f = torchneuron_jit.jit(model)
        _model_close_to_eager(f(x), model, x)  # eager's answer; the build starts
        assert torchneuron_jit._jit.wait(120)
        _model_close_to_eager(f(x), model, x)
    assert seen == {"build": 1, "measure": (torch.get_num_threads(), "torchneuron_jit measure")}, seen
    assert not any(t.name == "torchneuron_jit measure" for t in threading.enumerate())


def test_build_omp_threads_sets_this_threads_count_only():
    """gemm.own_threads: after PyTorch's per-thread lazy init (which gives a
    new thread torch.set_num_threads' count at its first op), so it holds."""
    import threading
    got, here = {}, torch.get_num_threads()
    torch.set_num_threads(here)  # as a user does: the count every new thread gets at its first op

    def other():
        gemm.own_threads(1)
        got["before"] = torchneuron_jit._C.build_omp_threads(1)
        got["after"] = torch.get_num_threads()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert got["after"] == 1 and got["before"] >= 1
    assert torch.get_num_threads() == here  # this thread keeps its own
    with pytest.raises(ValueError, match="build_omp_threads"):
        torchneuron_jit._C.build_omp_threads(0)


def test_build_calls_counts_the_jitted_calls_and_the_plans_run():
    @torchneuron_jit.jit
    def f(x):
        return x * 2
    in_flight, begun = torchneuron_jit._C.build_calls()
    x = torch.ones(3)
    with config.patch(compile_blocking=True):
        for _ in range(3):
            torch.testing.assert_close(f(x), x * 2)
    after_jit = torchneuron_jit._C.build_calls()
    assert after_jit[0] == 0 and in_flight == 0
    assert after_jit[1] >= begun + 3 + 2  # each call, and the plan its last two ran (the first traced)
    c = torch.compile(lambda x: x * 3, backend="neuron")  # the other door's plans are served calls too
    for _ in range(2):
        torch.testing.assert_close(c(x), x * 3)
    assert torchneuron_jit._C.build_calls() == (0, after_jit[1] + 2)


def test_a_build_inside_its_own_call_measures_without_waiting_for_that_call(monkeypatch):
    """compile_blocking builds inside the jitted call that traced: that call
    waits for its build and runs nothing beside its measurements. Counted
    as a call beside them, every sample was dropped and each measurement ran
    MAX_ROUNDS rounds (HF BERT's first build: 326 of its 537 ms)."""
    import threading
    seen = []
    least = gemm._least_seconds

    def least_here(fns):
        runs = [0]

        def counted(fn):
            def run():
                runs[0] += 1
                return fn()
            return run
        out = least([counted(fn) for fn in fns])
        seen.append((torchneuron_jit._C.build_calls()[0], runs[0] // len(fns)))
        return out

    monkeypatch.setattr(gemm, "_least_seconds", least_here)
    monkeypatch.setattr(backend, "_gemm_choices", backend._GemmChoices())
    model = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.ReLU()).eval()
    x = torch.randn(24, 96)
    with torch.no_grad(), config.patch(compile_blocking=True, jit_trace_records=False):
        f = torchneuron_jit.jit(model)
        _model_close_to_eager(f(x), model, x)
        _model_close_to_eager(f(x), model, x)
    assert seen and all(in_flight == 0 and runs <= gemm.MAX_SAMPLES + 1 for in_flight, runs in seen), seen
    # the calls of other threads still count
    started, release, seen_there = threading.Event(), threading.Event(), []

    @torchneuron_jit.disable
    def held(t):  # a jitted call that stays in flight until released
        started.set()
        release.wait(10)
        return t + 1

    t = threading.Thread(target=torchneuron_jit.jit(held), args=(torch.ones(2),))
    t.start()
    try:
        assert started.wait(10)
        seen_there.append(torchneuron_jit._C.build_calls()[0])
    finally:
        release.set()
        t.join(10)
    assert seen_there == [1]
