"""Graph IR from Python: the bridge from ATen-level FX graphs to the C IR.

``from_fx(gm)`` turns a torch.fx graph whose call_function nodes are ATen
OpOverloads (what ``make_fx`` and aot_autograd produce) into a
``torchneuron_jit._C.Graph``. Every argument is bound to its schema (defaults
spelled out), so the same program gives the same bytes however it was
written. Ops in the C op table keep their id; every other ATen op becomes a
fallback node carrying its qualified name. Tensor metadata comes from the
nodes' ``meta["val"]`` (real output metadata recorded by PyTorch, never
re-derived here); symbolic sizes become graph symbols, one per distinct
expression.

Sizes computed in the graph (dynamic-shape placeholders, ``sym_size``,
integer arithmetic on them) stay in the FX graph and appear in the IR as
the symbols they evaluate to. What cannot be represented (another non-tensor
input or output, a non-ATen call on tensors, an argument type we have no tag
for) raises :class:`Unsupported`, whose message names the node.
"""
import operator
from dataclasses import dataclass, field

import torch

from . import _C

DTYPE_CODES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
    torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.complex32: 8,
    torch.complex64: 9, torch.complex128: 10, torch.bool: 11, torch.bfloat16: 15,
}
LAYOUT_CODES = {torch.strided: 0, torch.sparse_coo: 1, torch.sparse_csr: 2, torch.sparse_csc: 3,
                torch.sparse_bsr: 4, torch.sparse_bsc: 5, torch._mkldnn: 6, torch.jagged: 7}
MEMFMT_CODES = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
                torch.channels_last_3d: 3}

_OP_NAMES = frozenset(_C.op_names())

# PyTorch's fused fast path that autocast does not cast, whose kernel calls other ops through the dispatcher:
# under CPU autocast eager casts its inner linear layers, where a dispatch mode (aot_autograd's, jit's recorder)
# runs it with autocast's key excluded (nn.MultiheadAttention's is autocast's own op). As Dynamo's graphs call it:
# as a dispatch mode sees it
CASTS_INSIDE = {torch._transformer_encoder_layer_fwd: torch.ops.aten._transformer_encoder_layer_fwd.default}

# PyTorch's fused fast paths (nn.TransformerEncoderLayer's, nn.MultiheadAttention's), which the layers' Python
# takes for plain tensors only: a trace over symbolic or fake tensors takes the layers' own ops, which round
# otherwise in float16 and bfloat16 (beyond their tolerance of eager's)
FAST_PATHS = frozenset((torch.ops.aten._transformer_encoder_layer_fwd.default,
                        torch.ops.aten._native_multi_head_attention.default))


class Unsupported(Exception):
    """The FX graph holds something the graph IR cannot represent."""


# Overload that takes a number where the Tensor overload takes a wrapped number.
_SCALAR_OVERLOAD = {"Tensor": "Scalar", "Tensor_Tensor": "Tensor_Scalar"}


def _scalar_form(name, args):
    """The op-table name for a node whose Tensor argument got a number, or None."""
    if all(tag != _C.ARG_TENSOR for tag, _ in args[1:2]) and "." in name:
        base, overload = name.rsplit(".", 1)
        alt = f"{base}.{_SCALAR_OVERLOAD.get(overload, '')}"
        if alt in _OP_NAMES:
            return alt
    return None


def _is_size(node):
    """Whether an FX node computes a number rather than a tensor: a size (an
    int or SymInt), a float only known at run time (a SymFloat input of
    a jit variant whose float argument is dynamic), or a comparison of
    sizes (a SymBool a Dynamo graph returns)."""
    val = node.meta.get("val")
    return isinstance(val, (torch.SymInt, int, torch.SymFloat, torch.SymBool)) and not isinstance(val, bool)


def _int_of(d):
    """d as an int: an int, or a SymInt its ShapeEnv fixed to one (a dynamic
    batch the code made 2 again); None otherwise."""
    if isinstance(d, int):
        return d
    return d.node.maybe_as_int() if isinstance(d, torch.SymInt) else None


