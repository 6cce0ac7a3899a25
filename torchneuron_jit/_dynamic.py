"""Dynamic sizes for the jit door: one variant for every size of a dimension.

A traced call's graph is specialised to its sizes. When a tensor argument's
dimension has taken ``config.dynamic_after`` distinct sizes at the same
place (the argument's path, its rank, the dimension), the trace of that
call is made again, symbolically: the function runs once more under
``make_fx`` over fake tensors whose changing dimensions are symbols of a
``ShapeEnv``, so size arithmetic done in Python (``x.view(b, s, h, d)``,
``torch.arange(x.size(1))``) stays arithmetic on symbols in the graph.
What the code needed of the sizes (``s1 == s2``, ``s1 >= 2``, a size it
specialised on) is the ShapeEnv's guards; they become "sizes" guards
(csrc/guards), evaluated in C on every call. The kernels take sizes at run
time, so the graph compiles once.

Why make_fx over the function rather than generalising two recorded traces:
it is PyTorch's own symbolic reasoning (every op's meta function, the
guards it makes), so a relation the code depends on cannot be missed, and a
branch on a size becomes a guard instead of a wrong answer. The price is a
second run of the function's Python over fake tensors; it runs only for a
trace that did nothing a compiled call would skip (no writes, no print, no
value read from a tensor), since those make the variant eager or static
anyway.

Sizes 0 and 1 stay specialised (the ShapeEnv's rule; a dimension of size 1
broadcasts): a call whose changing dimension is 0 or 1 gets a static
variant, and the dynamic variant guards ``s >= 2``.

An int argument (at any path inside the arguments) that takes
``config.dynamic_after`` distinct values is made a symbol the same way
(a SymInt input of the graph, which the plan receives as an int): its
guard becomes "any int" plus the relations the code needs of it
(``Eq(Mod(64, heads), 0)``), read by the "sizes" programs' INT opcode.
0 and 1 stay specialised, and an int the code needs the value of
(``range(n)``, an index into a Python list) stays static: the ShapeEnv
pins it, and the reason goes to the recompilation manager. A float
argument becomes a SymFloat input guarded by its type alone: a guard
program is integer arithmetic, so code that needs a relation of the float
(a branch on it) keeps it static.
"""
import contextlib
import copy
import enum
import inspect
import math
import struct
import sys
import threading
import types
import weakref

import sympy
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import config
from ._records import library_code, versioned_code
from ._spec import (ADD, AND, CONST, DIM, EQ, FLOORDIV, INT, LE, LT, MAX, MIN, MOD, MUL, NE, NOT, OR, TRUNCMUL,
                    dense_strides, load, same_strides, same_value, state_in_dict)

_MAX_VALUES = 64  # distinct sizes remembered per place
_ABSENT = object()  # an attribute an object does not have


class Static(Exception):
    """This trace cannot be made symbolic: it stays specialised (why, in words)."""


class Pinned(Static):
    """A tensor dimension the code needs the value of (range(x.size(1))):
    made symbolic, it comes back fixed to this call's size. It stays static
    at its site; the trace may be symbolic in the others. slot and dim name it."""

    def __init__(self, words, slot, dim):
        super().__init__(words)
        self.slot, self.dim = slot, dim


# JitFunction (or the function, for a trace without one) -> {(argument words, rank, dimension): sizes it took}.
# Per JitFunction: two jitted models of one class share their forward, and a second model of another width had
# every weight's dimension made symbolic at its first call
_seen = weakref.WeakKeyDictionary()


def _owner(trace):
    """What trace's size history is kept under: its JitFunction, else its function."""
    jf = trace.jf() if trace.jf is not None else None
    return jf if jf is not None else trace.fn


def observe(trace):
    """Notes the sizes of the traced call's tensor arguments and the values
    of its int and float arguments, and returns {slot: dimensions} of those
    that have now taken config.dynamic_after distinct values (this call's
    among them): a tensor's dimensions whose size here is 2 or more, where
    the tensor is row-major, and the dimensions of the same size of a
    tensor first seen here; {None} for an int argument whose value here
    is not 0 or 1, or a finite float. These are made symbolic. A tensor
    argument whose strides have taken config.dynamic_after layouts that
    are not row-major has STRIDES_PLACE among its dimensions: its variant
    takes it copied dense (densified)."""
    after = config.dynamic_after
    try:
        seen = _seen.setdefault(_owner(trace), {})
    except TypeError:  # not weakly referable: nothing is remembered
        return {}
    spec, out = trace.spec, {}
    new, changing = [], set()  # (slot, dimension, size) of places first seen; sizes of dimensions made symbolic
    for i in range(trace.argument_guards):
        inst = spec[i]
        if inst[0] == "eq" and type(inst[2]) in (int, float) and _argument_path(spec, inst[1]) is not None:
            place = INT_PLACE if type(inst[2]) is int else FLOAT_PLACE
            values = seen.setdefault((spec.names[i], place, None), set())
            if len(values) < _MAX_VALUES:
                values.add(inst[2])
            if 0 < after <= len(values) and (inst[2] not in (0, 1) if place == INT_PLACE else math.isfinite(inst[2])):
                out[inst[1]] = {None}
            continue
        if inst[0] != "tensor":
            continue
        _, slot, _, sizes, strides, _ = inst
        # row-major, or a slice of a buffer whose strides stay as they are (a sliding window's cache: its
        # keys[:, :, -w:] at every batch size); a tensor whose strides keep changing (ids[:, -1:] of ids that
        # grow, a transpose of a growing tensor) is copied dense for its variant (STRIDES_PLACE among its
        # dimensions): its sizes count as a row-major tensor's
        row_major = same_strides(sizes, strides, dense_strides(sizes))
        if not row_major:
            layouts = seen.setdefault((spec.names[i], len(sizes), STRIDES_PLACE), set())
            if len(layouts) < _MAX_VALUES:
                layouts.add(tuple(st if n > 1 else None for n, st in zip(sizes, strides)))
            row_major = len(layouts) == 1
            if 0 < after <= len(layouts) and _argument_path(spec, slot) is not None:
                out.setdefault(slot, set()).add(STRIDES_PLACE)
                row_major = True
        for d, n in enumerate(sizes):
            place = (spec.names[i], len(sizes), d)
            if place not in seen and n >= 2 and row_major:
                new.append((slot, d, n))
            values = seen.setdefault(place, set())
            if len(values) < _MAX_VALUES:
                values.add(n)
            if 0 < after <= len(values) and n >= 2 and row_major:
                out.setdefault(slot, set()).add(d)
                changing.add(n)
    # an argument first seen in this call (an attention mask after calls without one) whose dimension has the size
    # of one made symbolic here: symbolic too, else its one size would pin the other's (s1 == 8) and the next
    # length would trace again
    for slot, d, n in new:
        if n in changing:
            out.setdefault(slot, set()).add(d)
    return out


def _same_path(trace, sites):
    """Raises Static where the user's code took another path for symbolic
    sizes than for the traced call's (op_site, path_of): a branch on
    isinstance(n, int) or type(x) is torch.Tensor (a SymInt is no int, a
    fake tensor no plain Tensor), torch.fx's is_fx_tracing(). Library
    code may take other paths (transformers checks a mask's values only
    outside tracing): its ops count as the user's line that called it."""
    real, symbolic = path_of(trace.recorder.sites), path_of(sites)
    if real == symbolic:
        return
    k = next((k for k, (a, b) in enumerate(zip(real, symbolic)) if a != b), min(len(real), len(symbolic)))
    site = (real[k:k + 1] or symbolic[k:k + 1])[0]
    where = f" at {site[0].co_filename}:{_line_of(*site)}" if site is not None else ""
    raise Static(f"its code took another path{where} for symbolic sizes than for the traced call's (a check of "
                 "isinstance(n, int), type(x) is torch.Tensor or is_fx_tracing(): a symbolic size is no int, a "
                 "fake tensor no plain Tensor)")


