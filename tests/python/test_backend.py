"""torch.compile(backend="neuron"): registration, parity with eager, degradation."""
import copy
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import backend


pytestmark = pytest.mark.usefixtures("fresh_backend")


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4)).eval()


def test_entry_point_without_importing_the_package():
    code = (
        "import sys, torch\n"
        "m = torch.nn.Linear(4, 3).eval()\n"
        "x = torch.randn(2, 4)\n"
        "with torch.no_grad():\n"
        "    y = torch.compile(m, backend='neuron')(x)\n"
        "torch.testing.assert_close(y, m(x))\n"
        "print('loaded' if 'torchneuron_jit.backend' in sys.modules else 'missing')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("loaded")


def test_inference_matches_eager_and_counts():
    m, x = _mlp(), torch.randn(8, 16)
    with torch.no_grad():
        y = torch.compile(m, backend="neuron")(x)
        torch.testing.assert_close(y, m(x))
    st = torchneuron_jit.stats()
    assert st["graphs_compiled"] == 1
    assert st["eager_fallbacks"] == 0
    assert st["fallback_nodes"] + st["graphs_lowered"] > 0


def test_inductors_mode_and_options_are_taken_without_a_log_line_per_graph(capfd):
    """torch.compile passes mode and options to every back end: aot_autograd
    logged "ignoring extra kwargs" for each graph (twice a graph break).
    mode changes nothing; options get one warning naming them."""
    def f(x):
        y = torch.nn.functional.gelu(x) * 2
        torch._dynamo.graph_break()
        return y.softmax(-1)

    x = torch.randn(4, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.compile(f, backend="neuron", mode="max-autotune")(x), f(x))
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(f, backend="neuron", options={"epilogue_fusion": True})(x), f(x))
    ours = [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)]
    assert len(ours) == 1 and "does not read options (epilogue_fusion)" in ours[0], ours
    assert "ignoring extra kwargs" not in capfd.readouterr().err


def test_a_mode_torch_compile_does_not_know_gets_one_warning():
    """mode="max-autotun" (a typo Inductor refuses) was taken without a word."""
    f = lambda x: torch.nn.functional.gelu(x) * 2
    x = torch.randn(4, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = torch.compile(f, backend="neuron", mode="max-autotun")
        for _ in range(2):
            torch.testing.assert_close(c(x), f(x))
    ours = [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)]
    assert len(ours) == 1 and "mode='max-autotun' is none of torch.compile's modes" in ours[0], ours
    assert "'max-autotune'" in ours[0], ours


def test_a_training_graph_runs_eagers_own_kernels():
    """A graph that needs gradients runs eagerly, and with eager's kernels:
    a train-mode batch norm's backward ran as its decomposition, whose
    gradients were some ulps off eager's (conv weight 4e-5 off, outside
    assert_close, for each of 6 seeds)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    ref = copy.deepcopy(m)
    x = torch.randn(4, 3, 16, 16)
    (torch.compile(m, backend="neuron")(x) ** 2).sum().backward()
    (ref(x) ** 2).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
    torch.testing.assert_close(m[1].running_var, ref[1].running_var, rtol=0, atol=0)


def test_training_graphs_stay_correct():
    m = _mlp().train()
    x = torch.randn(8, 16, requires_grad=True)
    ref_m = _mlp().train()
    ref_x = x.detach().clone().requires_grad_()
    torch.compile(m, backend="neuron")(x).sum().backward()
    ref_m(ref_x).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert torchneuron_jit.stats()["training_graphs"] >= 1


def test_a_function_that_turns_grad_off_itself_is_compiled_for_inference():
    """@torch.no_grad() under torch.compile, or a with-block around the
    body, called with grad mode on: no output needs gradients, and the
    graph is compiled (it ran wholly eagerly, counted as a training graph,
    with a warning to use torch.no_grad()). A graph whose output still
    needs them stays a training graph, with eager's gradients."""
    m = _mlp()

    @torch.compile(backend="neuron")
    @torch.no_grad()
    def predict(x):
        return m(x).softmax(-1)

    def inside(x):
        with torch.no_grad():
            return m(x).relu()

    def partly(x):
        with torch.no_grad():
            h = m[0](x)
        return m[3](m[2](m[1](h)))

    x = torch.randn(8, 16)
    before = torchneuron_jit.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = predict(x)
        got_inside = torch.compile(inside, backend="neuron")(x)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x).softmax(-1))
        torch.testing.assert_close(got_inside, m(x).relu())
    assert not got.requires_grad and not got_inside.requires_grad
    after = torchneuron_jit.stats()
    assert after["graphs_compiled"] - before["graphs_compiled"] == 2
    assert after["training_graphs"] == before["training_graphs"]
    assert not [w for w in caught if "needs gradients" in str(w.message)]
    ref = copy.deepcopy(m)
    torch.compile(partly, backend="neuron")(x).sum().backward()
    with torch.no_grad():
        h = ref[0](x)
    ref[3](ref[2](ref[1](h))).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        if q.grad is None:
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, q.grad)
    assert torchneuron_jit.stats()["training_graphs"] == after["training_graphs"] + 1


