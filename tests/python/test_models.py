"""Whole models through torch.compile(backend="neuron"), compared with eager."""
import math

import pytest
import torch

import torchneuron_jit


pytestmark = pytest.mark.usefixtures("fresh_backend")


def _check(model, *inputs, atol=None, rtol=None):
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="neuron")(*inputs)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0
    return torchneuron_jit.stats()


class LNGeluResidual(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.ln(x))) * 0.5


class Attention(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        return self.out(y)


def test_mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.SiLU(), torch.nn.Linear(64, 64),
                            torch.nn.Tanh(), torch.nn.Linear(64, 8)).eval()
    _check(m, torch.randn(16, 32))


def test_layernorm_gelu_residual():
    torch.manual_seed(0)
    st = _check(LNGeluResidual().eval(), torch.randn(4, 10, 64))
    assert st["kernels_compiled"] >= 1  # gelu * 0.5 + x fuses


def test_hand_written_attention():
    torch.manual_seed(0)
    _check(Attention().eval(), torch.randn(2, 12, 32))


def test_transformer_encoder_layer():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
    _check(layer, torch.randn(2, 16, 64))


def test_unlowered_op_falls_back_per_node():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    st = _check(lambda x: torch.cumsum(torch.relu(conv(x)) * 2 + 1, dim=1), torch.randn(1, 3, 9, 9))
    assert st["fallback_nodes"] >= 2  # convolution and cumsum


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool_graphs(dtype):
    x = torch.randint(-5, 5, (6, 7)).to(dtype)
    y = torch.randint(-5, 5, (6, 7)).to(dtype)
    if dtype == torch.bool:
        _check(lambda a, b: torch.logical_or(a, b) & ~b, x, y)
    else:
        _check(lambda a, b: (a * 3 + b).clamp(-4, 4) // 2 + (a > b).to(dtype), x, y)


def test_float64_graph():
    torch.manual_seed(0)
    x, y = torch.randn(5, 9, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    _check(lambda a, b: torch.nn.functional.gelu(a * 2 + b).softmax(-1), x, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_graph_is_as_accurate_as_eager(dtype):
    # Fused float16/bfloat16 code computes in float32 and rounds once, where
    # eager rounds after every op, so the two differ by more than the dtype's
    # tolerance after a softmax. The judge is a float64 evaluation of the same
    # inputs: our error may not exceed eager's by more than the tolerance.
    torch.manual_seed(0)
    f = lambda a, b: torch.nn.functional.gelu(a * 2 + b).softmax(-1)  # noqa: E731
    x, y = torch.randn(5, 9, dtype=dtype), torch.randn(9, dtype=dtype)
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x, y)
    want = f(x, y)
    ref = f(x.double(), y.double())
    assert got.dtype == want.dtype == dtype
    rtol = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2}[dtype]
    ours, eagers = (got.double() - ref).abs(), (want.double() - ref).abs()
    assert bool((ours <= eagers + rtol * ref.abs() + 1e-5).all()), (ours.max(), eagers.max())
    assert torchneuron_jit.stats()["kernels_compiled"] >= 1


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2)])
def test_zero_dim_and_empty(shape):
    x, y = torch.randn(shape), torch.randn(shape)
    _check(lambda a, b: torch.exp(a) * 2 + b.sigmoid(), x, y)


def test_lowered_ops_registry():
    ops = torchneuron_jit.lowered_ops()
    assert "aten::add.Tensor" in ops and "aten::gelu" in ops and "aten::exp" in ops
    assert "aten::_softmax" in ops and "aten::native_layer_norm" in ops and "aten::addmm" in ops
    assert "aten::bmm" in ops and "aten::baddbmm" in ops  # GEMM kernels (config.gemm_fusion)
    assert "aten::cumsum" not in ops and "aten::convolution" not in ops  # not lowered: run through PyTorch
    assert "aten::permute" in ops and "aten::slice.Tensor" in ops  # read through at a kernel's inputs
    assert set(ops) <= set(torchneuron_jit._C.op_names())


def test_input_mutation_is_applied_like_eager():
    def f(x):
        x.mul_(2)
        return torch.sigmoid(x) + 1

    a = torch.randn(4, 4)
    b = a.clone()
    with torch.no_grad():
        want = f(a)
        got = torch.compile(f, backend="neuron")(b)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(b, a)  # the input was doubled in both
    assert torchneuron_jit.stats()["kernels_compiled"] >= 1


def test_dict_outputs_and_in_place_ops():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16).eval()

    def f(x):
        h = lin(x)
        y = h * 2
        y.add_(1)
        y.relu_()
        return {"a": torch.tanh(y) * 2, "b": h.sum()}

    x = torch.randn(3, 16)
    with torch.no_grad():
        want = f(x)
        got = torch.compile(f, backend="neuron")(x)
    torch.testing.assert_close(got, want)


# -- more model shapes, with the graph passes and row kernels, as shapes change ----

class _MaskedAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(32, 4, batch_first=True, dropout=0.1)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x, mask):
        y, _ = self.mha(x, x, x, attn_mask=mask, need_weights=False)
        return self.ln(x + y)


class _SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


class _EmbeddingHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.fc = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, ids):
        return torch.softmax(self.fc(self.drop(self.emb(ids))) / 4, -1).mean(1)


_MODELS = {
    "masked_attention": (_MaskedAttention, lambda b, s: (torch.randn(b, s, 32),
                                                         torch.triu(torch.full((s, s), -math.inf), 1))),
    "cnn": (_SmallCNN, lambda b, s: (torch.randn(b, 3, 8, 8),)),
    "embedding": (_EmbeddingHead, lambda b, s: (torch.randint(0, 100, (b, s)),)),
    "pre_norm_encoder": (lambda: torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=True), 2,
        enable_nested_tensor=False), lambda b, s: (torch.randn(b, s, 32),)),
}


@pytest.mark.parametrize("row_fusion", [False, True], ids=["default", "row_fusion"])
@pytest.mark.parametrize("name", list(_MODELS))
def test_models_as_shapes_change(name, row_fusion):
    import warnings

    from torchneuron_jit import config
    config.row_fusion = row_fusion
    torch.manual_seed(0)
    make, inputs = _MODELS[name]
    model = make().eval()
    compiled = torch.compile(model, backend="neuron")
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the decomposed layers, as the demo runs them
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no "could not compile"
            for b, s in ((2, 5), (3, 7), (4, 9)):  # the later graphs are dynamic
                args = inputs(b, s)
                torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-5)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0