def _line_of(code, lasti):
    """The line of instruction offset lasti of code."""
    return next((line for start, end, line in code.co_lines() if start <= lasti < end and line is not None),
                code.co_firstlineno)


INT_PLACE, FLOAT_PLACE = "int", "float"  # the rank of an int or float argument's place in the history
# what a tensor answers about its strides (read by code outside torch, the variant of a tensor copied dense is
# static in its strides instead)
_STRIDE_READS = frozenset(("stride", "is_contiguous", "is_non_overlapping_and_dense"))
STRIDES_PLACE = "strides"  # the dimension of the place whose history is a tensor's strides (those not row-major)


def _argument_path(spec, slot):
    """Where the value slot loads lies inside the call's arguments: (the
    pytree key path of the argument's leaf that holds it (a tuple of
    argument positions, items, keys), the steps from that leaf to it as
    held_values makes them (("a", attribute) or ("i", index or key); none
    but for a value an argument's object holds)), or None when it is not
    loaded from the arguments (a closure cell, a constant)."""
    from torch.utils._pytree import MappingKey, SequenceKey
    path, steps = [], []  # from slot upwards
    while True:
        inst = spec[slot]
        if inst[0] == "arg":
            path.append(SequenceKey(inst[1]))
            return tuple(reversed(path)), tuple(reversed(steps))
        if inst[0] == "attrs":  # the value lies inside the object loaded at inst[1]
            steps.extend(("a", k.key) if isinstance(k, MappingKey) else ("i", k.idx) for k in path)
            steps[len(steps) - 1] = ("a", steps[-1][1])  # the first step below the object: its attribute
            path = []
        elif inst[0] == "item":
            path.append(SequenceKey(inst[2]))
        elif inst[0] == "key":
            path.append(MappingKey(inst[2]))
        else:
            return None
        slot = inst[1]


def history(jf):
    """{(argument words, rank, dimension): sorted sizes} jit has seen for JitFunction jf."""
    return {k: sorted(v, key=repr) if k[2] == STRIDES_PLACE else sorted(v) for k, v in _seen.get(jf, {}).items()}


def frame_call(fn, local_args):
    """Calls fn with the values its frame had as its arguments (positional,
    keyword-only, *args, **kwargs in the order of co_varnames)."""
    code = fn.__code__
    n = code.co_argcount
    pos = list(local_args[:n])
    kw = {name: v for name, v in zip(code.co_varnames[n:n + code.co_kwonlyargcount],
                                      local_args[n:n + code.co_kwonlyargcount])}
    k = n + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        pos.extend(local_args[k])
        k += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kw.update(local_args[k])
    return fn(*pos, **kw)


class Symbolic:
    """A trace made again over symbolic sizes: its graph (functional,
    decomposed), per graph input its spec slot (an int) or, for a tensor the
    real trace captured, the tensor; real example inputs for the back end;
    the write-backs; the guards on sizes as [(program, words)]; and the
    symbolic dimensions ({slot: [dimension]}) and the strides of those
    tensors that keep their own ({slot: strides}: a slice of a fixed
    buffer) or take any (all None: copied dense, as dense says); the value
    checks, as the runner takes them (a library may read no value of a
    fake tensor, e.g. transformers' masks: then there are none)."""

    def __init__(self, fgm, slots, examples, checks, writebacks, guards, dims, numbers=(), sets=(), strides=None,
                 dense=(), orders=None):
        self.fgm, self.slots, self.examples, self.checks = fgm, slots, examples, checks
        # slot -> the strides a slice keeps at every size (not row-major); all None: any, copied dense
        self.strides = dict(strides or {})
        # (number among the graph's inputs, dense_order) of those copied dense before it runs
        self.dense = tuple(dense)
        self.orders = dict(orders or {})  # slot -> the layout order of one copied dense (its "order" guard)
        self.writebacks, self.guards, self.dims = writebacks, guards, dims
        self.numbers = list(numbers)  # (result leaf, path, graph output) of sizes the result's objects hold
        self.sets = list(sets)  # what the call sets on argument objects (_jit._Sets), over this graph's outputs


def decomposed(mode, func, args, kwargs):
    """func's composite decomposition run under mode, or NotImplemented
    where it has none. Under torch.inference_mode the autograd keys are
    skipped, so composite ops reach a dispatch mode whole (is_nonzero,
    item, to): a mode that records or answers value reads sees what it
    sees under no_grad, _local_scalar_dense among them, only through
    their decompositions."""
    if func.namespace != "aten" or not func._can_decompose():  # prim::device has none to run
        return NotImplemented
    with mode:
        return func.decompose(*args, **kwargs)


_USER_CODE = weakref.WeakKeyDictionary()  # code object -> whether it is the user's (not library_code)


def _frame_site(memo, wanted, stop):
    """(code, instruction) of the innermost frame, from the one that called
    into the dispatch mode outwards, whose file wanted(filename) takes
    (memo: code -> its answer), up to the frame of code stop; else None."""
    frame = sys._getframe(3)  # op_site's or read_site's caller: a __torch_dispatch__, or the recorder's _record
    while frame is not None:
        code = frame.f_code
        hit = memo.get(code)
        if hit is None:
            hit = memo[code] = wanted(code.co_filename)
        if hit:
            return code, frame.f_lasti
        if code is stop:
            return None
        frame = frame.f_back
    return None


def _user_file(filename):
    return not library_code(filename)


def _unversioned_file(filename):
    return not versioned_code(filename)


def op_site(stop):
    """Where the op being dispatched was called from: (code, instruction)
    of the innermost frame of the user's code, up to the frame of code
    stop (the traced function's), or None where only library code (torch,
    an installed distribution, the standard library, ours) lies between.
    Called from a dispatch mode's __torch_dispatch__."""
    return _frame_site(_USER_CODE, _user_file, stop)


_READ_CODE = weakref.WeakKeyDictionary()  # code object -> whether it is outside torch, ours and the standard library


def read_site():
    """Where the value being read out of a tensor (item(), int(t)) was
    read: (code, instruction) of the innermost frame outside torch, this
    package and the standard library (a library's own line counts), or
    None. Called from a dispatch mode's __torch_dispatch__: a symbolic
    trace matches its reads to the real trace's by it (_Scalars)."""
    return _frame_site(_READ_CODE, _unversioned_file, None)


# ops that make a tensor of another's values as they are: torch's Python decompositions, which a symbolic trace runs
# (the Python dispatcher), make them where eager's C++ made none (F.dropout(training=False): input.clone())
_COPIES = (torch.ops.aten.clone.default, torch.ops.aten.alias.default, torch.ops.aten.detach.default)


def _same_int(a, b):
    """a == b for ints and SymInts, decided without a guard (SymInts: the
    same expression)."""
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt) and a.node.expr == b.node.expr
    return a == b


def _whole_view(args, out):
    """Whether out is a view of args[0] that is all of it as it is (x[:, :n]
    of n columns): eager's indexing makes no op for it where its sizes are
    ints, a symbolic trace's does."""
    x = args[0] if args else None
    if not (isinstance(out, torch.Tensor) and isinstance(x, torch.Tensor)) or out.dim() != x.dim():
        return False
    return all(_same_int(a, b) for a, b in zip((*out.shape, *out.stride(), out.storage_offset()),
                                               (*x.shape, *x.stride(), x.storage_offset())))


