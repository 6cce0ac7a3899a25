"""The graph IR builder, canonical encoding, decoder and key (_C.Graph)."""
import os
import random
import re
import sys
import threading
from pathlib import Path

import pytest

from torchneuron_jit import _C

REPO = Path(__file__).resolve().parents[2]
TESTS_DIR = Path(__file__).resolve().parent

T = _C.ARG_TENSOR
F16, F32, I64, BOOL = 5, 6, 4, 11


# -- Builders ----------------------------------------------------------------------

def build_mlp(hidden=8, features=4, param_order=("fc.bias", "fc.weight"), alpha=1, dtype=F32,
              weight_name="fc.weight"):
    """relu(x @ W + b) with a symbolic batch size. The default order of the
    builder calls is the canonical one (inputs by role, nodes in post-order)."""
    g = _C.Graph()
    batch = _C.Sym(g.add_symbol())
    x = g.add_input("arg", dtype, [batch, features], [features, 1], index=0)
    ids = {}
    for name in param_order:
        if name == "fc.bias":
            ids[name] = g.add_input("param", dtype, [hidden], [1], name="fc.bias")
        else:
            ids[name] = g.add_input("param", dtype, [features, hidden], [hidden, 1], name=weight_name)
    w, b = ids["fc.weight"], ids["fc.bias"]
    out = (dtype, [batch, hidden], [hidden, 1])
    (h,) = g.add_node("aten::mm", [(T, x), (T, w)], [out])
    (a,) = g.add_node("aten::add.Tensor", [(T, h), (T, b), (_C.ARG_INT, alpha)], [out])
    (r,) = g.add_node("aten::relu", [(T, a)], [out])
    g.set_outputs([r])
    return g


def build_two_branches(relu_first):
    """mul(relu(x), neg(x)): two independent nodes inserted in either order."""
    g = _C.Graph()
    x = g.add_input("arg", F32, [3, 5], [5, 1])
    meta = (F32, [3, 5], [5, 1])
    if relu_first:
        (r,) = g.add_node("aten::relu", [(T, x)], [meta])
        (n,) = g.add_node("aten::neg", [(T, x)], [meta])
    else:
        (n,) = g.add_node("aten::neg", [(T, x)], [meta])
        (r,) = g.add_node("aten::relu", [(T, x)], [meta])
    (m,) = g.add_node("aten::mul.Tensor", [(T, r), (T, n)], [meta])
    g.set_outputs([m])
    return g


def build_rich():
    """Exercises every argument tag, symbols in lists, a constant and a fallback."""
    g = _C.Graph()
    s0, s1 = g.add_symbol(), g.add_symbol()
    B, N = _C.Sym(s0), _C.Sym(s1)
    x = g.add_input("arg", F32, [B, 8], [8, 1], index=0)
    y = g.add_input("arg", F32, [N, 8], [8, 1], index=1, name=".y")
    w = g.add_input("param", F32, [8, 8], [8, 1], name="w")
    c = g.add_input("const", I64, [3], [1], index=0)
    (cat,) = g.add_node("aten::cat", [(_C.ARG_TENSOR_LIST, [x, y]), (_C.ARG_INT, 0)], [(F32, [B, 8], [8, 1])])
    (m,) = g.add_node("aten::mm", [(T, cat), (T, w)], [(F32, [B, 8], [8, 1])])
    (v,) = g.add_node("aten::view", [(T, m), (_C.ARG_INT_LIST, [B, 2, 4])], [(F32, [B, 2, 4], [8, 4, 1])])
    (sm,) = g.add_node("aten::_softmax", [(T, v), (_C.ARG_INT, -1), (_C.ARG_BOOL, 0)], [(F32, [B, 2, 4], [8, 4, 1])])
    (gl,) = g.add_node("aten::gelu", [(T, sm), (_C.ARG_STRING, "tanh")], [(F32, [B, 2, 4], [8, 4, 1])])
    (tc,) = g.add_node("aten::_to_copy", [(T, gl), (_C.ARG_DTYPE, F16), (_C.ARG_LAYOUT, 0), (_C.ARG_DEVICE, "cpu"),
                                          (_C.ARG_NONE, None), (_C.ARG_BOOL, 0), (_C.ARG_MEMFMT, 1)],
                        [(F16, [B, 2, 4], [8, 4, 1])])
    (sel,) = g.add_node("aten::select.int", [(T, tc), (_C.ARG_INT, 0), (_C.ARG_SYM, s1)], [(F16, [2, 4], [4, 1])])
    (fb,) = g.add_node("fallback", [(T, sel), (_C.ARG_FLOAT, 0.5), (T, c)], [(F16, [2, 4], [4, 1])],
                       target="aten::cumsum")
    g.set_outputs([fb, m])
    return g