def fake_tensor(mode, dtype, sizes, strides, offset, device=torch.device("cpu")):
    """A fake tensor of mode with that layout, made straight from a meta
    tensor: ~10 us, where an empty_strided under the fake mode takes ~60."""
    from torch._subclasses.fake_tensor import FakeTensor
    if offset:
        extent = 1 + offset + sum((s - 1) * st for s, st in zip(sizes, strides) if s > 0)
        meta = torch.empty(extent, dtype=dtype, device="meta").as_strided(sizes, strides, offset)
    else:
        meta = torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
    return FakeTensor(mode, meta, device)


def static_val(node):
    """node's example tensor when its sizes, strides and offset are ints, or
    SymInts fixed to ints (then a fake tensor of that layout in ints: the
    graph importer reads those as static too)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    dims = (*val.shape, *val.stride(), val.storage_offset())
    if all(isinstance(d, int) for d in dims):
        return val
    ints = [_int_of(d) for d in dims]
    if any(d is None for d in ints) or getattr(val, "fake_mode", None) is None:
        return None
    known = node.meta.get("tn_static_val")
    if known is None or known[0] is not val:
        rank = val.dim()
        fixed = fake_tensor(val.fake_mode, val.dtype, ints[:rank], ints[rank:2 * rank], ints[-1], val.device)
        known = node.meta["tn_static_val"] = (val, fixed)
    return known[1]


def op_name(target):
    """Qualified name of an OpOverload: 'aten::add.Tensor', 'aten::mm'; of
    a higher-order op (torch.cond's): 'higher_order::cond'."""
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order::{target.name()}"
    schema = target._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


@dataclass
class Imported:
    """The result of :func:`from_fx`."""
    graph: object                      # _C.Graph
    inputs: list                       # per placeholder, then per get_attr constant: ("arg", index, path) |
                                       # ("param", name) | ("const", index)
    fallback_ops: list = field(default_factory=list)   # qualified names, one per fallback node
    lowered_nodes: int = 0             # nodes whose op is in the op table
    symbols: dict = field(default_factory=dict)        # expression text -> symbol id
    fx_nodes: list = field(default_factory=list)       # IR node id -> the FX node it came from
    fx_values: dict = field(default_factory=dict)      # IR value id -> the FX node that holds it
    node_ops: list = field(default_factory=list)       # IR node id -> its op name ("fallback" for fallback nodes)


class _Importer:
    def __init__(self):
        self.g = _C.Graph()
        self.ids = {}        # fx node -> value id, or tuple of ids for multi-output nodes
        self.symbols = {}

    # -- metadata ---------------------------------------------------------

    def symbol(self, expr):
        key = str(expr)
        if key not in self.symbols:
            self.symbols[key] = self.g.add_symbol()
        return self.symbols[key]

    def sint(self, v, where, stride=False):
        """An int or Sym for v. A stride of the form c * s (c >= 2, s a
        symbol) is that symbol scaled, so the lowering can see that a tensor
        with one dynamic dim is contiguous."""
        if isinstance(v, torch.fx.Node):  # a size computed in the graph: its symbol
            v = v.meta.get("val")
        if isinstance(v, torch.SymInt):
            expr = v.node.expr
            if getattr(expr, "is_Integer", False):
                return int(expr)
            if stride:
                coeff, rest = expr.as_coeff_Mul()
                if getattr(coeff, "is_Integer", False) and int(coeff) >= 2 and getattr(rest, "is_Symbol", False):
                    return _C.Sym(self.symbol(rest), scale=int(coeff))
            return _C.Sym(self.symbol(expr))
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        raise Unsupported(f"{where}: expected an int or SymInt, got {type(v).__name__}")

    def meta(self, t, where):
        if not isinstance(t, torch.Tensor):
            raise Unsupported(f"{where}: produces {type(t).__name__}, not a tensor")
        if t.dtype not in DTYPE_CODES:
            raise Unsupported(f"{where}: dtype {t.dtype} is not supported")
        if t.layout != torch.strided:
            raise Unsupported(f"{where}: layout {t.layout} is not supported")
        return (DTYPE_CODES[t.dtype], [self.sint(s, where) for s in t.shape],
                [self.sint(s, where, stride=True) for s in t.stride()])

    # -- arguments ----------------------------------------------------------

    def tensor_ref(self, v, where):
        if not isinstance(v, torch.fx.Node) or not isinstance(self.ids.get(v), int):
            raise Unsupported(f"{where}: expected a tensor value, got {v!r}")
        return self.ids[v]

    def arg(self, jit_type, value, where):
        kind = jit_type.kind()
        if value is None:
            return (_C.ARG_NONE, None)
        if kind == "OptionalType":
            jit_type = jit_type.getElementType()
            kind = jit_type.kind()
        # TorchScript types dtype, layout and memory format as int: go by value
        if isinstance(value, torch.dtype):
            if value not in DTYPE_CODES:
                raise Unsupported(f"{where}: dtype {value} is not supported")
            return (_C.ARG_DTYPE, DTYPE_CODES[value])
        if isinstance(value, torch.layout):
            return (_C.ARG_LAYOUT, LAYOUT_CODES[value])
        if isinstance(value, torch.memory_format):
            return (_C.ARG_MEMFMT, MEMFMT_CODES[value])
        if isinstance(value, torch.device):
            return (_C.ARG_DEVICE, str(value))
        if kind == "TensorType":
            if isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), (torch.SymInt, torch.SymFloat,
                                                                                      torch.SymBool)):
                value = value.meta["val"]  # a number computed in the graph (a dynamic int input)
            if isinstance(value, (bool, int, float, complex, torch.SymInt, torch.SymFloat, torch.SymBool)):
                # a wrapped number: ATen promotes it as a scalar (see _scalar_form)
                return self.arg(torch._C.NumberType.get(), value, where)
            return (_C.ARG_TENSOR, self.tensor_ref(value, where))
        if kind == "ListType":
            elem = jit_type.getElementType().kind()
            if elem == "TensorType":
                return (_C.ARG_TENSOR_LIST, [self.tensor_ref(v, where) for v in value])
            if elem == "OptionalType" and jit_type.getElementType().getElementType().kind() == "TensorType":
                # index's indices: None where a dim is taken whole
                return (_C.ARG_OPT_TENSOR_LIST, [None if v is None else self.tensor_ref(v, where) for v in value])
            if elem in ("IntType", "SymIntType"):
                items = value if isinstance(value, (list, tuple)) else [value]
                return (_C.ARG_INT_LIST, [self.sint(v, where) for v in items])
            if isinstance(value, (list, tuple)) and not value:
                return (_C.ARG_INT_LIST, [])  # empty: the same argument whatever its elements' type (Scalar?[])
            raise Unsupported(f"{where}: list of {elem} arguments are not supported")
        if kind in ("IntType", "SymIntType", "NumberType", "FloatType", "SymFloatType", "BoolType", "SymBoolType"):
            if isinstance(value, torch.fx.Node) and not isinstance(value.meta.get("val"), torch.Tensor):
                value = value.meta.get("val")  # a size computed in the graph
            if isinstance(value, (torch.SymFloat, torch.SymBool)):
                # a number only known at run time: a fallback node's argument (sizes are SymInts)
                return (_C.ARG_STRING, f"{type(value).__name__}({value.node.expr})")
            if isinstance(value, complex):  # x * 1j: no kernel of ours takes it, a fallback node's argument
                return (_C.ARG_STRING, repr(value))
            if isinstance(value, bool) or kind in ("BoolType", "SymBoolType"):
                return (_C.ARG_BOOL, int(bool(value)))
            if isinstance(value, float) or kind in ("FloatType", "SymFloatType"):
                return (_C.ARG_FLOAT, float(value))
            s = self.sint(value, where)
            return (_C.ARG_SYM, s) if isinstance(s, _C.Sym) else (_C.ARG_INT, s)
        if kind == "StringType":
            return (_C.ARG_STRING, str(value))
        if kind == "DeviceObjType":
            return (_C.ARG_DEVICE, str(torch.device(value)))
        raise Unsupported(f"{where}: argument type {jit_type} is not supported")

    def bind(self, node, where):
        """Arguments of node in schema order, with defaults filled in."""
        schema = node.target._schema
        out = []
        positional = list(node.args)
        for i, a in enumerate(schema.arguments):
            if not a.kwarg_only and i < len(positional):
                value = positional[i]
            elif a.name in node.kwargs:
                value = node.kwargs[a.name]
            elif a.has_default_value():
                value = a.default_value
            else:
                raise Unsupported(f"{where}: argument '{a.name}' is missing")
            out.append(self.arg(a.type, value, f"{where} argument '{a.name}'"))
        return out

    def higher_order(self, node, gm, where):
        """A fallback node for a higher-order op's call (torch.cond,
        torch.library custom ops that write their arguments, flex_attention,
        map): PyTorch runs it, with its subgraphs as they are. Its arguments
        are the tensors it reads, and one string of everything else, the
        subgraphs by their code's hash: graphs that differ only inside a
        subgraph get different keys."""
        def described(n):
            if isinstance(self.ids.get(n), int):
                return "%tensor"
            value = n.meta.get("val")
            if value is None and n.op == "get_attr" and gm is not None:
                value = _fetch_attr(gm, n.target)
            if isinstance(value, torch.nn.Module):
                return f"%subgraph {_C.content_key(_module_code(value).encode()).hex()}"
            return f"%{type(value).__name__}"
        text = repr(torch.fx.node.map_arg((node.args, node.kwargs), described))
        args = [(_C.ARG_TENSOR, self.ids[n]) for n in node.all_input_nodes if isinstance(self.ids.get(n), int)]
        args.append((_C.ARG_STRING, text))
        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (list, tuple)) else [val]
        ids = iter(self.g.add_node("fallback", args, [self.meta(v, where) for v in vals if v is not None],
                                   target=op_name(node.target)))
        out = tuple(None if v is None else next(ids) for v in vals)
        return out if isinstance(val, (list, tuple)) else out[0]


