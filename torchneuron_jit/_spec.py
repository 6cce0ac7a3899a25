"""Guard programs in words: the instructions csrc/guards runs (a Spec is
one program with the words for each slot), and the sentence that says why
one failed (explain). Shared by the jit door (_jit.py) and its trace
records (_records.py), which import this and not each other.
"""
import functools
import math
import struct
import types

import torch

from . import _C

PRIMITIVES = (bool, int, float, str, type(None))
# the attributes torch sets on a tensor for TorchDynamo (torch 2.13's: a transformers StaticCache's tensors are
# marked static addresses, _dynamo_static_input_type; torch._dynamo.mark_dynamic sets _dynamo_dynamic_indices,
# _specialize_on, ...): its own marks, which no model code reads, and the tensors a compiled call makes go without.
# The C "bare" guard reads this set
TORCH_MARKS = frozenset((
    "_dynamo_dynamic_indices", "_dynamo_dynamic_range", "_dynamo_hint_overrides", "_dynamo_marked_static",
    "_dynamo_propagated_dynamic_indices", "_dynamo_shape_ids", "_dynamo_source", "_dynamo_static_indices",
    "_dynamo_static_input_type", "_dynamo_strict_unbacked_indices", "_dynamo_unbacked_bounds",
    "_dynamo_unbacked_indices", "_dynamo_weak_dynamic_indices", "_has_dynamo_dim_marking", "_specialize_on"))


def user_attributes(t):
    """The names of tensor t's Python attributes but torch's own marks."""
    return [str(k) for k in vars(t) if k not in TORCH_MARKS]


def _numpy_scalar_types():
    """numpy's bool, integer and float scalar types (scale = 1 / np.sqrt(d)
    is an np.float64): immutable, guarded by type and value as floats are,
    described in records by their Python value (item()); none without
    numpy."""
    try:
        import numpy as np
    except ImportError:
        return ()
    return tuple(t for t in set(np.sctypeDict.values()) if isinstance(t, type) and
                 issubclass(t, (np.integer, np.floating, np.bool_)) and not issubclass(t, np.timedelta64) and
                 t is not np.longdouble)


NUMPY_SCALARS = _numpy_scalar_types()
_C.guard_value_types(NUMPY_SCALARS)  # a globals snapshot's too: a new np.float64 of the same value passes


def state_in_dict(t, base=()):
    """Whether instances of class t keep all their state in __dict__ (and,
    for a subclass of a class in base, in what that class holds): every
    class of its MRO but object and base's defined in Python, with no
    __slots__ but __dict__ and __weakref__, and no fields of C besides (a
    dict subclass keeps its items elsewhere, a slot its value, an extension
    type its fields: tokenizers' Encoding, a class made in Rust, is a heap
    type with a __dict__ and 272 bytes of its own). types.SimpleNamespace,
    a C type, keeps its state in __dict__ alone."""
    for cls in t.__mro__:
        if cls is object or cls in base or cls is types.SimpleNamespace:
            continue
        if not cls.__flags__ & _HEAPTYPE:
            return False
        slots = cls.__dict__.get("__slots__", ())
        if set([slots] if isinstance(slots, str) else slots) - {"__dict__", "__weakref__"}:
            return False
    floor = max([b.__basicsize__ for b in base + (types.SimpleNamespace,) if b in t.__mro__] or
                [object.__basicsize__])
    return t.__basicsize__ <= floor + 2 * _POINTER  # a __dict__ and a __weakref__ at most


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python (or made by an extension at run time)
_POINTER = struct.calcsize("P")


def namedtuple_value(value):
    """Whether value is a NamedTuple's (typing.NamedTuple, collections.namedtuple:
    torch's PackedSequence): a tuple subclass with _fields, its items its
    fields."""
    return isinstance(value, tuple) and isinstance(getattr(type(value), "_fields", None), tuple)


def same_value(a, b):
    """Whether a and b are the same guarded value: one object, or of one
    type and equal; floats (numpy's scalars, complex numbers' parts) of one sign too
    (-0.0 is not 0.0: x / z differs), any NaN the same (the C guards'
    same_value)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is complex:
        return same_value(a.real, b.real) and same_value(a.imag, b.imag)
    if isinstance(a, float) or type(a) in NUMPY_SCALARS:  # an np.float64's sign and NaN too
        return (bool(a == b) and math.copysign(1.0, float(a)) == math.copysign(1.0, float(b))) or \
            bool(a != a and b != b)
    return a == b


class Spec(list):
    """A guard program (csrc/guards/guards.h) with the words for each slot,
    and how to find each object a "const" holds in another process (the
    path _records.py stores in place of the object)."""

    def __init__(self):
        super().__init__()
        self.names = []  # per instruction: what it loads or checks, in the user's words
        self.paths = {}  # const slot -> path (_records._resolve)

    def add(self, inst, name, path=None):
        self.append(inst)
        self.names.append(name)
        if path is not None:
            self.paths[len(self) - 1] = path
        return len(self) - 1



NO_FIELD = object()  # func_field's answer for a value of another kind


def func_field(value, field):
    """What a "func" load (csrc/guards/guards.h) of field loads from value:
    a function's __code__, __defaults__, __kwdefaults__ or __closure__, a
    functools.partial's func, args or keywords (partial_*); NO_FIELD where
    value is not of the field's kind."""
    if field.startswith("partial_"):
        return getattr(value, field[len("partial_"):]) if type(value) is functools.partial else NO_FIELD
    return getattr(value, f"__{field}__") if type(value) is types.FunctionType else NO_FIELD