def on_path(func, args, out):
    """Whether op func, called with args, which answered out, counts in the
    sequence of op sites (op_site): one that makes a tensor, but a copy
    (_COPIES) or a view of all of its input; an op that answers a device
    or a size runs only where the sizes are symbolic."""
    return func not in _COPIES and (isinstance(out, torch.Tensor) or (
        isinstance(out, (tuple, list)) and any(isinstance(o, torch.Tensor) for o in out))) and \
        not (func.is_view and _whole_view(args, out))


def path_of(sites):
    """The user's code's path through a call: its op sites (op_site), each
    run of one site counted once (library code may make more or fewer ops
    of one call for symbolic sizes)."""
    return [site for k, site in enumerate(sites) if k == 0 or sites[k - 1] != site]


def _trunc_div(a, b):
    """a / b rounded toward zero, for ints and SymInts (// rounds down)."""
    return a // b if (a >= 0) == (b > 0) else -((-a) // b)


# ops of numbers alone that code computes sizes with through tensors (LED's torch.div(seq_len, w,
# rounding_mode="trunc") - 1): what each makes of its operands (ints or SymInts; alpha for add and sub)
_SIZE_ARITHMETIC = {
    torch.ops.aten.div.Tensor_mode: lambda a, b, rounding_mode=None: (
        a // b if rounding_mode == "floor" else _trunc_div(a, b) if rounding_mode == "trunc" else None),
    torch.ops.aten.floor_divide.default: lambda a, b: a // b,
    torch.ops.aten.remainder.Tensor: lambda a, b: a % b,
    torch.ops.aten.remainder.Scalar: lambda a, b: a % b,
    torch.ops.aten.add.Tensor: lambda a, b, alpha=1: a + alpha * b,
    torch.ops.aten.sub.Tensor: lambda a, b, alpha=1: a - alpha * b,
    torch.ops.aten.mul.Tensor: lambda a, b: a * b,
}


def _size_number(func, args, kwargs, numbers):
    """The int or SymInt a 0-dimensional tensor that op func makes of ints,
    SymInts and such tensors (numbers: id -> (tensor, its number)) holds,
    or None."""
    rule = _SIZE_ARITHMETIC.get(func)
    if rule is None:
        return None
    operands = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            a = numbers.get(id(a), (None, None))[1]
        if isinstance(a, str) or type(a) in (int, torch.SymInt):
            operands.append(a)
        else:
            return None
    try:
        value = rule(*operands[:len(args)], **dict(zip(kwargs, operands[len(args):])))
    except (TypeError, ZeroDivisionError):
        return None
    return value if type(value) in (int, torch.SymInt) else None


class _Scalars(TorchDispatchMode):
    """Answers each value the traced code reads out of a tensor (item(),
    bool()) with the value the real trace read at the same place
    (read_site), and keeps the tensor it was read from: the graph returns
    those tensors, and the variant's value checks compare them on every
    call, as a static variant's do. A read of the real trace that this run
    does not make is passed over: a library's check that it skips while
    tracing (transformers' of a padding mask's values: LED's encoder was
    kept static for it), whose value this graph does not depend on. A
    tensor the code made of sizes and ints alone (torch.div(x.size(1), w,
    rounding_mode="trunc")) is read as the SymInt it holds: the real
    trace's value, answered, pinned the size (a view to it needed
    Eq(s, 28)), and LED's attention kept every length static."""

    def __init__(self, values, sites, stop):
        super().__init__()
        self.values, self.read_sites = list(values), list(sites)
        self.read = []  # (the real trace's read this run's matched, the tensor read: None for a number of sizes)
        self.numbers = {}  # id of a tensor of sizes alone -> (the tensor, the int or SymInt it holds)
        self.stop, self.sites = stop, []  # as the real trace's recorder notes them (op_site)

    @property
    def sources(self):
        """The tensors read whose values the variant checks, in order."""
        return [source for _, source in self.read if source is not None]

    def checked(self):
        """The real trace's values that sources hold, in their order."""
        return [self.values[k] for k, source in self.read if source is not None]

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_inference_mode_enabled():
            out = decomposed(self, func, args, kwargs)
            if out is not NotImplemented:
                return out
        if func is torch.ops.aten._local_scalar_dense.default:
            site = read_site()
            k = self.read[-1][0] + 1 if self.read else 0
            while k < len(self.values) and self.read_sites[k] != site:
                k += 1
            if k >= len(self.values):
                raise Static("the symbolic trace read values out of tensors where the real one did not")
            number = self.numbers.get(id(args[0]), (None, None))[1]
            if number is not None:  # the real trace read the same number here, or the path differs
                hint = number.node.hint if isinstance(number, torch.SymInt) else number
                if hint != self.values[k]:
                    raise Static("the symbolic trace read other values out of tensors than the real one")
                self.read.append((k, None))
                return number
            self.read.append((k, args[0]))
            return self.values[k]
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.dim() == 0:
            number = _size_number(func, args, kwargs, self.numbers)
            if number is not None:
                self.numbers[id(out)] = (out, number)
        if on_path(func, args, out):
            self.sites.append(op_site(self.stop))
        return out


class _Shadows(TorchDispatchMode):
    """Keeps the symbolic trace from writing the real tensors the code
    reaches (a module's buffer, a global): an op on real tensors alone runs
    for real under a fake mode, so self.count.add_(1) would count the trace
    as a call. The first write to such a tensor goes to a copy of it, and
    every op after reads the copy in its place; real_of maps the copy back
    to the real tensor, which the graph takes as an input."""

    def __init__(self):
        super().__init__()
        self.copy_of, self.real_of = {}, {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensor

        kwargs = kwargs or {}
        if self.copy_of:
            args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: self.copy_of.get(id(t), t), (args, kwargs))
        if func._schema.is_mutable:
            args = list(args)
            for i, a in enumerate(func._schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                positional = i < len(args) and not a.kwarg_only
                t = args[i] if positional else kwargs.get(a.name)
                if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor) or id(t) in self.real_of:
                    continue
                if t._is_view():  # its base would not see the copy's writes
                    raise Static("the code writes a view of a tensor it does not take as an argument")
                with torch._C._DisableTorchDispatch():
                    copy = t.clone()
                self.copy_of[id(t)], self.real_of[id(copy)] = copy, t
                if positional:
                    args[i] = copy
                else:
                    kwargs[a.name] = copy
        return func(*args, **kwargs)


def _mutates(gm):
    """Whether graph gm has an op that writes one of its operands (an
    in-place op, copy_, an out= variant): it then needs functionalize."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            return True
    return False


def dense_order(t):
    """The order of t's dimensions, outermost first, that eager lays its
    results out in (torch.empty_like's: t's own strides where t is dense,
    else TensorIterator's inference from them: an expanded dimension keeps
    its place); None when it is row-major's, as for a slice of a buffer
    (ids[:, -1:]); (1, 0) for a transpose."""
    like = torch.empty_like(t, device="meta")
    order = tuple(sorted(range(t.dim()), key=lambda d: (-like.stride(d), d)))
    big = [d for d in order if t.shape[d] > 1]
    return None if big == sorted(big) else order


def densified(t, order):
    """t itself, or a copy of it, dense in order (dense_order; None:
    row-major): what a variant that takes t's strides changing runs on.
    Strides already dense in that order are no copy (a transpose)."""
    if order is None:
        return t.contiguous()
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return t.permute(order).contiguous().permute(inverse)


# -- tensors a result holds inside objects ----------------------------------------
# A result's pytree leaf that is no tensor may hold tensors all the same: a
# transformers DynamicCache (past_key_values) holds each layer's keys and
# values in attributes of objects in a list. A compiled call returns a copy
# of the traced call's object with its own tensors in their places.

_HELD_DEPTH = 6


def held_values(obj):
    """(path, value) of each value obj holds that is no list, tuple, dict or
    plain object, in a fixed order, through those (objects by __dict__) to
    a depth of _HELD_DEPTH, each container once; a path is a tuple of steps
    ("a", attribute) or ("i", index or key). Classes, modules, functions
    and torch modules are not looked into."""
    seen = set()

    def walk(v, path):
        if isinstance(v, torch.Tensor) or v is None or \
                isinstance(v, (str, bytes, int, float, type, torch.SymInt, torch.SymFloat, torch.SymBool)):
            yield path, v
            return
        if len(path) >= _HELD_DEPTH or id(v) in seen:
            return
        seen.add(id(v))
        if isinstance(v, (list, tuple)):
            for k, x in enumerate(v):
                yield from walk(x, path + (("i", k),))
        elif isinstance(v, dict):
            for k, x in v.items():
                yield from walk(x, path + (("i", k),))
        elif not isinstance(v, (types.ModuleType, types.FunctionType, types.MethodType, torch.nn.Module)) \
                and isinstance(getattr(v, "__dict__", None), dict):
            for k, x in vars(v).items():
                yield from walk(x, path + (("a", k),))
        else:
            yield path, v

    return walk(obj, ())


def plain_object(value):
    """Whether value is an object whose state is its __dict__: an instance
    of Python classes only (no C base such as dict, no slots but empty
    ones, as abc.ABC's), and no module, function, class, enum member or
    torch module (a transformers DynamicCache, a settings object)."""
    if not isinstance(getattr(value, "__dict__", None), dict) or \
            isinstance(value, (torch.nn.Module, enum.Enum, types.MethodType, types.FunctionType, type)):
        return False
    return state_in_dict(type(value))


def state_copy(value, swap=None, memo=None, depth=0):
    """value with its lists, tuples, dicts and plain objects (plain_object)
    copied, to a depth of _HELD_DEPTH + 2, and each tensor t put as
    swap.get(id(t), t); what else it holds is shared. An object reached
    twice is copied once (memo: id of the original -> its copy). No code
    of the objects' classes runs (object.__new__ and their dicts)."""
    memo = {} if memo is None else memo
    t = type(value)
    if isinstance(value, torch.Tensor):
        return swap.get(id(value), value) if swap else value
    if depth > _HELD_DEPTH + 2 or not (t in (list, tuple, dict) or plain_object(value)):
        return value
    if id(value) in memo:
        return memo[id(value)]
    if t is dict:
        new = memo[id(value)] = {}
        new.update((k, state_copy(v, swap, memo, depth + 1)) for k, v in value.items())
    elif t is list:
        new = memo[id(value)] = []
        new.extend(state_copy(v, swap, memo, depth + 1) for v in value)
    elif t is tuple:  # no cycle runs through a tuple alone
        new = memo[id(value)] = tuple(state_copy(v, swap, memo, depth + 1) for v in value)
    else:
        new = memo[id(value)] = object.__new__(t)
        vars(new).update((k, state_copy(v, swap, memo, depth + 1)) for k, v in vars(value).items())
    return new


def _at(value, steps):
    """What value holds at steps (held_values' path)."""
    for kind, k in steps:
        value = vars(value)[k] if kind == "a" else value[k]
    return value


def _set_at(value, steps, new):
    """Puts new at steps inside value (its own copy: state_copy)."""
    holder = _at(value, steps[:-1])
    kind, k = steps[-1]
    if kind == "a":
        vars(holder)[k] = new
    else:
        holder[k] = new


def held_tensors(obj):
    """[(path, tensor)] of the tensors obj holds (held_values' paths)."""
    return [(path, v) for path, v in held_values(obj) if isinstance(v, torch.Tensor)]


def result_leaves(result):
    """(leaves, treespec) of a traced call's result, a torch.Size one leaf
    (pytree's own node for it unflattens to a tuple: x.shape returned
    must stay a Size)."""
    return pytree.tree_flatten(result, is_leaf=lambda v: type(v) is torch.Size)


def _result_numbers(result, skip=()):
    """[(pytree leaf index, path, value)] of the numbers (ints, floats and
    their symbolic forms, not bools) that result's leaves hold inside
    objects, where held_tensors looks; leaves whose id is in skip (the
    argument objects returned) left out."""
    out = []
    for k, leaf in enumerate(result_leaves(result)[0]):
        if isinstance(leaf, torch.Tensor) or id(leaf) in skip:
            continue
        out.extend((k, path, v) for path, v in held_values(leaf) if not isinstance(v, (bool, torch.SymBool)) and
                   isinstance(v, (int, float, torch.SymInt, torch.SymFloat)))
    return out


def rebuilt(template, items):
    """A copy of template with the value of each (path, value) of items put
    at its path (held_tensors' paths): what lies on a path is copied
    (copy.copy of objects, new lists, tuples and dicts); of the rest, the
    lists, dicts and sets are copied (_fresh: a dataclass's notes list,
    which the caller may append to, is each call's own, as eager's is), and
    other values are shared with template."""
    if not items:
        return template
    if items[0][0] == ():
        return items[0][1]
    steps = {}
    for path, value in items:
        steps.setdefault(path[0], []).append((path[1:], value))
    if isinstance(template, tuple):
        parts = [_fresh(v) for v in template]
        for (_, k), sub in steps.items():
            parts[k] = rebuilt(template[k], sub)
        return type(template)(*parts) if hasattr(template, "_fields") else type(template)(parts)
    new = copy.copy(template)
    if isinstance(getattr(new, "__dict__", None), dict):
        for k, v in new.__dict__.items():
            if ("a", k) not in steps and type(v) in _CONTAINERS:
                new.__dict__[k] = _fresh(v)
    if type(new) in (list, dict):
        for k in range(len(new)) if type(new) is list else list(new):
            if ("i", k) not in steps and type(new[k]) in _CONTAINERS:
                new[k] = _fresh(new[k])
    for (kind, k), sub in steps.items():
        if kind == "a":
            new.__dict__[k] = rebuilt(template.__dict__[k], sub)
        else:
            new[k] = rebuilt(template[k], sub)
    return new


_CONTAINERS = (list, dict, set, tuple)


def _fresh(v):
    """v with its lists, dicts and sets (and those inside them, through
    tuples) copied; other values shared."""
    t = type(v)
    if t is list:
        return [_fresh(x) for x in v]
    if t is dict:
        return {k: _fresh(x) for k, x in v.items()}
    if t is set:
        return set(v)
    if t is tuple and any(type(x) in _CONTAINERS for x in v):
        return tuple(_fresh(x) for x in v)
    return v


def result_tensors(result, skip=()):
    """The tensors of result in the order of a compiled call's outputs: its
    pytree leaves, each that is no tensor as the tensors it holds; leaves
    whose id is in skip (the argument objects returned) left out."""
    out = []
    for leaf in result_leaves(result)[0]:
        if id(leaf) not in skip:
            out.extend([leaf] if isinstance(leaf, torch.Tensor) else [t for _, t in held_tensors(leaf)])
    return out


def _constant_pad_nd(x, pad, value=0.0):
    """constant_pad_nd of x for a symbolic trace: each padded dimension cut
    (negative pads) and put between two constant blocks (cat). PyTorch's
    own reads the sizes as ints, which makes a symbolic size a constant
    (transformers' Swin pads its windows: each batch size a trace)."""
    padded = False
    for k in range(len(pad) // 2):
        d = x.dim() - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        if lo < 0:
            x = x.narrow(d, -lo, x.shape[d] + lo)
        if hi < 0:
            x = x.narrow(d, 0, x.shape[d] + hi)
        parts = []
        for n in (max(lo, 0), max(hi, 0)):
            shape = list(x.shape)
            shape[d] = n
            parts.append(torch.full(shape, value, dtype=x.dtype, device=x.device) if n else None)
        if parts[0] is not None or parts[1] is not None:
            x, padded = torch.cat([p for p in (parts[0], x, parts[1]) if p is not None], d), True
    return x if padded else x.clone()  # a new tensor, as PyTorch's


def _baddbmm(x, batch1, batch2, *, beta=1, alpha=1):
    """baddbmm for a symbolic trace: beta * x + alpha * bmm(batch1, batch2),
    x broadcast by the addition (PyTorch's meta function expands x with
    concrete sizes only: Bloom's ALiBi scores failed every symbolic trace);
    beta 0 ignores x, as PyTorch's does."""
    out = torch.bmm(batch1, batch2)
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out
    return out + (x if beta == 1 else x * beta)


def writes_statistics(args):
    """Whether native_batch_norm with args (positional, all eight) writes
    its running statistics, which its schema does not say: in training
    mode, with statistics to write."""
    return len(args) == 8 and bool(args[5]) and args[3] is not None and args[4] is not None


def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """native_batch_norm in training mode as the functional op and writes
    of the running statistics (writes_statistics): made functional, they
    are the graph's write-backs (applied after its value checks), not
    writes inside the graph."""
    if not writes_statistics((x, weight, bias, running_mean, running_var, training, momentum, eps)):
        return NotImplemented
    out, mean, rstd, new_mean, new_var = torch.ops.aten._native_batch_norm_legit_functional.default(
        x, weight, bias, running_mean, running_var, training, momentum, eps)
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
    return out, mean, rstd


# -- convolution's backend over symbolic sizes ------------------------------------

_tracing = threading.local()  # .env: the ShapeEnv of this thread's symbolic trace, while it runs
# CPU backends a convolution of unchanged layout may take at another size (ATen's use_mkldnn and use_nnpack
# weigh the batch and the input's numel against thresholds), by the rank of its weight (a 1-d convolution
# runs as a 2-d one)
_CONV_CPU_BACKENDS = {3: ("Mkldnn", "Slow2d", "SlowDilated2d", "NnpackSpatial"),
                      4: ("Mkldnn", "Slow2d", "SlowDilated2d", "NnpackSpatial"),
                      5: ("Mkldnn", "Slow3d", "SlowDilated3d")}


def _select_conv_backend(select):
    """torch._C._select_conv_backend for FakeTensor's convolution: inside a
    symbolic trace of this thread, the backend for the sizes at hand chosen
    without guards where every CPU backend the convolution could take at
    other sizes gives its result the same memory format, which is all the
    fake convolution asks the backend for. The thresholds ATen weighs
    (a numel above 20480, a batch of 16) otherwise became guards:
    wav2vec2's feature encoder made a variant per band of audio lengths.
    Outside one, or where the formats differ, select itself."""
    def chosen(input, weight, *args, **kwargs):
        env = getattr(_tracing, "env", None)
        if env is None or kwargs.get("transposed") or weight.dim() not in _CONV_CPU_BACKENDS or \
                input.device.type != "cpu":
            return select(input, weight, *args, **kwargs)
        formats, names = None, _CONV_CPU_BACKENDS[weight.dim()]
        try:
            with env.suppress_guards():
                backend = select(input, weight, *args, **kwargs)
                if backend.name in names:
                    i4, w4 = input, weight
                    if weight.dim() == 3:  # as the fake convolution asks: a 1-d convolution as a 2-d one
                        i4, w4 = input.contiguous().unsqueeze(2), weight.unsqueeze(2)
                    formats = {torch._C._conv_determine_backend_memory_format(
                        i4, w4, getattr(torch._C._ConvBackend, n)) for n in names}
        except Exception:  # select says why, with its guards
            formats = None
        if formats is not None and len(formats) == 1:
            return backend
        return select(input, weight, *args, **kwargs)
    chosen._tn_unguarded = True
    return chosen


_AS_VALUE = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}  # what pins each (a guard on its value)


def _pinning_repr(write):
    """SymInt's, SymFloat's or SymBool's __repr__ (write) for a symbolic
    trace: a number of this thread's trace written as text (str(n),
    f"{n}", repr(n)) by the user's code gives its value's text, and pins it
    (int(n): a guard on its value, so the size stays static: Pinned).
    Written as is, it was its symbol's name: len(str(n)) of 5000 answered 2
    in the variant that served every n. Library code's writes stay as they
    were (torch's graph printing; transformers' messages: LED's "Input ids
    are automatically padded from {seq_len}" would pin every length)."""
    def text(self):
        env = getattr(_tracing, "env", None)
        if env is None or getattr(self.node, "shape_env", None) is not env or \
                library_code(sys._getframe(1).f_code.co_filename):
            return write(self)
        return repr(_AS_VALUE[type(self)](self))
    text._tn_pinning = True
    return text


@contextlib.contextmanager
def symbolic_scope(env):
    """While it is open, this thread's symbolic trace over env's symbols:
    its convolutions choose their backend without guards on thresholds
    (_select_conv_backend), and code that writes one of its numbers as
    text pins it (_pinning_repr). The wrappers go into torch once and pass
    every other thread's and every other trace's calls through."""
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is not None and not getattr(select, "_tn_unguarded", False) and \
            hasattr(torch._C, "_conv_determine_backend_memory_format") and hasattr(torch._C, "_ConvBackend"):
        torch._C._select_conv_backend = _select_conv_backend(select)
    for cls in (torch.SymInt, torch.SymFloat, torch.SymBool):
        if not getattr(cls.__repr__, "_tn_pinning", False):
            cls.__repr__ = _pinning_repr(cls.__repr__)
    outer, _tracing.env = getattr(_tracing, "env", None), env
    try:
        yield
    finally:
        _tracing.env = outer


def _attribute_dicts(trace):
    """[(dict, a copy of it)] of the attribute dicts of the modules the
    call's arguments hold and of every dict its guards snapshot (modules,
    classes, globals): what the symbolic run may set and _restore puts
    back. The real call may set an attribute to the value it had (Swin's
    self.window_size = min(input_resolution)): its symbolic run sets a
    SymInt there, which stayed in the model and broke every later call."""
    out, seen = [], set()

    def keep(d):
        if type(d) is dict and id(d) not in seen:
            seen.add(id(d))
            out.append((d, dict(d)))

    for leaf in pytree.tree_leaves(list(trace.call_args)):
        if isinstance(leaf, torch.nn.Module):
            for m in leaf.modules():
                keep(vars(m))
    for inst in trace.spec:
        if inst[0] == "dict":
            try:
                keep(load(trace.spec, trace.call_args, inst[1]))
            except Exception:  # ours: a dict the arguments as copied no longer reach
                continue
    return out


def _restore(attributes):
    """Puts back each entry of the dicts of attributes (_attribute_dicts)
    that the symbolic run left holding one of its own values (a SymInt, a
    fake tensor): other threads write globals and attributes meanwhile
    (Dynamo its __compiled_fn_ globals), which stay; what the run wrote
    that is no symbolic value the real call wrote too (writes that change
    state make a variant run eagerly)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def symbolic(v):
        leaves = pytree.tree_leaves(v) if type(v) in (list, tuple, dict) else (v,)
        return any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool, FakeTensor)) for x in leaves)

    for d, before in attributes:
        for k in [k for k, v in list(d.items()) if k not in before and symbolic(v)]:
            del d[k]
        for k, v in before.items():
            now = d.get(k, _ABSENT)
            if now is not v and symbolic(now):
                d[k] = v


# Decompositions a symbolic trace adds to the back end's: ops whose own
# implementation makes a symbolic size a constant, and batch norm's writes.
_SYMBOLIC = {torch.ops.aten.constant_pad_nd.default: _constant_pad_nd, torch.ops.aten.baddbmm.default: _baddbmm,
             torch.ops.aten.native_batch_norm.default: native_batch_norm}


def retrace(trace, dims, scalars, outputs, sets, functional, run_untraced, decompositions=None):
    """The trace of trace.fn on its arguments again with the dimensions dims
    ({slot: dimensions}) symbolic. scalars are the values the real trace
    read out of tensors, in order; outputs the tensors the real trace's
    result holds (result_tensors) and sets on argument objects; sets, what
    it set on those (_jit._Sets: the symbolic run sets them on copies of
    the objects as they were); decompositions is the back end's table,
    applied while tracing; functional(gm, inputs) makes the graph functional
    (_jit._functional), inside the fake mode, where the graph writes an
    operand; run_untraced(f, *args) runs f with jitted functions as plain
    Python. Raises Static with the reason when the trace cannot be made so."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from torch._dispatch.python import enable_python_dispatcher
    from torch._dynamo.source import ConstantSource

    from .backend import composites_whole, vf_whole

    env = ShapeEnv(duck_shape=False)  # equal sizes are not assumed equal: the code's own needs are guarded
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    # FakeTensor's dispatch cache pays off for ops seen again with the same symbols; in one symbolic trace most
    # are seen once, and making each entry (it builds the output a second time to check it) was a third of the
    # trace: TransformerEncoder's 1205 -> 780 ms, HF BERT's 1186 -> 905 ms for the build with it off
    mode.cache_enabled = False
    paths, treespec = pytree.tree_flatten_with_path(list(trace.call_args))
    leaves = [leaf for _, leaf in paths]
    # tensors whose strides keep changing (observe): the variant takes them copied dense
    dense = {slot for slot, want in dims.items() if STRIDES_PLACE in want}
    if dense:
        # code that reads strides (x.stride(0), x.is_contiguous()) would read the dense copy's: the strides stay
        # as they are, a guard's, in the variant of each (the other dimensions may still be symbolic)
        reads = sorted({name for code, _ in trace.codes if not versioned_code(code.co_filename)
                        for name in code.co_names if name in _STRIDE_READS})
        if reads:
            slot = min(dense)
            raise Pinned(f"{trace.spec.names[slot]}'s strides change, and the code reads strides "
                         f"({', '.join(reads)}), which a dense copy would answer otherwise", slot, STRIDES_PLACE)
    dims = {slot: [d for d in want if d != STRIDES_PLACE] for slot, want in dims.items()}
    # int and float arguments made symbolic: leaf position -> [(steps inside it (an object's), slot)]
    numbers = {}
    for slot, want in dims.items():
        if None in want:
            where = _argument_path(trace.spec, slot)
            k = next((k for k, (p, _) in enumerate(paths) if where is not None and p == where[0]), None)
            value = _at(leaves[k], where[1]) if k is not None else None
            if type(value) not in (int, float):
                raise Static(f"{trace.spec.names[slot]} is not an int or a float among the arguments")
            numbers.setdefault(k, []).append((where[1], slot))
    positions, fakes, slots, examples, sources, floats = [], [], [], [], {}, set()
    kept = {}  # slot -> strides of a tensor that is not row-major, kept at every size (None: any, copied)
    dense_at = []  # (number among the graph's inputs, dense_order) of the tensors copied dense
    orders = {}  # slot -> the order (outermost first) of those, which their guards check
    held_at = {}  # id of a tensor an argument's object holds -> its number among the graph's inputs
    inner_at = []  # (leaf position, steps, number among the graph's inputs) of the numbers objects hold
    for k, leaf in enumerate(leaves):
        for steps, slot in numbers.get(k, ()):
            value, source = _at(leaf, steps), ConstantSource(f"number{slot}")
            if type(value) is float:  # no guard program reads a float: a guard on it keeps it static
                sym = env.create_unspecified_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC)
                floats.add(sym)
                fake = env.create_symfloatnode(sym, hint=value, source=source)
            else:
                sym = env.create_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC, positive=None)
                if not isinstance(sym, sympy.Symbol):
                    raise Static(f"{trace.spec.names[slot]} did not become a symbol")
                fake = env.create_symintnode(sym, hint=value)
            sources[sym] = (slot, None)
            if steps:  # a cache layer's length: set in each run's copy of its object
                inner_at.append((k, steps, len(fakes)))
            positions.append(None if steps else k)
            fakes.append(fake)
            slots.append(slot)
            examples.append(value)
        if k in numbers and not plain_object(leaf):
            continue
        held = [t for _, t in held_tensors(leaf)] if plain_object(leaf) else [leaf]
        for t in held:
            if not isinstance(t, torch.Tensor) or id(t) in held_at:
                continue
            slot = trace.tensor_slot.get(id(t))
            if slot is None:
                raise Static("an argument tensor has no guard")
            want = dims.get(slot, ())
            context = StatelessSymbolicContext(
                dynamic_sizes=[DimDynamic.DYNAMIC if d in want else DimDynamic.STATIC for d in range(t.dim())])
            row_major = dense_strides(tuple(t.shape))
            original = t
            if slot in dense:
                # any strides, copied dense in this call's order of them before the graph runs (_jit._Runner)
                order = dense_order(t)
                if order is not None and any(n > 1 and st == 0 for n, st in zip(t.shape, t.stride())):
                    raise Static(f"{trace.spec.names[slot]}, whose strides change, is expanded and not row-major "
                                 "in order")
                stand_in = mode.from_tensor(torch.empty(t.shape, dtype=t.dtype, device="meta"),
                                            symbolic_context=context)
                with mode:
                    fake = torch.empty_permuted(stand_in.shape, order or tuple(range(t.dim())), dtype=t.dtype,
                                                device=t.device)
                kept[slot] = (None,) * t.dim()
                orders[slot] = order or tuple(range(t.dim()))
                dense_at.append((len(fakes), order))
                t = densified(t, order)
            elif not same_strides(tuple(t.shape), t.stride(), row_major):
                # a slice of a buffer (observe: its strides have stayed), an expanded tensor: its strides at
                # every size, as the guard checks them (PyTorch's own fake would make each a symbol no guard
                # program reads); its sizes' symbols from a row-major stand-in
                stand_in = mode.from_tensor(torch.empty(t.shape, dtype=t.dtype, device="meta"),
                                            symbolic_context=context)
                with mode:
                    fake = torch.empty_strided(stand_in.shape, t.stride(), dtype=t.dtype, device=t.device)
                kept[slot] = tuple(t.stride())
            else:
                # row-major but for a stride of a size-1 dimension (x[:, :L].contiguous() of a batch of one): as
                # the guard checks it, and the fake's strides follow its symbolic sizes
                like = t if tuple(t.stride()) == row_major else t.as_strided(t.shape, row_major, t.storage_offset())
                fake = mode.from_tensor(like, symbolic_context=context)
            for d in want:
                expr = fake.shape[d].node.expr
                if not isinstance(expr, sympy.Symbol):
                    raise Static(f"dimension {d} of an argument did not become a symbol")
                sources[expr] = (slot, d)
            if original is leaf:
                positions.append(k)
            else:  # inside an argument's object: the copy each run makes holds the graph's input there
                held_at[id(original)] = len(fakes)
                positions.append(None)
            fakes.append(fake)
            slots.append(slot)
            examples.append(t)
    if not sources and not dense_at:
        raise Static("no dimension became a symbol")
    # the argument objects the runner takes (the copies call_args holds), in its order
    set_objects = [trace.arg_copies[id(obj)] for _, obj, _, _ in sets.objects]

    def run(*tensors):
        values = list(leaves)
        for k, t in zip(positions, tensors):
            if k is not None:
                values[k] = t
        # argument objects as they were, each run its own copies (the code sets their attributes)
        swap, copies = {held: tensors[i] for held, i in held_at.items()}, {}
        for k, leaf in enumerate(leaves):
            if plain_object(leaf):
                values[k] = state_copy(leaf, swap, copies)
        for k, steps, i in inner_at:
            _set_at(values[k], steps, tensors[i])
        objects = [copies[id(obj)] for obj in set_objects]
        reads = _Scalars(scalars, trace.recorder.read_sites, trace.fn.__code__)
        with shadows, reads:
            result = frame_call(trace.fn, pytree.tree_unflatten(values, treespec))
        run_sites[:] = reads.sites
        # the result's tensors, then what the code set on argument objects, then the tensors values were read
        # from: as the real trace's graph returns them (its output plan is all "out", objects of them and the
        # argument objects themselves, its value checks index the rest)
        # argument objects and arguments returned as they are: the runner's, no output of the graph
        returned = {id(o) for o in objects} | {id(t) for t in tensors}
        fake_numbers = {id(t) for t in tensors if isinstance(t, (torch.SymInt, torch.SymFloat))}
        copied = {id(tensors[j]) for j, _ in dense_at}
        if copied and any(id(t) in copied for t in result_tensors(result, returned - copied)):
            raise Static("it returns an argument whose strides change, which its variant would take copied")
        leaves_out = result_tensors(result, returned)
        set_numbers = []
        for i, (k, attr, p) in enumerate(sets.sets):
            if p[0] == "setitems":  # the items the real call set, with values of the same kinds
                d = vars(objects[k]).get(attr)
                for key, e in p[1]:
                    v = d.get(key, _ABSENT) if type(d) is dict else _ABSENT
                    if e[0] == "out" and isinstance(v, torch.Tensor):
                        leaves_out.append(v)
                    elif e[0] != "const" or isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)) \
                            or not same_value(v, e[1]):
                        raise Static(f"the symbolic trace set {attr}[{key!r}] of an argument object otherwise")
                continue
            if p[0] == "append":  # the objects the real call appended: the same classes and attributes
                lst = vars(objects[k]).get(attr)
                new = lst[len(lst) - len(p[1]):] if type(lst) is list and len(lst) >= len(p[1]) else []
                if len(new) != len(p[1]) or any(type(o) is not cls or list(vars(o)) != [a for a, _ in attrs]
                                                 for o, (cls, attrs) in zip(new, p[1])):
                    raise Static(f"the symbolic trace appended other objects to {attr} of an argument object")
                for j, (o, (_, attrs)) in enumerate(zip(new, p[1])):
                    for n, (a, e) in enumerate(attrs):
                        v = vars(o)[a]
                        if e[0] == "out" and isinstance(v, torch.Tensor):
                            leaves_out.append(v)
                        elif e[0] == "const" and isinstance(v, torch.SymInt):  # a size: a graph output
                            set_numbers.append(((i, j, n), v))
                        elif e[0] != "const" or isinstance(v, (torch.Tensor, torch.SymFloat, torch.SymBool)) or \
                                not same_value(v, e[1]):
                            raise Static(f"the symbolic trace set {a} of an object it appended to another value")
                continue
            v = vars(objects[k]).get(attr, _ABSENT)
            if p[0] == "out" and isinstance(v, torch.Tensor):
                leaves_out.append(v)
            elif p[0] == "const" and isinstance(v, torch.SymInt):
                set_numbers.append((i, v))
            elif p[0] != "const" or isinstance(v, (torch.Tensor, torch.SymFloat, torch.SymBool)) or \
                    not same_value(v, p[1]):
                raise Static(f"the symbolic trace set {attr} of an argument object to another kind of value")
        if len(leaves_out) != outputs:
            raise Static(f"the symbolic trace's result holds {len(leaves_out)} tensors, the real one's {outputs}")
        read_from = reads.sources  # the tensors whose values the variant checks
        checks.extend((len(leaves_out) + k, v) for k, v in enumerate(reads.checked()))
        # sizes an object of the result holds (a sliding-window cache's length) and the code set on an argument
        # object: outputs after the value reads
        sizes = []
        # an int argument returned as it is: a graph output too (the real trace's plan holds its value then)
        for leaf, path, v in _result_numbers(result, {i for i in returned if i not in fake_numbers}):
            if isinstance(v, (torch.SymFloat, torch.SymBool)):
                raise Static(f"its result holds a {type(v).__name__} of the symbolic sizes, which no graph returns")
            if isinstance(v, torch.SymInt):
                numbers.append((leaf, path, len(leaves_out) + len(read_from) + len(sizes)))
                sizes.append(v)
        for where, v in set_numbers:
            out = ("out", len(leaves_out) + len(read_from) + len(sizes))
            if isinstance(where, tuple):  # (set, appended object, attribute)
                i, j, n = where
                k, attr, (_, appended) = new_sets[i]
                appended = [(cls, list(attrs)) for cls, attrs in appended]
                appended[j][1][n] = (appended[j][1][n][0], out)
                new_sets[i] = (k, attr, ("append", appended))
            else:
                k, attr, _ = new_sets[where]
                new_sets[where] = (k, attr, out)
            sizes.append(v)
        return tuple(leaves_out) + tuple(read_from) + tuple(sizes)

    checks = []  # (graph output, the value read there): none when the code read none of fake tensors
    run_sites = []  # the op sites of the symbolic run (_same_path, checked once the sizes Python pinned are)
    shadows = _Shadows()
    numbers = []  # (result leaf, path, graph output) of the sizes its objects hold
    new_sets = list(sets.sets)  # with the sizes the code set on argument objects as graph outputs

    attributes = _attribute_dicts(trace)
    try:
        # the Python dispatcher, as make_fx's own symbolic tracing enables it: composite ops' Python kernels take
        # SymInts where their C++ ones want ints (F.interpolate to a size of the input's: every size traced)
        with mode, symbolic_scope(env), enable_python_dispatcher(), composites_whole, vf_whole:
            gm = run_untraced(make_fx(run, decomposition_table={**(decompositions or {}), **_SYMBOLIC}), *fakes)
    except Static:
        raise
    except Exception as exc:
        raise Static(f"the symbolic trace failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") \
            from None
    finally:
        _restore(attributes)
    # tensors of the real trace that the code reached (parameters, buffers, globals): inputs
    inputs = list(fakes)
    graph = gm.graph
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    placeholder_of = {}
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        t = getattr(gm, node.target)
        if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor):
            raise Static(f"the symbolic graph holds a {type(t).__name__} constant")
        t = shadows.real_of.get(id(t), t)  # the copy a write went to: the tensor itself
        if id(t) in placeholder_of:  # one input per tensor: its reads see its writes
            node.replace_all_uses_with(placeholder_of[id(t)])
            graph.erase_node(node)
            continue
        # a tensor of the real trace (a parameter, a global), or one the traced code made
        # (torch.tensor(...)): an input either way, loaded by the guards, as the static graph's are
        with graph.inserting_after(last):
            last = graph.placeholder(f"ext{len(inputs)}")
        with mode:
            last.meta["val"] = mode.from_tensor(t, static_shapes=True)
        node.replace_all_uses_with(last)
        graph.erase_node(node)
        placeholder_of[id(t)] = last
        inputs.append(last.meta["val"])
        slots.append(trace.tensor_slot.get(id(t), t))  # a tensor: the caller gives it a slot
        examples.append(t)
    gm.recompile()
    try:
        if _mutates(gm):
            with mode:
                fgm, writebacks = functional(gm, inputs)
        else:  # decomposed already, and nothing to make functional: the second make_fx is saved
            fgm, writebacks = gm, []
            gm.graph.eliminate_dead_code()
            gm.recompile()
    except Exception as exc:
        raise Static(f"making the symbolic graph functional failed ({type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:200]})") from None
    if any(i in dict(dense_at) for i, _ in writebacks):
        raise Static("it writes an argument whose strides change, which its variant would take copied")
    names = {sym: trace.spec.names[slot] if d is None else f"{trace.spec.names[slot]}.size({d})"
             for sym, (slot, d) in sources.items()}
    for sym, (slot, d) in sources.items():
        fixed = env.replacements.get(sym)
        # Python took its value (range(n), an index: a guard Eq(n, 5)). Branches whose bounds meet at this
        # call's value (a sliding window's cache of exactly w - 1 tokens: n >= 5 and n < 6) fix it too, but for
        # this region alone: the variant serves it, guarded by them, and the next value is dynamic again
        if fixed is not None and not fixed.free_symbols and \
                any(isinstance(g.expr, sympy.Eq) and sym in g.expr.args and not g.expr.free_symbols - {sym}
                    for g in env.guards):
            words = (f"{names[sym]} is used where Python needs its value (a range(), an index, a branch on it, "
                     "its text), which makes every value a variant of its own")
            raise Static(words) if d is None else Pinned(words, slot, d)
    for g in env.guards:
        if g.expr.free_symbols & floats:
            words = g.expr.xreplace({sym: sympy.Symbol(names[sym]) for sym in g.expr.free_symbols & set(names)})
            raise Static(f"the code needs {words} of the float {names[next(iter(g.expr.free_symbols & floats))]}, "
                         "which no guard program checks (a guard program is integer arithmetic)")
    _same_path(trace, run_sites)
    guards = size_guards(env, sources, names)
    return Symbolic(fgm, slots, examples, checks, writebacks, guards,
                    {slot: sorted(ds, key=lambda d: -1 if d is None else d) for slot, ds in dims.items()}, numbers,
                    new_sets, kept, dense_at, orders)