def test_an_inference_call_without_no_grad_says_once_that_it_runs_eagerly():
    """model.eval(); torch.compile(model)(x) with grad mode on: the graph
    needs gradients (the parameters require them) and ran wholly eagerly
    with no word; one warning now says so and what to do."""
    m = _mlp().eval()
    c = torch.compile(m, backend="neuron")
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(c(x), m(x))
        with torch.no_grad():
            torch.testing.assert_close(c(x), m(x))
    words = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(words) == 1 and "needs gradients" in words[0] and "torch.no_grad()" in words[0], words
    assert caught[0].filename == __file__, caught[0].filename  # the user's line


_META_AND_FAKE = r"""
import torch, torchneuron_jit
from torch._subclasses.fake_tensor import FakeTensorMode
f = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="neuron")
with torch.no_grad():
    x = torch.randn(8, 16)
    torch.testing.assert_close(f(x), torch.sin(x) * 2 + 1)  # compiled first, for real tensors
    r = f(torch.randn(8, 16, device="meta"))
    print("meta", r.device, tuple(r.shape))
    with FakeTensorMode() as mode:
        r = f(mode.from_tensor(torch.randn(8, 16)))
    print("fake", type(r).__name__, tuple(r.shape))
    torch.testing.assert_close(f(x), torch.sin(x) * 2 + 1)
print("eager fallbacks", torchneuron_jit.stats()["eager_fallbacks"])
"""


def test_meta_and_fake_tensors_get_eagers_kind_of_result(run_python):
    """Shape inference through a compiled function: meta tensors, or fake
    ones under FakeTensorMode, made our kernels read memory those have not
    (a segfault; found by a helper's probe). Meta graphs run as Dynamo
    captured them; a kernel given a tensor without memory stops the plan,
    and that call runs eagerly, while real tensors' calls stay compiled."""
    r = run_python("-c", _META_AND_FAKE)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "meta meta (8, 16)" in r.stdout and "fake FakeTensor (8, 16)" in r.stdout, r.stdout
    assert "eager fallbacks 0" in r.stdout and "failed at run time" not in r.stderr, (r.stdout, r.stderr[-2000:])


_TRAIN_UNDER_W_ERROR = r"""
import torch, torchneuron_jit
cm = torch.compile(torch.nn.Linear(4, 4), backend="neuron")
try:
    cm(torch.randn(2, 4)).sum().backward()
except Exception as e:
    print(type(e).__name__, "|", " ".join(str(e).splitlines()))
"""


def test_a_warning_of_ours_under_w_error_raises_as_itself(run_python):
    """python -W error makes our one warning an exception: neuron() took it
    for aot_autograd refusing the graph ("aot_autograd could not take a
    graph, running it eagerly (RuntimeWarning: ...)") while the call raised."""
    r = run_python("-W", "error", "-c", _TRAIN_UNDER_W_ERROR)
    assert "needs gradients" in r.stdout and "aot_autograd could not take" not in r.stdout, (r.stdout, r.stderr[-2000:])


def test_double_backward_through_a_graph_that_needs_gradients():
    """A gradient penalty: autograd.grad(create_graph=True), then backward
    through the gradient. aot_autograd's joint graph raised "does not
    currently support double backward" where eager (and backend="eager")
    gives the second derivative."""
    m = _mlp().train()
    ref = copy.deepcopy(m)
    x = torch.randn(8, 16)
    for model, door in ((m, torch.compile(m, backend="neuron")), (ref, ref)):
        xg = x.clone().requires_grad_()
        grad, = torch.autograd.grad(door(xg).sum(), xg, create_graph=True)
        (grad.norm() ** 2).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