# -- Construction, encoding, decoding ---------------------------------------------------

def test_mlp_builds():
    g = build_mlp()
    assert (g.num_symbols, g.num_inputs, g.num_nodes, g.num_values) == (1, 3, 3, 6)
    assert g.error == ""
    text = g.dump()
    assert "aten::mm(%0, %2)" in text
    assert "param fc.weight : float32[4, 8]" in text
    assert "arg 0 : float32[s0, 4]" in text
    assert "return (%5)" in text


@pytest.mark.parametrize("builder", [build_mlp, build_rich])
def test_encode_decode_round_trip(builder):
    g = builder()
    enc = g.encode()
    assert isinstance(enc, bytes)
    assert enc[:4] == b"TNGR"
    assert int.from_bytes(enc[4:8], "little") == _C.GRAPH_FORMAT_VERSION
    assert g.encode() == enc  # stable on repeat
    d = _C.decode_graph(enc)
    assert isinstance(d, _C.Graph)
    assert d.encode() == enc
    assert d.dump() == g.dump()
    assert d.key() == g.key()
    assert (d.num_symbols, d.num_inputs, d.num_nodes, d.num_values) == \
           (g.num_symbols, g.num_inputs, g.num_nodes, g.num_values)
    assert _C.decode_graph(bytearray(enc)).encode() == enc
    assert _C.decode_graph(memoryview(enc)).encode() == enc
    assert _C.decode_graph(d.encode()).encode() == enc


def test_empty_graph_round_trip():
    g = _C.Graph()
    enc = g.encode()
    assert len(enc) == 24
    d = _C.decode_graph(enc)
    assert d.encode() == enc
    assert (d.num_symbols, d.num_inputs, d.num_nodes) == (0, 0, 0)


def test_decoded_graph_is_buildable():
    d = _C.decode_graph(build_mlp().encode())
    (n,) = d.add_node("aten::neg", [(T, 5)], [(F32, [_C.Sym(0), 8], [8, 1])])
    d.set_outputs([n])
    assert d.num_nodes == 4
    assert _C.decode_graph(d.encode()).encode() == d.encode()


# -- Key ---------------------------------------------------------------------------

def test_key_is_16_bytes_and_stable():
    k = build_mlp().key()
    assert isinstance(k, bytes) and len(k) == 16
    assert build_mlp().key() == k
    assert build_mlp().key(context=b"") == k
    g = build_mlp()
    assert g.key() == g.key()


def test_key_stable_across_processes(run_python):
    child = (f"import sys; sys.path.insert(0, {str(TESTS_DIR)!r})\n"
             "from test_graph import build_mlp, build_rich\n"
             "print(build_mlp().key().hex()); print(build_mlp().key(context=b'cpu').hex());"
             " print(build_rich().key().hex()); print(build_mlp().encode().hex())\n")
    proc = run_python("-c", child)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines == [build_mlp().key().hex(), build_mlp().key(context=b"cpu").hex(), build_rich().key().hex(),
                     build_mlp().encode().hex()]


def test_key_depends_on_context():
    g = build_mlp()
    keys = {g.key(), g.key(context=b"cpu"), g.key(context=b"cuda"), g.key(context=b"\0"),
            g.key(context=bytearray(b"cpu-avx2"))}
    assert len(keys) == 5
    assert g.key(context=b"cpu") == build_mlp().key(context=b"cpu")
    with pytest.raises(TypeError):
        g.key(context="cpu")