# -- guards on sizes ---------------------------------------------------------------

def size_guards(env, sources, names):
    """The ShapeEnv's guards and each symbol's range as [(program, words)]:
    csrc/guards "sizes" programs over the dimensions sources names
    ({symbol: (slot, dimension)}). Raises Static for what a program cannot
    express (a symbol of no argument, a fraction, a float)."""
    out, seen = [], set()

    def add(expr):
        expr = sympy.simplify(expr) if not isinstance(expr, (sympy.Rel, sympy.logic.boolalg.Boolean)) else expr
        if expr is sympy.true or expr in seen:
            return
        if expr is sympy.false:
            raise Static("a guard on sizes is false")
        seen.add(expr)
        prog = []
        _emit(expr, sources, prog)
        words = str(expr.xreplace({s: sympy.Symbol(n) for s, n in names.items()}))
        out.append((tuple(prog), words))

    from torch.utils._sympy.numbers import int_oo

    for sym, (_, d) in sources.items():
        r = env.var_to_range.get(sym)
        if r is not None and r.lower not in (-int_oo, -sympy.oo):
            add(sympy.Ge(sym, int(r.lower)))
        elif d is not None:  # a size: 0 and 1 stay specialised
            add(sympy.Ge(sym, 2))
        if r is not None and r.upper not in (int_oo, sympy.oo):
            add(sympy.Le(sym, int(r.upper)))
    for g in env.guards:
        expr = g.expr
        if expr.free_symbols - set(sources):
            raise Static(f"a guard on sizes names a size of no argument ({expr})")
        add(expr)
    return out


