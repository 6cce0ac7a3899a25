"""The FX -> graph IR importer (torchneuron_jit.graph.from_fx)."""
import subprocess
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.func import functional_call

from torchneuron_jit import _C
from torchneuron_jit.graph import DTYPE_CODES, Unsupported, from_fx, op_name


def _block():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)).eval()


def _trace(model, x, mode="fake", extra=None):
    params = dict(model.named_parameters())

    def f(p, inp):
        y = functional_call(model, p, (inp,))
        return extra(y) if extra else y

    with torch.no_grad():
        gm = make_fx(f, tracing_mode=mode)(params, x)
    roles = [("param", n) for n in params] + [("arg", 0, "")]
    return gm, roles


def test_import_matches_fx_and_round_trips():
    gm, roles = _trace(_block(), torch.randn(3, 8), extra=lambda y: y.softmax(-1).cumsum(0))
    r = from_fx(gm, roles)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__ != "getitem"]
    assert r.graph.num_nodes == len(calls)
    assert r.graph.num_inputs == len(roles)
    assert r.fallback_ops == ["aten::cumsum"]
    assert r.lowered_nodes == len(calls) - 1
    enc = r.graph.encode()
    assert _C.decode_graph(enc).encode() == enc
    dump = r.graph.dump()
    assert "aten::native_layer_norm" in dump and "param 0.weight" in dump and "# fallback" in dump


def test_same_program_same_key_across_processes():
    code = (
        "import torch, sys\n"
        "sys.path.insert(0, 'tests/python')\n"
        "from test_fx_import import _block, _trace\n"
        "from torchneuron_jit.graph import from_fx\n"
        "gm, roles = _trace(_block(), torch.randn(3, 8))\n"
        "print(from_fx(gm, roles).graph.key(b'ctx').hex())\n"
    )
    gm, roles = _trace(_block(), torch.randn(3, 8))
    here = from_fx(gm, roles).graph.key(b"ctx").hex()
    there = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                           text=True).stdout.strip().splitlines()[-1]
    assert here == there


def test_key_depends_on_shapes_and_dtypes_but_not_values():
    m = _block()
    k1 = from_fx(*_trace(m, torch.randn(3, 8))).graph.key()
    k2 = from_fx(*_trace(m, torch.randn(3, 8) * 100)).graph.key()
    k3 = from_fx(*_trace(m, torch.randn(5, 8))).graph.key()
    k4 = from_fx(*_trace(m.double(), torch.randn(3, 8, dtype=torch.float64))).graph.key()
    assert k1 == k2
    assert len({k1, k3, k4}) == 3


def test_symbolic_sizes_become_symbols():
    gm, roles = _trace(_block(), torch.randn(3, 8), mode="symbolic")
    r = from_fx(gm, roles)
    assert r.graph.num_symbols >= 1
    assert "s0" in r.graph.dump()
    # the batch symbol is shared: one key serves every batch size
    gm2, roles2 = _trace(_block(), torch.randn(7, 8), mode="symbolic")
    assert from_fx(gm2, roles2).graph.key() == r.graph.key()


def test_multi_output_and_defaults_are_explicit():
    gm, roles = _trace(_block(), torch.randn(2, 8))
    dump = from_fx(gm, roles).graph.dump()
    # gelu's default approximate='none' and addmm's beta/alpha are spelled out
    assert "aten::gelu(%" in dump and "'none'" in dump
    assert "aten::addmm(" in dump and ", 1, 1)" in dump


def test_unsupported_is_reported_with_its_place():
    # a call of a torch function rather than an ATen operator cannot be represented
    with torch.no_grad():
        gm = make_fx(lambda x: torch.exp(x) * 2)(torch.randn(4, 6))
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.exp.default)
    node.target = torch.exp
    with pytest.raises(Unsupported, match=r"node exp .*only ATen operators"):
        from_fx(gm)


def test_sizes_and_none_a_graph_returns_are_no_outputs_of_the_ir():
    with torch.no_grad():
        gm = make_fx(lambda x: (x + 1, x.shape[0] * 2, None, x.shape[1] > 3),
                     tracing_mode="symbolic")(torch.randn(4, 6))
    r = from_fx(gm)
    assert r.graph.num_nodes == 1 and "1 outputs" in r.graph.dump() and "return (%1)" in r.graph.dump()


def test_size_arithmetic_stays_in_fx_and_becomes_symbols():
    with torch.no_grad():
        gm = make_fx(lambda x: torch.exp(x.reshape(x.shape[0] * 2, -1)) * 2,
                     tracing_mode="symbolic")(torch.randn(4, 6))
    r = from_fx(gm)
    assert r.graph.num_nodes == 3  # view, exp, mul: the size nodes are not in the IR
    assert r.graph.num_symbols >= 1
    assert "aten::view(%0, [s" in r.graph.dump()


def test_dtype_table_matches_torch_scalar_types():
    # our dtype numbers are torch's ScalarType numbers (prim::dtype returns them)
    for dtype, code in DTYPE_CODES.items():
        assert torch.ops.prim.dtype(torch.empty(0, dtype=dtype)) == code, dtype


def test_op_name_format():
    assert op_name(torch.ops.aten.add.Tensor) == "aten::add.Tensor"
    assert op_name(torch.ops.aten.mm.default) == "aten::mm"