@pytest.mark.parametrize("change", [
    {"hidden": 9}, {"features": 5}, {"alpha": 2}, {"dtype": F16}, {"weight_name": "fc.weight2"},
])
def test_key_depends_on_the_graph(change):
    base = build_mlp()
    other = build_mlp(**change)
    assert other.encode() != base.encode()
    assert other.key() != base.key()
    assert len(other.key()) == 16


# -- Canonical form ------------------------------------------------------------------

def test_independent_nodes_in_either_order_encode_the_same():
    a, b = build_two_branches(True), build_two_branches(False)
    assert a.dump() != b.dump()  # really built differently
    assert a.encode() == b.encode()
    assert a.key() == b.key()
    assert _C.decode_graph(b.encode()).dump() == a.dump()


def test_params_in_either_order_encode_the_same():
    a = build_mlp(param_order=("fc.bias", "fc.weight"))
    b = build_mlp(param_order=("fc.weight", "fc.bias"))
    assert a.dump() != b.dump()
    assert a.encode() == b.encode()
    assert a.key() == b.key()


def test_args_in_either_order_encode_the_same():
    def build(swap):
        g = _C.Graph()
        specs = [(0, [2, 3]), (1, [2, 3])]
        ids = {}
        for index, sizes in (reversed(specs) if swap else specs):
            ids[index] = g.add_input("arg", F32, sizes, [3, 1], index=index)
        (s,) = g.add_node("aten::sub.Tensor", [(T, ids[0]), (T, ids[1]), (_C.ARG_INT, 1)], [(F32, [2, 3], [3, 1])])
        g.set_outputs([s])
        return g

    assert build(False).encode() == build(True).encode()


def test_symbols_numbered_by_first_use():
    def build(order, extra_unused):
        g = _C.Graph()
        if extra_unused:
            g.add_symbol()
        a, b = g.add_symbol(), g.add_symbol()
        s = [a, b] if order else [b, a]
        B, N = _C.Sym(s[0]), _C.Sym(s[1])
        x = g.add_input("arg", F32, [B, N], [N, 1])
        (r,) = g.add_node("aten::relu", [(T, x)], [(F32, [B, N], [N, 1])])
        g.set_outputs([r])
        return g

    encs = {build(o, u).encode() for o in (True, False) for u in (True, False)}
    assert len(encs) == 1
    d = _C.decode_graph(encs.pop())
    assert d.num_symbols == 2


# -- Decoder robustness ------------------------------------------------------------

@pytest.mark.parametrize("builder", [build_mlp, build_rich])
def test_every_truncation_is_rejected(builder):
    enc = builder().encode()
    for n in range(len(enc)):
        with pytest.raises(_C.GraphError, match="truncated"):
            _C.decode_graph(enc[:n])


def test_trailing_bytes_bad_magic_and_version_rejected():
    enc = build_mlp().encode()
    with pytest.raises(_C.GraphError, match="after the end"):
        _C.decode_graph(enc + b"\0")
    with pytest.raises(_C.GraphError, match="magic"):
        _C.decode_graph(b"XXXX" + enc[4:])
    bad = bytearray(enc)
    bad[4] = _C.GRAPH_FORMAT_VERSION + 1
    with pytest.raises(_C.GraphError, match="version"):
        _C.decode_graph(bytes(bad))
    with pytest.raises(TypeError):
        _C.decode_graph("TNGR")


def test_non_canonical_encoding_rejected():
    enc = bytearray(build_mlp().encode())
    enc[8] += 1  # declare a symbol nothing uses
    with pytest.raises(_C.GraphError, match="canonical"):
        _C.decode_graph(bytes(enc))


def test_graph_error_is_a_value_error():
    assert issubclass(_C.GraphError, ValueError)
    with pytest.raises(ValueError):
        _C.decode_graph(b"")