def _module_code(module):
    """The Python code of a subgraph module and of the modules inside it."""
    code = getattr(module, "code", "") if isinstance(module, torch.fx.GraphModule) else repr(module)
    return code + "".join(f"\n{name}: {_module_code(m)}" for name, m in module.named_children())


def _fetch_attr(gm, target):
    """The attribute of gm that a get_attr node names (a dotted path)."""
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def marked(value):
    """Whether value is a tensor marked conjugate or negative: a lazy view
    (z.conj(), z.conj().imag) whose values are its memory's conjugate or
    negation, which our kernels, reading memory, would not see."""
    return isinstance(value, torch.Tensor) and (value.is_conj() or value.is_neg())


def from_fx(gm, roles=None):
    """Imports an ATen-level FX GraphModule (or Graph) into a ``_C.Graph``.

    roles: one entry per placeholder, in order: ``("arg", position, path)``,
    ``("param", qualified_name)`` or ``("const", number)``; by default every
    placeholder is the argument at its position. Raises :class:`Unsupported`
    (naming the node) for anything the IR cannot hold, and ``_C.GraphError``
    if the C builder rejects a node.
    """
    graph = gm.graph if hasattr(gm, "graph") else gm
    imp = _Importer()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if roles is None:
        roles = [("arg", i, "") for i in range(len(placeholders))]
    if len(roles) != len(placeholders):
        raise ValueError(f"roles has {len(roles)} entries for {len(placeholders)} placeholders")
    for node, role in zip(placeholders, roles):
        where = f"input {node.name}"
        if _is_size(node):
            continue  # a dynamic size: it stays in the FX graph; the IR sees its symbol
        dtype, sizes, strides = imp.meta(node.meta.get("val"), where)
        if role[0] == "arg":
            vid = imp.g.add_input("arg", dtype, sizes, strides, index=role[1], name=role[2])
        elif role[0] == "param":
            vid = imp.g.add_input("param", dtype, sizes, strides, name=role[1])
        elif role[0] == "const":
            vid = imp.g.add_input("const", dtype, sizes, strides, index=role[1])
        else:
            raise ValueError(f"unknown role {role!r} for {node.name}")
        imp.ids[node] = vid

    result = Imported(graph=imp.g, inputs=list(roles), symbols=imp.symbols)
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        # a tensor constant of the module (torch.tensor(...) in the traced
        # code): an input of the graph, which reads it from the module
        where = f"constant {node.name} ({node.target})"
        value = node.meta.get("val")
        if value is None and hasattr(gm, "graph"):
            value = _fetch_attr(gm, node.target)
        if isinstance(value, torch.nn.Module):  # a subgraph of a higher-order op (torch.cond's branches):
            continue  # a constant of the op's fallback node
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"{where}: a {type(value).__name__}, not a tensor")
        dtype, sizes, strides = imp.meta(value, where)
        role = ("const", sum(r[0] == "const" for r in result.inputs))
        imp.ids[node] = imp.g.add_input("const", dtype, sizes, strides, index=role[1])
        result.inputs.append(role)
    for node in graph.nodes:
        where = f"node {node.name} ({node.target})"
        if node.op in ("placeholder", "get_attr"):  # inputs, added above
            continue
        if node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            # sizes, numbers and None a graph returns (Dynamo's shape outputs) are no values of the IR's
            imp.g.set_outputs([imp.tensor_ref(o, f"output {i}") for i, o in enumerate(outs)
                               if isinstance(o, torch.fx.Node) and not _is_size(o)])
            continue
        if node.op != "call_function":
            raise Unsupported(f"{where}: {node.op} nodes are not supported")
        if _is_size(node):
            continue  # size arithmetic (sym_size, operator.mul, ...) runs in the FX graph
        if node.target is operator.getitem:
            src, idx = node.args
            ids = imp.ids.get(src)
            if not isinstance(ids, tuple):
                raise Unsupported(f"{where}: getitem of a non-tuple value")
            imp.ids[node] = ids[idx]
            continue
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            imp.ids[node] = imp.higher_order(node, gm if hasattr(gm, "graph") else None, where)
            result.fallback_ops.append(op_name(node.target))
            result.node_ops.append("fallback")
            result.fx_nodes.append(node)
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            raise Unsupported(f"{where}: only ATen operators are supported")
        name = op_name(node.target)
        args = imp.bind(node, where)
        val = node.meta.get("val")
        # an op that returns nothing (a check that raises, aten._linalg_check_errors): a node without outputs
        vals = list(val) if isinstance(val, (list, tuple)) else [] if val is None and not node.users else [val]
        outs = [imp.meta(v, where) for v in vals]
        in_table = name in _OP_NAMES
        if any(a.type.kind() == "TensorType" and tag != _C.ARG_TENSOR
               for a, (tag, _) in zip(node.target._schema.arguments, args)):
            # a number where the schema says Tensor: the .Scalar overload, else a fallback
            alt = _scalar_form(name, args)
            in_table = alt is not None and _C.op_signature(alt)[0].count("T") <= sum(
                tag == _C.ARG_TENSOR for tag, _ in args)
            name = alt if in_table else name
        if in_table and any(marked(a.meta.get("val")) for a in node.all_input_nodes):
            # a lazy conjugate or negative view (z.conj(), z.conj().imag): its values are not its memory,
            # which our kernels read; PyTorch's op reads the mark
            in_table = False
        if in_table:
            # arguments the op's signature does not take (a number only known at run time):
            # a fallback node, which PyTorch runs
            ids = imp.g.add_node(name, args, outs, or_fallback=op_name(node.target))
            in_table = imp.g.node_op(imp.g.num_nodes - 1) != "fallback"
        else:
            ids = imp.g.add_node("fallback", args, outs, target=name)
        if in_table:
            result.lowered_nodes += 1
            result.node_ops.append(name)
        else:
            result.fallback_ops.append(op_name(node.target))
            result.node_ops.append("fallback")
        result.fx_nodes.append(node)
        imp.ids[node] = ids if isinstance(val, (list, tuple)) else ids[0] if ids else None
    result.fx_values = {vid: node for node, vid in imp.ids.items() if isinstance(vid, int)}
    return result


def draws(gm):
    """Whether graph gm draws random numbers (an op tagged
    nondeterministic_seeded: rand, dropout, bernoulli, randint)."""
    return any(node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and
               torch.Tag.nondeterministic_seeded in node.target.tags for node in gm.graph.nodes)