class _CheckpointedDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.drop, self.head = torch.nn.Linear(16, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2)

    def block(self, x):
        return self.drop(torch.relu(self.lin(x)))

    def forward(self, x):
        return self.head(torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False))


@pytest.mark.parametrize("penalty", [False, True])
def test_dropout_inside_a_checkpoint_gets_eagers_gradients(penalty):
    """Gradient checkpointing (HF's gradient_checkpointing_enable()) over a
    dropout in train mode: Dynamo's graph run as captured recomputed the
    block in the backward with another dropout mask (backend="eager" does
    too: the checkpoint op's eager form turns preserve_rng_state off): the
    loss was eager's and the gradients up to 0.6 off (found by a helper's
    probe). Its checkpoints run eager's checkpoint, which double backward
    (a gradient penalty) goes through too; aot_autograd's graphs refused it."""
    torch.manual_seed(0)
    m = _CheckpointedDropout().train()
    ref = copy.deepcopy(m)
    x = torch.randn(6, 16)
    for door in (torch.compile(m, backend="neuron"), ref):
        torch.manual_seed(1)
        for _ in range(2):
            xg = x.clone().requires_grad_()
            y = door(xg).square().sum()
            if penalty:
                grad, = torch.autograd.grad(y, xg, create_graph=True)
                y = y + grad.square().sum()
            y.backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_failed_compile_degrades_to_eager_with_one_warning():
    m, x = _mlp(), torch.randn(8, 16)
    backend.fail_next_compile = "injected lowering failure"
    c = torch.compile(m, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            y = c(x)
            y2 = c(x)
    torch.testing.assert_close(y, m(x))
    torch.testing.assert_close(y2, m(x))
    ours = [w for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(ours) == 1
    assert "injected lowering failure" in str(ours[0].message)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 1


def test_log_lines_name_fallback_ops():
    code = (
        "import torch, torchneuron_jit\n"
        "f = torch.compile(lambda x: torch.cumsum(x * 2, 0), backend='neuron')\n"
        "x = torch.randn(5, 3)\n"
        "torch.testing.assert_close(f(x), torch.cumsum(x * 2, 0))\n"
    )
    env = dict(os.environ, TORCHNEURON_LOG="fallback,compile")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[torchneuron_jit fallback] aten::cumsum" in out.stderr
    assert "[torchneuron_jit compile]" in out.stderr


def test_decomposition_table_keeps_whole_ops():
    table = backend.decompositions()
    aten = torch.ops.aten
    for op in (aten._softmax.default, aten.native_layer_norm.default, aten.gelu.default,
               aten.addmm.default, aten.silu.default):
        assert op not in table
    assert aten.hardswish.default in table  # the rest of Core ATen still decomposes


# -- copies nobody observes ----------------------------------------------------

def _compile_log(capsys, f, *args):
    from torchneuron_jit import config
    config.log = "compile"
    capsys.readouterr()
    with torch.no_grad():
        out = torch.compile(f, backend="neuron")(*args)
    return out, capsys.readouterr().err


def test_eval_dropout_copies_are_dropped(capsys):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.GELU(),
                            torch.nn.Dropout(0.1), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        want = m(x)
    out, log = _compile_log(capsys, m, x)
    torch.testing.assert_close(out, want)
    assert "dropped 2 copies nobody observes" in log, log


def test_copies_that_reach_the_outputs_are_kept(capsys):
    def f(x):
        c = x.clone()
        return c, c.t(), (x.clone() + 1)

    x = torch.randn(3, 4)
    (c, ct, y), log = _compile_log(capsys, f, x)
    assert "copies nobody observes" in log  # the third clone goes
    assert c.data_ptr() != x.data_ptr() and ct.data_ptr() != x.data_ptr()
    c.add_(1)  # the caller owns its copy: x is untouched
    torch.testing.assert_close(x + 1, c)
    torch.testing.assert_close(y, x + 1)


def test_input_mutation_with_a_group_out_of_graph_order(capsys):
    """aot_autograd returns x + 1 first, so the canonical order computes it
    before y * 2, while gm's order has it after: the kernel needing both
    must still come after its inputs (it once came before, and the graph
    fell back to eager)."""
    def f(x, y):
        z = y.clone() * 2
        x.add_(1)
        return z + x

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    x0 = x.clone()
    out, log = _compile_log(capsys, f, x, y)
    torch.testing.assert_close(x, x0 + 1)
    torch.testing.assert_close(out, y * 2 + x0 + 1)
    assert "fused 2 ops" in log and torchneuron_jit.stats()["eager_fallbacks"] == 0, log


def test_contiguous_copy_of_a_strided_tensor_is_kept(capsys):
    def f(x):
        return x.t().contiguous().view(-1) * 2

    x = torch.randn(3, 4)
    out, log = _compile_log(capsys, f, x)
    torch.testing.assert_close(out, x.t().contiguous().view(-1) * 2)
    assert "copies nobody observes" not in log


@pytest.mark.parametrize("door", ["jit", "neuron"])
def test_an_eval_dropout_copy_of_an_expanded_tensor_that_a_view_reshapes_is_kept(door):
    """Dropout in eval mode copies (torch's Python decomposition: a clone,
    dense); a reshape after it is a view of that copy. Dropped, the view
    was of the expanded tensor, which no view of those sizes takes: the
    graph failed at run time and ran eagerly from then on (transformers'
    XLNet: its positional embedding, expanded over the batch, through
    self.dropout and an einsum). At symbolic sizes and static ones."""
    def f(x, b: int):
        pe = (x * 2)[:, None, :].expand(-1, b, -1)
        pe = torch.nn.functional.dropout(pe, p=0.1, training=False)
        return pe.reshape(-1, x.shape[-1]) + 1

    from torchneuron_jit import config
    g = torchneuron_jit.jit(f) if door == "jit" else torch.compile(f, backend="neuron", dynamic=True)
    with torch.no_grad(), config.patch(compile_blocking=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b, s in [(2, 8), (2, 8), (3, 11), (3, 11), (4, 13)]:
            x = torch.randn(s, 64)
            torch.testing.assert_close(g(x, b), f(x, b))
    assert [str(c.message) for c in caught if "torchneuron_jit" in str(c.message)] == []
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


# -- repeated nodes ---------------------------------------------------------------

def test_a_mask_built_again_in_every_layer_is_built_once(capsys):
    """HF's attention turns one bool mask into the same float mask in every
    layer: the graph computes it once, and the answers are eager's."""
    def f(x, mask):
        for _ in range(3):
            bias = torch.where(mask, torch.tensor(0.0), torch.tensor(float("-inf")))
            x = torch.softmax(x @ x.transpose(-1, -2) * 0.1 + bias, -1) @ x
        return x

    x, mask = torch.randn(2, 6, 8), torch.rand(2, 6, 6) > 0.3
    mask[..., 0] = True
    out, log = _compile_log(capsys, f, x, mask)
    torch.testing.assert_close(out, f(x, mask))
    assert "merged 6 repeated nodes" in log, log  # the second and third layers' two constants and where


def test_repeats_that_both_reach_the_outputs_stay_two_tensors(capsys):
    def f(x):
        y = x + 1
        return y, x + 1, (x + 1).t()

    x = torch.randn(3, 4)
    (a, b, c), log = _compile_log(capsys, f, x)
    assert a.data_ptr() != b.data_ptr()  # eager's caller gets two tensors; writing one leaves the other
    a.add_(1)
    torch.testing.assert_close(b, x + 1)
    torch.testing.assert_close(c, (x + 1).t())


@pytest.mark.parametrize("door", ["neuron", "jit"])
def test_repeats_of_an_op_of_several_results_that_reach_the_outputs_stay_two_tensors(door):
    """x.sort(...).indices beside x.argsort(...), topk twice, max over a dim
    twice: the ops themselves reach no output, their getitems do; merged,
    both outputs were one tensor, and writing one changed the other."""
    fns = [lambda x: (x.sort(dim=-1, stable=True).indices, x.argsort(dim=-1, stable=True)),
           lambda x: (x.topk(2).indices, x.topk(2)[1]),
           lambda x: (torch.max(x, 1).values, torch.max(x, 1)[0])]
    for f in fns:
        torch._dynamo.reset()
        c = torchneuron_jit.jit(f) if door == "jit" else torch.compile(f, backend="neuron")
        for _ in range(3):
            x = torch.randn(4, 6)
            a, b = c(x)
            want_a, want_b = f(x)
            assert a is not b and a.data_ptr() != b.data_ptr()
            a.add_(1)
            torch.testing.assert_close((a, b), (want_a + 1, want_b))


def test_arguments_of_another_type_or_sign_are_another_node(capsys):
    def f(x, i):  # the products and sums inside the graph, where repeats are merged
        return torch.cat([x * 0.0, x * -0.0]), (i + 1) * 7 // 2, (i + 1.0) * 7 // 2

    x, i = -torch.rand(5) - 0.5, torch.arange(5)
    out, log = _compile_log(capsys, f, x, i)
    want = f(x, i)
    for got, w in zip(out, want):
        assert got.dtype == w.dtype and torch.equal(got, w) and torch.equal(got.signbit(), w.signbit()), (got, w)
    assert "repeated" not in log, log


def test_a_graph_aot_autograd_refuses_runs_eagerly_with_one_warning():
    """x.data = ... beside another write of x: aot_autograd's own analysis
    raises (an AssertionError) before our compiler sees the graph; the
    user's program got BackendCompilerFailed instead of eager's answer."""
    def f(x):
        x.data = x.data * 2
        return x + 1

    want_x, got_x = torch.ones(3), torch.ones(3)
    want = f(want_x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="neuron")(got_x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_x, want_x)
    words = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(words) == 1 and "aot_autograd could not take a graph, running it eagerly" in words[0], words
    graphs = [v["graph"] for v in torchneuron_jit.explain(torch.compile(f, backend="neuron")).variants]
    assert any("runs eagerly: aot_autograd could not take it" in g for g in graphs), graphs


@pytest.mark.parametrize("fn, good, bad", [
    (torch.nn.functional.binary_cross_entropy, (torch.rand(3), torch.rand(3)),
     (torch.tensor([0.5, 1.5, 0.2]), torch.rand(3))),
    (torch.nn.functional.cross_entropy, (torch.randn(2, 4), torch.tensor([1, 3])),
     (torch.randn(2, 4), torch.tensor([1, 4]))),
    (torch.nn.functional.nll_loss, (torch.randn(2, 4), torch.tensor([1, 3])),
     (torch.randn(2, 4), torch.tensor([-1, 0]))),
    (lambda x, i, s: x.index_add(0, i, s), (torch.zeros(4, 3), torch.tensor([0, 2]), torch.ones(2, 3)),
     (torch.zeros(4, 3), torch.tensor([0, -1]), torch.ones(2, 3))),
    (lambda x, i, s: x.index_add(0, i, s), (torch.zeros(4, 3), torch.tensor([0, 2]), torch.ones(2, 3)),
     (torch.zeros(4, 3), torch.tensor([0, 7]), torch.ones(2, 3))),
    (lambda x, i, s: x.index_copy(0, i, s), (torch.zeros(4, 3), torch.tensor([0, 2]), torch.ones(2, 3)),
     (torch.zeros(4, 3), torch.tensor([0, -1]), torch.ones(2, 3))),
    (lambda x, i: torch.nn.functional.max_unpool2d(x, i, 2),
     torch.nn.functional.max_pool2d(torch.randn(1, 1, 4, 4), 2, return_indices=True),
     (torch.randn(1, 1, 2, 2), torch.tensor([[[[0, 3], [-1, 20]]]]))),
], ids=["binary_cross_entropy", "cross_entropy", "nll_loss", "index_add_negative", "index_add_past_the_end",
        "index_copy_negative", "max_unpool2d"])
def test_an_op_given_bad_input_raises_eagers_exception(fn, good, bad):
    """The decompositions of the losses check nothing: an input outside
    [0, 1] gave NaN where eager raises, a target out of range a gather's
    RuntimeError where eager raises IndexError. Those of index_add,
    index_copy and max_unpool index with index_put, which wrapped a negative
    index (a wrong row written, no error) and raised IndexError for one past
    the end where eager raises RuntimeError."""
    c = torch.compile(lambda *a: fn(*a), backend="neuron")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(c(*good), fn(*good))
        with pytest.raises(Exception) as want:
            fn(*bad)
        with pytest.raises(want.type, match=re.escape(str(want.value))):
            c(*bad)


_INTS = torch.tensor([[1, -2, 3, 0]])


@pytest.mark.parametrize("f, x", [
    (lambda a: torch.lerp(a, a * 2, 0.5), _INTS),
    (lambda a: torch.nn.functional.softplus(a), _INTS),
    (lambda a: torch.nn.functional.hardswish(a), _INTS),
    (lambda a: torch.frac(a), _INTS),
    (lambda a: torch.addcdiv(a, a, a), _INTS > 0),
    (lambda a: torch.trace(a), _INTS > 0),
], ids=["lerp", "softplus", "hardswish", "frac", "addcdiv_bool", "trace_bool"])
def test_an_op_eager_refuses_for_integers_raises_as_eager(f, x):
    """The decompositions compute in any dtype: softplus of int64 gave ints,
    addcdiv of bools NaN, where eager's kernels raise. Given an integer or
    bool tensor, a decomposition whose op eager's kernel refuses for those
    dtypes declines, and the op raises as eager's does."""
    with pytest.raises(Exception) as want:
        f(x)
    with pytest.raises(want.type, match=re.escape(str(want.value))):
        torch.compile(f, backend="neuron")(x)


def test_index_add_of_bools_with_alpha_gives_eagers_result():
    """The decomposition multiplied the bool source by alpha (int64) and its
    index_put refused the mixed dtypes, a RuntimeError where eager answers."""
    f = lambda x, i, s: x.index_add(0, i, s, alpha=2)  # noqa: E731
    args = (torch.zeros(3, 4, dtype=torch.bool), torch.tensor([0, 2]),
            torch.tensor([[1, 0, 1, 1], [0, 0, 1, 0]]).bool())
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="neuron")(*args), f(*args))


def test_random_draws_are_never_merged():
    def f(x):
        return x + torch.rand(1000), x + torch.rand(1000)

    with torch.no_grad():
        a, b = torch.compile(f, backend="neuron")(torch.zeros(1000))
    assert not torch.equal(a, b)


# -- chains of views ----------------------------------------------------------------

def test_view_chains_over_computed_tensors_become_one_as_strided(capsys):
    def heads(x, w):
        qkv = x @ w                                           # (b*s, 3*h*d), computed in the graph
        q = qkv.view(2, 5, 3, 4, 8).permute(2, 0, 3, 1, 4)[0]  # view, permute, select: one chain
        return torch.softmax(q @ q.transpose(-1, -2), -1), qkv.view(10, 3, 32)

    x, w = torch.randn(10, 16), torch.randn(16, 96)
    with torch.no_grad():
        want = heads(x, w)
    out, log = _compile_log(capsys, heads, x, w)
    for o, e in zip(out, want):
        torch.testing.assert_close(o, e)
    assert "collapsed view chains" in log, log
    assert out[1].shape == (10, 3, 32) and out[1].stride() == want[1].stride()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_a_view_as_another_dtype_is_not_collapsed_into_as_strided(dtype):
    """x.view(torch.int32) reads x's bytes as int32: as_strided over the
    float32 result kept its dtype (float values where eager has bits) or
    went past its storage for a smaller element."""
    def bits(x):
        return (x * 2).view(dtype).view(-1, 2), ((x * 1).view(torch.int32) & 0x7FFFFFFF).view(torch.float32) + 0

    x = torch.randn(8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # not the eager answer after a failed step: the graph's own
        want = bits(x)
        got = torch.compile(bits, backend="neuron")(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), (g, w)


def test_views_of_inputs_and_dynamic_shapes_stay_views(capsys):
    def f(x):
        return x.view(4, 6).t().reshape(24) * 2  # over a graph input: its offset is the caller's

    base = torch.randn(30)
    x = base[6:]  # a view with a storage offset
    out, log = _compile_log(capsys, f, x)
    torch.testing.assert_close(out, x.view(4, 6).t().reshape(24) * 2)
    assert "collapsed view chains" not in log

    def g(x):
        return (x * 2).view(x.shape[0], 2, -1).permute(2, 0, 1).sum(0)

    c = torch.compile(g, backend="neuron")
    with torch.no_grad():
        for n in (3, 5, 7):  # the later graphs are dynamic: left as they are
            x = torch.randn(n, 8)
            torch.testing.assert_close(c(x), g(x))


# -- linear layers put back together -----------------------------------------------

@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8), (2, 3, 4, 8)])
def test_linear_layers_are_recomposed(capsys, shape):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4, bias=False)).eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        want = m(x)
    out, log = _compile_log(capsys, m, x)
    torch.testing.assert_close(out, want)
    assert "recomposed 2 linear layers" in log, log