def _emit(e, sources, prog):
    from torch.utils._sympy import functions as F

    def binary(op, args):
        _emit(args[0], sources, prog)
        for a in args[1:]:
            _emit(a, sources, prog)
            prog.append(op)

    if isinstance(e, sympy.Symbol):
        if e not in sources:
            raise Static(f"a guard on sizes names {e}, a size of no argument")
        slot, d = sources[e]
        prog.extend((INT, slot) if d is None else (DIM, slot, d))
    elif e is sympy.true or e is sympy.false:
        prog.extend((CONST, int(e is sympy.true)))
    elif isinstance(e, sympy.Integer):
        prog.extend((CONST, int(e)))
    elif isinstance(e, sympy.Add):
        binary(ADD, e.args)
    elif isinstance(e, sympy.Mul):
        if any(isinstance(a, sympy.Rational) and not isinstance(a, sympy.Integer) for a in e.args):
            raise Static(f"a guard on sizes has a fraction ({e})")
        binary(MUL, e.args)
    elif isinstance(e, (sympy.Pow, F.PowByNatural)) and isinstance(e.args[1], sympy.Integer) and 0 < e.args[1] <= 8:
        binary(MUL, [e.args[0]] * int(e.args[1])) if e.args[1] > 1 else _emit(e.args[0], sources, prog)
    elif isinstance(e, F.TruncToInt) and _scaled(e.args[0]) is not None:
        factor, size = _scaled(e.args[0])  # int(size * 0.5): F.interpolate's output size at a scale factor
        _emit(size, sources, prog)
        prog.extend((TRUNCMUL, struct.unpack("<q", struct.pack("<d", factor))[0]))
    elif isinstance(e, F.FloorDiv):
        binary(FLOORDIV, e.args)
    elif isinstance(e, (F.Mod, F.PythonMod, sympy.Mod)):
        binary(MOD, e.args)
    elif isinstance(e, F.CleanDiv):
        binary(FLOORDIV, e.args)
    elif isinstance(e, (F.Max, sympy.Max)):
        binary(MAX, e.args)
    elif isinstance(e, (F.Min, sympy.Min)):
        binary(MIN, e.args)
    elif isinstance(e, sympy.Eq):
        binary(EQ, e.args)
    elif isinstance(e, sympy.Ne):
        binary(NE, e.args)
    elif isinstance(e, sympy.StrictLessThan):
        binary(LT, e.args)
    elif isinstance(e, sympy.LessThan):
        binary(LE, e.args)
    elif isinstance(e, sympy.StrictGreaterThan):
        binary(LT, e.args[::-1])
    elif isinstance(e, sympy.GreaterThan):
        binary(LE, e.args[::-1])
    elif isinstance(e, sympy.And):
        binary(AND, e.args)
    elif isinstance(e, sympy.Or):
        binary(OR, e.args)
    elif isinstance(e, sympy.Not):
        _emit(e.args[0], sources, prog)
        prog.append(NOT)
    else:
        raise Static(f"a guard on sizes that jit cannot check ({type(e).__name__}: {e})")