def load(spec, args, slot):
    inst = spec[slot]
    kind = inst[0]
    if kind == "arg":
        return args[inst[1]]
    if kind == "const":
        return inst[1]
    if kind == "cell":
        return load(spec, args, inst[1]).cell_contents
    if kind == "attrs":
        return vars(load(spec, args, inst[1]))
    if kind == "func":
        value = func_field(load(spec, args, inst[1]), inst[2])
        if value is NO_FIELD:
            raise TypeError(f"{spec.names[slot]}: no function")
        return value
    parent = load(spec, args, inst[1])
    return parent[inst[2]]


def held_kind(spec, slot):
    """What slot of spec holds, in a word: "tensor", "list", "dict" or
    "object", read off its type guard."""
    for inst in spec:
        if inst[0] == "type" and inst[1] == slot:
            t = inst[2]
            return "tensor" if issubclass(t, torch.Tensor) else t.__name__ if t in (list, dict) else "object"
    return "object"


def tensor_distance(spec, args, index):
    """How many of dtype, requires_grad, rank, sizes and strides differ at a
    failing tensor guard (0 for other guards)."""
    inst = spec[index]
    if inst[0] != "tensor":
        return 0
    value = load(spec, args, inst[1])
    _, _, dtype, sizes, strides, rg = inst
    if not isinstance(value, torch.Tensor):
        return 5
    strides = dense_strides(tuple(value.shape)) if strides is None else strides
    return ((value.dtype != dtype) + (value.requires_grad != rg) + (value.dim() != len(sizes))
            + sum(a is not None and a != b for a, b in zip(sizes, value.shape))
            + (not same_strides(tuple(value.shape), tuple(value.stride()), strides)))


def same_strides(sizes, strides, want):
    """Whether strides are want's in every dimension whose size is more
    than 1 and whose want is not None, as a tensor guard compares them (no
    element is read through the stride of a dimension of size 0 or 1)."""
    return len(strides) == len(want) and all(n <= 1 or b is None or a == b for n, a, b in zip(sizes, strides, want))


def dense_strides(sizes):
    """The row-major strides of sizes (a size 0 or 1 counts as 1), as
    torch.empty gives them and a tensor guard whose strides are None checks
    them."""
    out, s = [], 1
    for n in reversed(sizes):
        out.append(s)
        s *= max(n, 1)
    return tuple(reversed(out))


# the opcodes of a "sizes" guard program (csrc/guards/guards.h)
CONST, DIM, ADD, MUL, FLOORDIV, MOD, EQ, NE, LT, LE, AND, OR, NOT, MAX, MIN, NEG, INT, TRUNCMUL = range(18)


def size_dims(prog):
    """The (slot, dimension) pairs a "sizes" program reads, in order; an
    int argument's (INT slot) is (slot, None)."""
    out, k = [], 0
    while k < len(prog):
        if prog[k] in (CONST, TRUNCMUL):  # CONST c, TRUNCMUL c
            k += 2
        elif prog[k] == DIM:  # DIM slot d
            out.append((prog[k + 1], prog[k + 2]))
            k += 3
        elif prog[k] == INT:  # INT slot
            out.append((prog[k + 1], None))
            k += 2
        else:
            k += 1
    return out