@pytest.mark.parametrize("builder, seed", [(build_mlp, 20240601), (build_rich, 77)])
def test_random_single_byte_corruptions(builder, seed):
    enc = builder().encode()
    rng = random.Random(seed)
    accepted = rejected = 0
    for _ in range(2000):
        bad = bytearray(enc)
        pos = rng.randrange(len(bad))
        bad[pos] ^= rng.randrange(1, 256)
        bad = bytes(bad)
        try:
            d = _C.decode_graph(bad)
        except _C.GraphError:
            rejected += 1
            continue
        accepted += 1
        assert d.encode() == bad
        assert len(d.key()) == 16
    assert accepted + rejected == 2000
    assert rejected > 0


# -- Builder rejections and poisoning ---------------------------------------------------

def start_graph():
    """Two inputs and one valid node, so a rejected node is node 1."""
    g = _C.Graph()
    s = g.add_symbol()
    x = g.add_input("arg", F32, [2, 3], [3, 1], index=0)
    y = g.add_input("arg", F32, [4, 5], [5, 1], index=1)
    (r,) = g.add_node("aten::relu", [(T, x)], [(F32, [2, 3], [3, 1])])
    return g, s, x, y, r


REJECTIONS = {
    "mm inner sizes": ("aten::mm", lambda x, y, r: [(T, x), (T, y)], [(F32, [2, 5], [5, 1])],
                       "inner sizes differ"),
    "wrong arg count": ("aten::mm", lambda x, y, r: [(T, x)], [(F32, [2, 3], [3, 1])],
                        "expects 2 arguments, got 1"),
    "dangling value id": ("aten::mm", lambda x, y, r: [(T, r), (T, 99)], [(F32, [2, 3], [3, 1])],
                          "undefined value 99"),
    "undeclared symbol in output": ("aten::relu", lambda x, y, r: [(T, r)], [(F32, [_C.Sym(7), 3], [3, 1])],
                                    "undeclared symbol"),
    "undeclared symbol argument": ("aten::select.int", lambda x, y, r: [(T, r), (_C.ARG_INT, 0), (_C.ARG_SYM, 5)],
                                   [(F32, [3], [1])], "undeclared symbol 5"),
    "wrong arg tag": ("aten::mm", lambda x, y, r: [(T, x), (_C.ARG_INT, 3)], [(F32, [2, 3], [3, 1])],
                      "not accepted here"),
    "wrong output count": ("aten::native_layer_norm",
                           lambda x, y, r: [(T, x), (_C.ARG_INT_LIST, [3]), (_C.ARG_NONE, None),
                                            (_C.ARG_NONE, None), (_C.ARG_FLOAT, 1e-5)],
                           [(F32, [2, 3], [3, 1])], "outputs, expected 3"),
    "bool out of range": ("aten::_softmax", lambda x, y, r: [(T, x), (_C.ARG_INT, 1), (_C.ARG_BOOL, 2)],
                          [(F32, [2, 3], [3, 1])], "not 0 or 1"),
    "comparison must give bool": ("aten::eq.Tensor", lambda x, y, r: [(T, x), (T, r)], [(F32, [2, 3], [3, 1])],
                                  "must produce bool"),
    "broadcast mismatch": ("aten::add.Tensor", lambda x, y, r: [(T, x), (T, y), (_C.ARG_INT, 1)],
                           [(F32, [4, 5], [5, 1])], "broadcast"),
    "unknown dtype": ("aten::relu", lambda x, y, r: [(T, x)], [(99, [2, 3], [3, 1])], "unknown dtype 99"),
    "target on a table op": ("aten::relu", lambda x, y, r: [(T, x)], [(F32, [2, 3], [3, 1])],
                             "only fallback nodes take a target"),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_rejected_node_names_node_and_poisons(case):
    op, make_args, outputs, message = REJECTIONS[case]
    g, s, x, y, r = start_graph()
    before = (g.num_nodes, g.num_values)
    target = "aten::relu" if case == "target on a table op" else None
    with pytest.raises(_C.GraphError) as info:
        g.add_node(op, make_args(x, y, r), outputs, target=target)
    text = str(info.value)
    assert f"node 1 ({op})" in text
    assert message in text
    assert g.error == text
    assert (g.num_nodes, g.num_values) == before  # nothing stored
    # poisoned: every builder call, encode and key now fail, naming reset()
    for call in (g.add_symbol, lambda: g.add_input("arg", F32, [1], [1], index=7),
                 lambda: g.add_node("aten::relu", [(T, x)], [(F32, [2, 3], [3, 1])]),
                 lambda: g.set_outputs([r]), g.encode, g.key, g.dump):
        with pytest.raises(_C.GraphError, match=r"reset\(\)") as again:
            call()
        assert message in str(again.value)
    assert (g.num_nodes, g.num_values) == before
    g.reset()
    assert g.error == ""
    assert (g.num_symbols, g.num_inputs, g.num_nodes, g.num_values) == (0, 0, 0, 0)
    x = g.add_input("arg", F32, [2, 3], [3, 1])
    (n,) = g.add_node("aten::relu", [(T, x)], [(F32, [2, 3], [3, 1])])
    g.set_outputs([n])
    assert _C.decode_graph(g.encode()).encode() == g.encode()


def test_input_rejections_poison():
    g = _C.Graph()
    g.add_input("arg", F32, [2], [1], index=0)
    with pytest.raises(_C.GraphError, match="same role as input 0"):
        g.add_input("arg", F32, [3], [1], index=0)
    with pytest.raises(_C.GraphError, match="reset"):
        g.add_symbol()
    g.reset()
    x = g.add_input("arg", F32, [2], [1])
    g.add_node("aten::relu", [(T, x)], [(F32, [2], [1])])
    with pytest.raises(_C.GraphError, match="before the first node"):
        g.add_input("arg", F32, [2], [1], index=1)
    g.reset()
    with pytest.raises(_C.GraphError, match="qualified name"):
        g.add_input("param", F32, [2], [1])
    g.reset()
    with pytest.raises(_C.GraphError, match="undeclared symbol"):
        g.add_input("arg", F32, [_C.Sym(0)], [1])
    g.reset()
    with pytest.raises(_C.GraphError, match="negative"):
        g.add_input("arg", F32, [-2], [1])
    g.reset()
    with pytest.raises(_C.GraphError, match="undefined value 4"):
        g.set_outputs([4])


def test_python_level_errors_do_not_poison():
    g = _C.Graph()
    x = g.add_input("arg", F32, [2], [1])
    with pytest.raises(ValueError, match="unknown op"):
        g.add_node("aten::no_such_op", [(T, x)], [(F32, [2], [1])])
    with pytest.raises(ValueError, match="kind must be"):
        g.add_input("weird", F32, [2], [1])
    with pytest.raises(ValueError, match="unknown tag"):
        g.add_node("aten::relu", [(99, x)], [(F32, [2], [1])])
    with pytest.raises(TypeError):
        g.add_node("aten::relu", [T, x], [(F32, [2], [1])])
    with pytest.raises(ValueError, match="strides"):
        g.add_input("arg", F32, [2, 3], [1], index=1)
    assert g.error == ""
    (r,) = g.add_node("aten::relu", [(T, x)], [(F32, [2], [1])])
    g.set_outputs([r])
    assert g.num_nodes == 1


def test_fallback_node_with_target():
    g = _C.Graph()
    s = g.add_symbol()
    x = g.add_input("arg", F32, [_C.Sym(s), 3], [3, 1])
    outs = g.add_node("fallback",
                      [(T, x), (_C.ARG_INT, 1), (_C.ARG_STRING, "anything"), (_C.ARG_NONE, None),
                       (_C.ARG_FLOAT, 2.5), (_C.ARG_INT_LIST, [_C.Sym(s), -1]), (_C.ARG_TENSOR_LIST, [x, x]),
                       (_C.ARG_BOOL, 1), (_C.ARG_DTYPE, F32)],
                      [(F32, [_C.Sym(s), 3], [3, 1]), (I64, [], [])], target="aten::cumsum")
    assert len(outs) == 2
    g.set_outputs(list(outs))
    text = g.dump()
    assert "aten::cumsum(" in text
    assert "# fallback" in text
    d = _C.decode_graph(g.encode())
    assert d.encode() == g.encode()
    assert d.dump() == text
    # a fallback may also produce nothing
    g2 = _C.Graph()
    g2.add_node("fallback", [], [], target="aten::_assert_async")
    assert g2.num_nodes == 1


@pytest.mark.parametrize("target", [None, "", "cumsum"])
def test_fallback_without_qualified_target_rejected(target):
    g = _C.Graph()
    x = g.add_input("arg", F32, [2, 3], [3, 1])
    with pytest.raises(_C.GraphError, match=r"node 0 \(fallback\): target must be a qualified op name"):
        g.add_node("fallback", [(T, x)], [(F32, [2, 3], [3, 1])], target=target)
    with pytest.raises(_C.GraphError, match="reset"):
        g.encode()


# -- Op table ----------------------------------------------------------------------

def ops_from_header():
    text = (REPO / "csrc" / "graph" / "ops.h").read_text()
    rows = re.findall(r'_\(\s*\w+\s*,\s*"([^"]+)"\s*,\s*"([^"]*)"\s*,\s*(-?\d+)\s*,', text)
    assert len(rows) > 50
    return {name: (sig, int(nout)) for name, sig, nout in rows}


def test_op_names_match_ops_h():
    names = _C.op_names()
    assert isinstance(names, tuple)
    assert len(names) == len(set(names))
    expected = ops_from_header()
    assert set(names) == set(expected)
    for name in ("aten::add.Tensor", "aten::_softmax", "aten::native_layer_norm", "aten::mm", "aten::relu",
                 "aten::cat", "aten::split_with_sizes", "fallback"):
        assert name in names
    for name in names:
        assert _C.op_signature(name) == expected[name]


def test_op_signatures():
    assert _C.op_signature("aten::mm") == ("TT", 1)
    assert _C.op_signature("aten::add.Tensor") == ("TTs", 1)
    assert _C.op_signature("aten::native_layer_norm") == ("Tyttf", 3)
    assert _C.op_signature("aten::_softmax") == ("Tib", 1)
    assert _C.op_signature("aten::split_with_sizes")[1] == -1
    with pytest.raises(KeyError):
        _C.op_signature("aten::no_such_op")


def test_split_with_sizes_any_number_of_outputs():
    g = _C.Graph()
    x = g.add_input("arg", F32, [6, 2], [2, 1])
    outs = g.add_node("aten::split_with_sizes", [(T, x), (_C.ARG_INT_LIST, [1, 2, 3]), (_C.ARG_INT, 0)],
                      [(F32, [n, 2], [2, 1]) for n in (1, 2, 3)])
    assert len(outs) == 3
    g.set_outputs(list(outs))
    assert _C.decode_graph(g.encode()).encode() == g.encode()


# -- Sym ---------------------------------------------------------------------------

def test_sym():
    assert _C.Sym(3).id == 3
    assert _C.Sym(3) == _C.Sym(3)
    assert _C.Sym(3) != _C.Sym(4)
    assert hash(_C.Sym(3)) == hash(_C.Sym(3))
    assert repr(_C.Sym(3)) == "Sym(3)"
    with pytest.raises(ValueError):
        _C.Sym(-1)
    assert _C.Sym(3, scale=256).scale == 256 and _C.Sym(3).scale == 1
    assert _C.Sym(3, scale=256) != _C.Sym(3) and _C.Sym(3, scale=1) == _C.Sym(3)
    assert repr(_C.Sym(3, scale=256)) == "Sym(3, scale=256)"
    with pytest.raises(ValueError):
        _C.Sym(3, scale=0)


def test_scaled_symbols_are_strides_only_and_round_trip():
    """[4, s, 256] contiguous has strides [256*s, 256, 1]: a scaled symbol."""
    g = _C.Graph()
    s = g.add_symbol()
    shape, strides = [4, _C.Sym(s), 256], [_C.Sym(s, scale=256), 256, 1]
    x = g.add_input("arg", F32, shape, strides, index=0)
    (r,) = g.add_node("aten::relu", [(T, x)], [(F32, shape, strides)])
    g.set_outputs([r])
    enc = g.encode()
    assert _C.decode_graph(enc).encode() == enc
    assert "256*s0" in g.dump()
    g2 = _C.Graph()
    s = g2.add_symbol()
    with pytest.raises(_C.GraphError, match="size"):
        g2.add_input("arg", F32, [_C.Sym(s, scale=2)], [1], index=0)


# -- Threads -------------------------------------------------------------------------

def test_graph_used_from_another_thread_raises():
    g = build_mlp()
    enc = g.encode()
    calls = {
        "encode": g.encode, "key": g.key, "dump": g.dump, "add_symbol": g.add_symbol, "reset": g.reset,
        "set_outputs": lambda: g.set_outputs([0]),
        "add_input": lambda: g.add_input("arg", F32, [1], [1], index=5),
        "add_node": lambda: g.add_node("aten::relu", [(T, 0)], [(F32, [_C.Sym(0), 4], [4, 1])]),
    }
    results = {}

    def worker():
        for name, call in calls.items():
            try:
                call()
                results[name] = "no error"
            except BaseException as exc:
                results[name] = exc
        results["counts"] = (g.num_symbols, g.num_inputs, g.num_nodes, g.num_values)

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    for name in calls:
        assert isinstance(results[name], RuntimeError), (name, results[name])
        assert "thread" in str(results[name])
    assert results["counts"] == (1, 3, 3, 6)  # read-only accessors work anywhere
    # nothing changed and the graph is not poisoned for its owner
    assert g.error == ""
    assert g.encode() == enc
    assert g.key() == build_mlp().key()


def test_graph_decoded_in_a_thread_belongs_to_it():
    enc = build_mlp().encode()
    out = {}

    def worker():
        d = _C.decode_graph(enc)
        out["enc"] = d.encode()
        out["key"] = d.key()
        del d  # freed on its own thread

    before = _C.graphs_abandoned()
    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    assert out["enc"] == enc
    assert out["key"] == build_mlp().key()
    assert _C.graphs_abandoned() == before


# -- Crash-prone inputs, run in a child so a crash fails one test, not the run ----------

def run_child(run_python, body):
    code = "from torchneuron_jit import _C\n" + body
    return run_python("-c", code)


def test_cat_of_an_empty_list_is_rejected(run_python):
    proc = run_child(run_python, (
        "g = _C.Graph()\n"
        "try:\n"
        "    g.add_node('aten::cat', [(_C.ARG_TENSOR_LIST, []), (_C.ARG_INT, 0)], [(6, [1], [1])])\n"
        "except _C.GraphError as e:\n"
        "    print('GraphError:', e)\n"
    ))
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-2000:]}"
    assert "GraphError: node 0 (aten::cat)" in proc.stdout
    assert "empty" in proc.stdout