def _scaled(e):
    """(c, n) where e is float(n) * c, a float constant c times an integer
    expression n made a float; else None."""
    from torch.utils._sympy import functions as F
    if isinstance(e, sympy.Mul) and len(e.args) == 2:
        c, n = e.args if isinstance(e.args[0], sympy.Float) else e.args[::-1]
        if isinstance(c, sympy.Float) and isinstance(n, F.ToFloat):
            return float(c), n.args[0]
    return None


def spec_of(trace, sym):
    """trace's guard spec with the symbolic dimensions' size checks relaxed
    (their tensors checked as row-major of any size there, or with the
    strides a slice keeps) and the guards on sizes appended: a new Spec."""
    spec = type(trace.spec)()
    spec.paths = dict(trace.spec.paths)
    for i, (inst, name) in enumerate(zip(trace.spec, trace.spec.names)):
        if inst[0] == "eq" and sym.dims.get(inst[1]) == [None]:  # an int or float argument: any, relations below
            inst = ("type", inst[1], type(inst[2]))
        elif inst[0] == "tensor" and inst[1] in sym.dims:
            dims = sym.dims[inst[1]]
            sizes = tuple(None if d in dims else n for d, n in enumerate(inst[3]))
            inst = ("tensor", inst[1], inst[2], sizes, sym.strides.get(inst[1]), inst[5])
        spec.add(inst, name)
    for slot, order in sym.orders.items():  # copied dense: in the order eager's results follow
        spec.add(("order", slot, order), trace.spec.names[slot])
    for prog, words in sym.guards:
        spec.add(("sizes", prog), words)
    return spec
