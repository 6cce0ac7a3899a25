"""torch.compile(backend="neuron"): registration, parity with eager, degradation."""
import os
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