def test_what_is_not_a_linear_layer_stays(capsys):
    def f(x, w, b):
        wt = w.t()
        return torch.addmm(b, x, wt, beta=0.5), x @ wt  # beta, and one transpose read twice

    x, w, b = torch.randn(5, 8), torch.randn(6, 8), torch.randn(6)
    (y, z), log = _compile_log(capsys, f, x, w, b)
    torch.testing.assert_close(y, torch.addmm(b, x, w.t(), beta=0.5))
    torch.testing.assert_close(z, x @ w.t())
    assert "recomposed" not in log, log


def test_no_recomposition_under_gemm_fusion(capsys):
    from torchneuron_jit import config
    config.gemm_fusion = True
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        want = m(x)
    out, log = _compile_log(capsys, m, x)
    torch.testing.assert_close(out, want)
    assert "recomposed" not in log and "aten.addmm.default, aten.relu.default" in log, log


def test_a_copy_returned_through_unsafe_view_is_kept():
    """_unsafe_view aliases its input though its schema does not say so:
    dropping the clone would hand the caller its own input back."""
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    c = g.call_function(aten.clone.default, (x,))
    g.output((g.call_function(aten._unsafe_view.default, (c, [6])),))
    assert backend._drop_copies(g) == 0
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    x = torch.randn(2, 3)
    (out,) = gm(x)
    assert out.data_ptr() != x.data_ptr()


