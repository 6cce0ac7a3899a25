"""2-d convolutions run channels-last (backend._channels_last_convs,
config.conv_channels_last): the values are eager's up to rounding, every
result has eager's strides, and a graph the layout cannot go through is
left as it was."""
import pytest
import torch
import torch.nn.functional as F

import torchneuron_jit
from torchneuron_jit import config


pytestmark = pytest.mark.usefixtures("fresh_backend")


class CNN(torch.nn.Module):
    """SmallCNN of the benchmarks, returning its feature map too."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        a = F.max_pool2d(F.relu(self.c1(x)), 2)
        b = F.relu(self.c2(a))
        return self.fc(F.adaptive_avg_pool2d(b, 1).flatten(1)), a * 2


def _doors(model):
    return {"jit": torchneuron_jit.jit(model), "neuron": torch.compile(model, backend="neuron", dynamic=False)}


def _pytorch_ops():
    return torchneuron_jit.stats()["fallback_ops"]


@pytest.mark.parametrize("door", ["jit", "neuron"])
@pytest.mark.parametrize("batch", [1, 3])
def test_convs_run_channels_last_with_eagers_values_and_strides(door, batch):
    torch.manual_seed(0)
    model = CNN().eval()
    x = torch.randn(batch, 3, 20, 24)
    with torch.no_grad():
        want = model(x)
        f = _doors(model)[door]
        for _ in range(2):
            got = f(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()
    ops = _pytorch_ops()
    assert ops.get("mkldnn::_convolution_pointwise", {}).get("no lowering") == 2, ops  # relu as the post-op
    assert "aten::clone" in ops, ops  # the input converted once, the second conv's is NHWC already
    assert "aten::relu" not in ops, ops
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_off_leaves_convs_nchw():
    torch.manual_seed(0)
    model = CNN().eval()
    x = torch.randn(2, 3, 20, 24)
    with config.patch(conv_channels_last=False), torch.no_grad():
        got = torch.compile(model, backend="neuron", dynamic=False)(x)
    torch.testing.assert_close(got, model(x))
    ops = _pytorch_ops()
    assert "mkldnn::_convolution_pointwise" not in ops and "aten::convolution" in ops, ops


def test_a_view_the_layout_breaks_keeps_the_graph_nchw():
    """x.view(n, -1) of a conv's (n, c, h, w) result is a view only of NCHW
    memory: the layout would make it fail, so the graph stays as it was."""
    conv = torch.nn.Conv2d(3, 8, 3).eval()
    f = lambda x: conv(x).view(x.shape[0], -1) * 2  # noqa: E731
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        got = torch.compile(f, backend="neuron", dynamic=False)(x)
        torch.testing.assert_close(got, f(x))
    ops = _pytorch_ops()
    assert "aten::clone" not in ops and "aten::convolution" in ops, ops
    assert torchneuron_jit.stats()["eager_fallbacks"] == 0


def test_a_channels_last_input_and_grouped_convs():
    """An input that is channels-last already is not copied; a depthwise
    conv and a 1x1 conv after it; the 4-d result keeps eager's strides
    (channels-last too, as eager's conv gives for such an input)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.SiLU(),
                                torch.nn.Conv2d(8, 4, 1)).eval()
    for x in (torch.randn(2, 8, 10, 10).contiguous(memory_format=torch.channels_last), torch.randn(2, 8, 10, 10)):
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(model, backend="neuron", dynamic=False)(x)
            want = model(x)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def test_a_variant_of_dynamic_batch_runs_its_convolutions_channels_last():
    """Batches that change make jit's next trace symbolic in the batch: that
    variant's convolutions read channels-last inputs too (channels, height
    and width are static), with relu as oneDNN's post-op; eager's values
    and strides at every batch size."""
    torch.manual_seed(0)
    model = CNN().eval()
    f = torchneuron_jit.jit(model)
    with torch.no_grad(), config.patch(compile_blocking=True):
        for batch in (2, 3, 5, 4, 7):
            x = torch.randn(batch, 3, 20, 24)
            for g, w in zip(f(x), model(x)):
                torch.testing.assert_close(g, w)
                assert g.stride() == w.stride()
    dynamic = [v for v in torchneuron_jit.explain(f).variants if "dynamic" in v["kind"]]
    assert len(dynamic) == 1 and dynamic[0]["hits"] >= 2, torchneuron_jit.explain(f)
    assert "mkldnn::_convolution_pointwise (no lowering, 2)" in dynamic[0]["graph"], dynamic[0]


def test_float16_convs_stay_nchw_and_give_eagers_bits():
    """oneDNN's float16 convolution rounds otherwise in NHWC than in NCHW:
    a float16 ViT's patch embedding run channels-last came out beyond
    float16's tolerance of eager's after its encoder. float16 convolutions
    keep eager's layout, and so its values bit for bit."""
    torch.manual_seed(0)
    model = CNN().eval().half()
    x = torch.randn(2, 3, 20, 24).half()
    with torch.no_grad():
        want = model(x)
        for name, door in _doors(model).items():
            for _ in range(2):
                for g, w in zip(door(x), want):
                    assert torch.equal(g, w) and g.stride() == w.stride(), name
    assert "mkldnn::_convolution_pointwise" not in _pytorch_ops()


@pytest.mark.parametrize("door", ["jit", "neuron"])
def test_a_tiny_conv_that_eager_runs_without_onednn_stays_nchw(door):
    """A batch of one on 16x16 pixels, which ATen runs by its Slow2d kernel:
    oneDNN's fixed cost made it 2-3x eager's time channels-last (a 1x4x16x16
    conv: 48 against 14 us). A batch of 4 of it ATen runs in oneDNN itself:
    channels-last."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU()).eval()
    with torch.no_grad():
        for batch, channels_last in [(1, False), (4, True)]:
            torch._dynamo.reset()
            torchneuron_jit.reset_stats()
            x = torch.randn(batch, 4, 16, 16)
            f = _doors(model)[door]
            for _ in range(2):
                got = f(x)
            torch.testing.assert_close(got, model(x))
            assert got.stride() == model(x).stride()
            ops = _pytorch_ops()
            assert ("mkldnn::_convolution_pointwise" in ops) is channels_last, (batch, ops)
            assert ("aten::convolution" in ops) is not channels_last, (batch, ops)