def test_add_input_kind_by_keyword_reports_the_kind(run_python):
    proc = run_child(run_python, (
        "g = _C.Graph()\n"
        "try:\n"
        "    g.add_input(kind='weird', dtype=6, sizes=[], strides=[])\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    ))
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-2000:]}"
    assert "ValueError: kind must be" in proc.stdout
    assert "'weird'" in proc.stdout


def test_decoded_strings_are_valid_text():
    g = _C.Graph()
    x = g.add_input("arg", F32, [2], [1])
    (r,) = g.add_node("fallback", [(T, x), (_C.ARG_STRING, "QQQQ")], [(F32, [2], [1])], target="aten::foo")
    g.set_outputs([r])
    enc = g.encode()
    assert enc.count(b"QQQQ") == 1
    bad = enc.replace(b"QQQQ", b"\xff\xfe\x80\x81")
    try:
        d = _C.decode_graph(bad)
    except _C.GraphError:
        return  # rejecting non-UTF-8 text is fine
    assert isinstance(d.dump(), str)  # accepting it must not make dump() fail


def test_content_key_is_xxh3_128_of_the_bytes():
    """Keys of cache records that are not graphs (GEMM choices per shape)."""
    from torchneuron_jit import _C
    assert _C.content_key(b"abc").hex() == "06b05ab6733a618578af5f94892f3950"  # XXH3-128("abc")
    assert _C.content_key(bytearray(b"abc")) == _C.content_key(memoryview(b"abc"))
    assert len(_C.content_key(b"")) == 16
    with pytest.raises(TypeError):
        _C.content_key("abc")