def test_tensor_constants_are_graph_inputs():
    """torch.tensor(...) inside compiled code becomes a get_attr constant:
    it is read from the module (the graph still compiles and fuses), and a
    constant returned to the caller is a copy the caller may mutate."""
    def f(x):
        return (x + torch.tensor(0.1)) * torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0])

    x = torch.randn(3)
    with torch.no_grad():
        c = torch.compile(f, backend="neuron")
        first = c(x)
        first[1].add_(1)
        got, want = c(x), f(x)
    torch.testing.assert_close(got, want)
    st = torchneuron_jit.stats()
    assert st["eager_fallbacks"] == 0
    assert st["kernels_compiled"] >= 1


def test_cached_plan_with_permuted_outputs_loads():
    """A kernel whose outputs keep a transposed input's layout stores its
    strides in the cached plan; read back (JSON lists) they must still load."""
    def f(x):
        return (x == x), torch.erf(x.sqrt())

    x = torch.rand(4, 6, 20).transpose(0, 2)
    want = f(x)
    for _ in range(2):  # the second compile reads the plan the first stored
        torch._dynamo.reset()
        before = torchneuron_jit.stats()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            got = torch.compile(f, backend="neuron")(x)
        after = torchneuron_jit.stats()
        assert after["eager_fallbacks"] == before["eager_fallbacks"]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride()
    assert after["cache_hits"] > before["cache_hits"]