def explain(spec, args, index):
    inst, name = spec[index], spec.names[index]
    kind = inst[0]
    if kind in ("item", "key"):
        return f"{name}: missing"
    if kind == "attrs":
        return f"{name}: no attributes"
    if kind == "func":
        return f"{name}: no function"
    if kind == "sizes":
        dims = dict.fromkeys(size_dims(inst[1]))
        values = ", ".join(f"{spec.names[slot]} is {load(spec, args, slot)}" if d is None else
                           f"{spec.names[slot]}.size({d}) is {load(spec, args, slot).shape[d]}" for slot, d in dims)
        return f"sizes: {name} fails ({values})"
    if kind == "call":
        def word(v):
            return ("on" if v else "off") if isinstance(v, bool) else str(v).removeprefix("torch.")
        return f"{name}: {word(inst[2])} → {word(inst[1]())}"
    if kind == "distinct":
        seen = {}
        for slot in inst[1]:
            other = seen.setdefault(id(load(spec, args, slot)), slot)
            if other != slot:
                return f"{spec.names[slot]}: another {held_kind(spec, slot)} than {spec.names[other]} → {spec.names[other]} itself"
        return f"{name}: different objects → the same"
    value = load(spec, args, inst[1])
    if kind == "type":
        return f"{name}: type {inst[2].__name__} → {type(value).__name__}"
    if kind == "is":
        return f"{name}: {short(inst[2])} → {short(value)}"
    if kind == "same":
        return f"{name}: the same {held_kind(spec, inst[1])} as {spec.names[inst[2]]} → another"
    if kind == "order":
        got = tuple(sorted(range(value.dim()), key=lambda d: (-value.stride(d), d)))
        return f"{name}: strides in the order {inst[2]} → {got}"
    if kind == "plain":
        return f"{name}: marks plain → {'conjugate' if value.is_conj() else 'negative'} (a lazy view: x.conj())"
    if kind == "bare":
        return f"{name}: no Python attributes → {', '.join(user_attributes(value))}"
    if kind == "isweak":
        was = inst[2]()
        return f"{name}: {short(was) if was is not None else 'a module no longer alive'} → {short(value)}"
    if kind == "eq":
        return f"{name}: {inst[2]!r} → {value!r}"
    if kind == "len":
        if len(inst) > 3 and len(value) == inst[2]:
            return f"{name}: keys {list(inst[3])} → {list(value)}"
        return f"{name}: length {inst[2]} → {len(value)}"
    if kind == "tensor":
        _, _, dtype, sizes, strides, rg = inst
        if value.dtype != dtype:
            return f"{name}: dtype {dtype} → {value.dtype}"
        if not value.is_cpu:
            return f"{name}: device cpu → {value.device}"
        if value.requires_grad != rg:
            return f"{name}: requires_grad {rg} → {value.requires_grad}"
        if value.dim() != len(sizes):
            return f"{name}: rank {len(sizes)} → {value.dim()}"
        for d, (a, b) in enumerate(zip(sizes, value.shape)):
            if a is not None and a != b:
                return f"{name}: size[{d}] {a} → {b}"
        sizes = tuple(value.shape)  # those the guard checks are the tensor's now
        if strides is None:  # row-major for whatever sizes the tensor has
            strides = dense_strides(sizes)
        return f"{name}: strides {strides} → {tuple(value.stride())} ({layout(sizes, strides)} → " \
               f"{layout(tuple(value.shape), tuple(value.stride()))})"
    if kind == "dict":
        keys, values = inst[2], inst[3]
        for k, want in zip(keys, values):
            if want is _C.GUARD_ABSENT:
                if k in value:
                    return shadowed(name, k)
                continue
            if k not in value:
                return f"{entry_name(name, k)}: removed"
            if want is _C.GUARD_ANY:
                continue
            got = value[k]
            if not (got is want or (type(want) in PRIMITIVES and same_value(got, want))):
                return f"{entry_name(name, k)}: {short(want)} → {short(got)}"
        extra = [k for k in value if k not in keys]
        return f"{name}: new entries {extra[:3]}" if extra else f"{name}: changed"
    return f"{name}: guard {kind} failed"


def entry_name(name, key):
    """Entry key of the dict snapshot called name, in words: a global, a
    dict's item (snapshots named "X[...]"), an object's attribute ("X.*")
    or a module's."""
    if name == "globals":
        return f"global {key}"
    if name.endswith("[...]"):
        return f"{name[:-5]}[{key!r}]"
    return f"{name[:-2] if name.endswith('.*') else name}.{key}"


def shadowed(name, key):
    """The words of a global key, in the globals snapshot called name,
    that has come to shadow the builtin the traced code read."""
    return f"{entry_name(name, key)}: defined, where the builtin {key} was read"


def short(v):
    if type(v) in PRIMITIVES:
        return repr(v)
    if isinstance(v, torch.Tensor):  # which one, too: W = W - lr * g rebinds it to another of the same kind
        return f"a tensor {tuple(v.shape)} {v.dtype} at {id(v):#x}"
    if isinstance(v, type):
        return f"class {v.__qualname__}"
    return f"a {type(v).__name__} at {id(v):#x}"


def layout(sizes, strides):
    """contiguous, channels_last or other: whether the strides are dense in
    row-major order, or (4-D) in N, H, W, C order; size-1 dims do not count."""
    def dense(order):
        expect = 1
        for d in reversed(order):
            if sizes[d] != 1 and strides[d] != expect:
                return False
            expect *= sizes[d]
        return True
    if dense(range(len(sizes))):
        return "contiguous"
    if len(sizes) == 4 and dense((0, 2, 3, 1)):
        return "channels_last"
    return "other"