def test_a_graph_returning_sizes_a_comparison_and_none_is_compiled(recwarn):
    """Dynamo's graphs may return sizes, comparisons of sizes and None next
    to tensors (HF Mistral's, after its dynamic recompile): they are no
    values of the IR's, and the graph is still ours."""
    def f(x, n):
        return torch.sigmoid(x * 2), x.shape[1] + n, None, x.shape[1] > 4

    compiled = torch.compile(f, backend="neuron", dynamic=True)
    with torch.no_grad():
        for s in (3, 5, 7):
            x = torch.randn(2, s)
            got, want = compiled(x, s), f(x, s)
            torch.testing.assert_close(got[0], want[0])
            assert got[1:] == want[1:]
    st = torchneuron_jit.stats()
    assert st["eager_fallbacks"] == 0 and st["graphs_lowered"] >= 1, st
    assert not [w for w in recwarn if "torchneuron_jit" in str(w.message)], [str(w.message) for w in recwarn]


def test_an_encoder_layers_fast_path_under_cpu_autocast_gives_eagers_dtype_and_values():
    """nn.TransformerEncoderLayer in eval mode takes PyTorch's fused fast
    path (torch._transformer_encoder_layer_fwd), which autocast does not
    cast: eager's kernel casts its inner linear layers, aot_autograd's graph
    of it (traced with autocast's key excluded) did not, and the answer came
    back float32, 0.027 off eager's bfloat16. The graph runs as Dynamo
    captured it, with one warning."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    compiled = torch.compile(copy.deepcopy(layer), backend="neuron")
    x = torch.randn(2, 8, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        want = layer(x)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), want)
    words = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(words) == 1 and "_transformer_encoder_layer_fwd" in words[0], words
