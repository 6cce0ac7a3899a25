"""Trace records: jit's traced variants in the persistent cache.

A traced entry holds live objects: the module dicts its guards snapshot,
the parameters it takes as inputs, the globals dicts it reads. A record
describes the same entry without identities, so that a fresh process can
rebuild it without tracing:

- guards by path: every object the guard program holds is named by how to
  reach it (a submodule of an argument, a module's globals, a closure
  cell, a class's dict), and every value it compares by identity is
  described (primitives by value, containers item by item, tensors by
  metadata, modules by class and path, classes and functions by qualified
  name, Python functions with the hash of their code, other objects by
  their attributes; what a class's dict holds besides, descriptors, by
  type); anything else makes the variant unportable;
- the code the trace ran, by qualified name and hash (the hash covers the
  code nested in it); an installed distribution's by its version; torch's,
  ours and the standard library's not at all: their versions are in the
  key;
- the functional ATen graph the back end compiles, with each node's
  tensor metadata, and what the runner does around it (value checks,
  write-backs, how the result is rebuilt).

The record's key hashes everything a lookup can compute before tracing:
the versions and options the artifacts depend on, the function's code,
and the argument guards (types, tensor metadata, primitive values, the
argument modules' structure). One key holds the variants traced for it
(globals and values read out of tensors tell them apart), newest first.
A lookup rebuilds the guard program from live objects, checks it on the
call's arguments, checks the code hashes, and compiles the graph, which
finds its lowered artifact in the cache: no trace, no lowering.
"""
import contextlib
import contextvars
import enum
import functools
import importlib.metadata
import json
import math
import operator
import os
import sys
import types
import weakref

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _LazyGraphModule

from . import _C, cache
from .graph import fake_tensor
from ._spec import NO_FIELD, NUMPY_SCALARS, Spec, entry_name, explain, func_field, namedtuple_value, same_value
from ._spec import shadowed, state_in_dict

FORMAT = 15  # 2: the contents of containers and objects that globals and closures hold are guarded;
#            3: keys leave out tensor sizes (a key holds every size's variants), dynamic variants;
#            4: keys leave out the values of int and float arguments (a dynamic variant serves every value);
#            5: torch.tensor(...) is copied on every call, one tensor passed twice is guarded ("same"): a record
#               of 4 returned a shared literal, or took two arguments for one;
#            6: the builtins the code reads are guarded absent from its module's globals (["absent"]);
#            7: argument objects guarded by their attributes ("attrs"), and what the call sets on them ("sets")
#            8: the objects a call sets attributes on are guarded distinct from the others ("distinct"): a
#               record of 7 read one object passed twice as two;
#            9: a runner copies inputs whose strides change dense ("dense", a stride None in a tensor guard), and
#               puts torch's RNG back when its graph draws ("random") and its call raises;
#           10: objects whose state is not all in __dict__ (a dict subclass, slots, a C type) are not described
#               by their attributes; functools.partial by its function and arguments, a property or static or
#               class method by the functions it wraps: a record of 9 took any partial, or property, for another
#           11: a result's object that holds tensors (a DynamicCache) is described by its class and attributes
#               (encode_template)
#           12: a tensor two globals, or a global and a module, hold is guarded to be one ("same"): a record of 11
#               traced where B = W read W for B where they were two
#           13: the functions and classes user code names in a library's module are guarded (F.gelu replaced),
#               and the globals code reaches by a name its arguments, globals or closure variables hold
#               (globals()[NAME]): a record of 12 answered with the traced ones
#           14: guards on sizes scale a size by a float (TRUNCMUL: F.interpolate at a scale factor), and graphs
#               hold torchneuron::rnn / lstm / stft: a process of 13 could not rebuild them
#           15: a tensor argument without Python attributes is guarded to have none ("bare"): a record of 14
#               answered a call whose tensor the caller had set x.scale on as if it had none
_MAX_CONST_NUMEL = 4096  # captured tensors up to this size are stored by value
_CPU = torch.device("cpu")
_MAX_OBJECT_DEPTH = 4  # other objects are described by their attributes, this deep
_MAX_NESTING = 32  # containers in containers, this deep
_MAX_DESCRIBED = 20000  # values a record describes at most (a vocabulary in a guarded object is too many)


def default_device():
    """The device factory functions make tensors on (torch.set_default_device,
    with torch.device("meta"): a function mode), read only while a torch
    function mode is on: torch.get_default_device takes 4 us, the check 40 ns."""
    return torch.get_default_device() if torch._C._is_torch_function_mode_enabled() else _CPU


def python_modes():
    """The classes of the TorchFunctionModes and TorchDispatchModes on
    (FlopCounterMode, a user's own, FakeTensorMode), by name, outermost
    first, in one string (a record's state is JSON); "" for none. A
    compiled call runs no mode's code, so a call under one runs eagerly
    (_Trace). Not torch.device's DeviceContext (torch.set_default_device
    keeps one on: default device reads it), nor ours (a trace's recorder)."""
    if not torch._C._is_torch_function_mode_enabled() and not torch._C._len_torch_dispatch_stack():
        return ""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    modes = [m for m in _get_current_function_mode_stack() if not isinstance(m, DeviceContext)]
    modes += _get_current_dispatch_mode_stack()
    return ", ".join(f"{type(m).__module__}.{type(m).__qualname__}" for m in modes
                     if not type(m).__module__.startswith(__package__ + "."))


def forward_ad_level():
    """The innermost forward-mode AD level (-1: none): a dual tensor's tangent is no graph's."""
    return torch.autograd.forward_ad._current_level


# The process state traced ops depend on besides their arguments (the
# recorder sees autocast's casts and the default dtype's results as ops
# and constants): guarded on every call, part of every record key.
STATE = {
    "grad mode": torch.is_grad_enabled,
    "forward AD level": forward_ad_level,
    "Python modes": python_modes,
    "default dtype": torch.get_default_dtype,
    "default device": default_device,
    "CPU autocast": functools.partial(torch.is_autocast_enabled, "cpu"),
    "CPU autocast dtype": functools.partial(torch.get_autocast_dtype, "cpu"),
}


# torch's process state that traced code may read through torch's functions (torch.get_num_threads()): a
# compiled call would answer the traced value, so each one the trace called is guarded, by the call's words
READ_STATE = {f"torch.{read.__name__}()": read for read in (
    torch.get_num_threads, torch.get_num_interop_threads, torch.are_deterministic_algorithms_enabled,
    torch.is_deterministic_algorithms_warn_only_enabled, torch.is_anomaly_enabled, torch.is_anomaly_check_nan_enabled,
    torch.get_float32_matmul_precision, torch.initial_seed, torch.is_inference_mode_enabled)}
# switches torch's own Python code reads: nn.MultiheadAttention's and nn.TransformerEncoder's fast path (it zeroes
# padded positions where the layers' ops would not), and torch.backends.mkldnn.enabled (its property calls the getter)
READ_STATE["torch.backends.mha.get_fastpath_enabled()"] = torch.backends.mha.get_fastpath_enabled
READ_STATE["torch.backends.mkldnn.enabled"] = torch._C._get_mkldnn_enabled


def print_options():
    """torch.set_printoptions's settings, in words: what str(tensor) depends on besides the tensor."""
    return " ".join(f"{k}={v!r}" for k, v in sorted(vars(torch._tensor_str.PRINT_OPTS).items()))


READ_STATE["torch print options"] = print_options  # guarded where the trace made a tensor's string


def state_reader(name):
    """The function that reads the state STATE or READ_STATE names name (KeyError for another name)."""
    return STATE[name] if name in STATE else READ_STATE[name]


def read_state():
    """The STATE a trace beginning now depends on, by name: all of it, but
    the autocast dtype only under autocast (a guard fewer on every call)."""
    state = {name: read() for name, read in STATE.items()}
    if not state["CPU autocast"]:
        del state["CPU autocast dtype"]
    return state


class Unportable(Exception):
    """The variant holds something a record cannot describe."""


# -- code, by name and hash ----------------------------------------------------------

_STDLIB = os.path.dirname(os.__file__)
# code whose version the key carries instead of its hash
_VERSIONED = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep)
_code_hashes = weakref.WeakKeyDictionary()


def versioned_code(filename):
    """Code of torch, of this package or of the standard library."""
    return filename.startswith(_VERSIONED) or stdlib_file(filename)


def stdlib_file(filename):
    """Whether filename is the standard library's (frozen modules too)."""
    return filename.startswith("<frozen") or (filename.startswith(_STDLIB + os.sep) and not _installed_file(filename))


def _installed_file(filename):
    return os.sep + "site-packages" + os.sep in filename or os.sep + "dist-packages" + os.sep in filename


def library_code(filename):
    """Whether code of this file belongs to a library rather than to the
    user: torch, this package, the standard library, an installed
    distribution. jit does not guard the globals library code reads, nor
    snapshot library classes (tools patch nn.Module for a while), but for
    the primitives among distribution_code's globals and class attributes;
    records identify library code by version, not by hash. Memoized: a
    trace asks for each frame its profile hook sees (HF BERT's: 3,000)."""
    known = _library_files.get(filename)
    if known is None:
        known = _library_files[filename] = versioned_code(filename) or _installed_file(filename)
    return known


_library_files = {}  # file name -> library_code's answer


def distribution_code(filename):
    """Whether code of this file is an installed distribution's other than
    torch's: a team's own package installed with pip as much as
    transformers (library_code, but not versioned with torch)."""
    return _installed_file(filename) and not versioned_code(filename)


def code_hash(code):
    """A hash of what code does, stable across processes: its bytecode,
    names, flags and constants, nested code included; not its file name or
    line numbers."""
    h = _code_hashes.get(code)
    if h is None:
        out = []
        _code_bytes(code, out)
        h = _C.content_key(b"\0".join(out)).hex()
        _code_hashes[code] = h
    return h


def function_hash(fn):
    """code_hash of fn's code, and of what shapes its behaviour outside the
    code: its defaults (a helper's default changed in the source leaves its
    code as it was) and the contents of its closure cells."""
    h = code_hash(fn.__code__)
    extra = []
    if fn.__defaults__:
        extra.append(["defaults", [_shallow(v) for v in fn.__defaults__]])
    if fn.__kwdefaults__:
        extra.append(["kwdefaults", [[k, _shallow(v)] for k, v in sorted(fn.__kwdefaults__.items())]])
    if fn.__closure__:
        extra.append(["cells", [_shallow(_cell_contents(c)) for c in fn.__closure__]])
    return _C.content_key((h + json.dumps(extra)).encode()).hex() if extra else h


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # empty
        return None


def _shallow(v):
    """v described for function_hash: by value where it has one, a function
    by its code's hash (not following its cells: they may hold it), other
    objects by type."""
    if isinstance(v, types.FunctionType):
        return ["code", code_hash(v.__code__)]
    return _Describer({}).value(v, lenient=True)


def _code_bytes(code, out):
    out.append(repr((code.co_qualname, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                     code.co_flags, code.co_names, code.co_varnames, code.co_freevars,
                     code.co_cellvars)).encode())
    out.append(code.co_code)
    out.append(code.co_exceptiontable)
    for c in code.co_consts:
        _const_bytes(c, out)


def _const_bytes(c, out):
    if isinstance(c, types.CodeType):
        out.append(b"code")
        _code_bytes(c, out)
    elif isinstance(c, tuple):
        out.append(b"tuple %d" % len(c))
        for x in c:
            _const_bytes(x, out)
    elif isinstance(c, frozenset):  # its order follows string hashes, which differ per process
        out.append(b"frozenset " + repr(sorted(repr(x) for x in c)).encode())
    else:
        out.append(f"{type(c).__name__} {c!r}".encode())


def _contains(outer, code):
    if outer is code:
        return True
    return any(isinstance(c, types.CodeType) and _contains(c, code) for c in outer.co_consts)


# While a guard program is described or rebuilt (_memo), the objects its
# paths name are looked up once each: a model's program names each of its
# modules and their classes once per parameter.
_names = contextvars.ContextVar("torchneuron_jit_record_names", default=None)


@contextlib.contextmanager
def _memo():
    token = _names.set({})
    try:
        yield
    finally:
        _names.reset(token)


def _lookup(modname, qualname, wrapped=0):
    """The object qualname names in module modname (not imported here), or
    None; wrapped: so many steps down its __wrapped__ chain (a function a
    decorator wraps: the name finds the wrapper)."""
    memo = _names.get()
    key = ("name", modname, qualname, wrapped)
    if memo is not None and key in memo:
        return memo[key]
    obj = _find(modname, qualname)
    for _ in range(wrapped):
        obj = getattr(obj, "__wrapped__", None)
    if memo is not None:
        memo[key] = obj
    return obj


_MAX_WRAPPED = 8  # decorators between a name and the function it stands for


def _find(modname, qualname):
    obj = sys.modules.get(modname) if isinstance(modname, str) else None
    for part in qualname.split(".") if qualname else ():
        d = getattr(obj, "__dict__", None)
        if isinstance(d, (dict, types.MappingProxyType)) and part in d:
            obj = d[part]
        else:
            obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _functions(obj):
    """The Python functions obj may stand for: itself, what jit, staticmethod,
    classmethod and property wrap, and the __wrapped__ chain of decorators."""
    found = []
    for _ in range(16):
        if isinstance(obj, _C.JitFunction):
            obj = obj.fn
        elif isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
        elif isinstance(obj, types.MethodType):
            obj = obj.__func__
        if isinstance(obj, types.FunctionType):
            found.append(obj)
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            break
    return found


def namedtuple_code(code, globs):
    """Whether code is a method collections.namedtuple generated (its
    __new__): the standard library's, shaped by the field names alone."""
    name = globs.get("__name__")
    return code.co_filename == "<string>" and isinstance(name, str) and name.startswith("namedtuple_")


def code_ref(code, globs):
    """["code", module, qualified name, function_hash] of the function that
    holds code: the function itself, or the one it is nested in (a closure,
    a comprehension, a class defined in a function)."""
    modname = globs.get("__name__")
    mod = sys.modules.get(modname) if isinstance(modname, str) else None
    if mod is None or getattr(mod, "__dict__", None) is not globs:
        raise Unportable(f"{code.co_qualname} runs in globals that no imported module holds")
    if code.co_filename == "<string>":
        return _generated_ref(code, mod)
    parts = code.co_qualname.split(".")
    if "<locals>" in parts:
        parts = parts[:parts.index("<locals>")]
    qualname = ".".join(parts)
    if not parts or parts[0].startswith("<"):
        raise Unportable(f"{code.co_qualname} ({code.co_filename}) cannot be found by name")
    for fn in _functions(_lookup(modname, qualname)):
        if _contains(fn.__code__, code):
            return ["code", modname, qualname, function_hash(fn)]
    raise Unportable(f"{modname}.{qualname} is not the function whose code ran ({code.co_filename}:"
                     f"{code.co_firstlineno})")


def _generated_ref(code, mod):
    """The ref of generated code (a dataclass's __init__, exec'd in its
    module's globals): the method of a class of that module that holds it,
    by the method's name; its hash checks the code generated in another
    process is the same."""
    for cls in list(vars(mod).values()):
        if isinstance(cls, type) and cls.__module__ == mod.__name__:
            for name, fn in list(vars(cls).items()):
                if isinstance(fn, types.FunctionType) and fn.__code__ is code:
                    return ["code", mod.__name__, f"{cls.__qualname__}.{name}", function_hash(fn)]
    raise Unportable(f"{code.co_qualname} is generated code that no class of {mod.__name__} holds")


def code_matches(ref):
    """Whether the function ref names is loaded and holds the code it
    hashed, or the installed distribution is still of that version."""
    if ref[0] == "dist":
        return _dist_version(ref[1]) == ref[2]
    modname, qualname, h = ref[1:]
    return any(function_hash(fn) == h for fn in _functions(_lookup(modname, qualname)))


@functools.lru_cache(maxsize=None)
def _dist_version(name):
    try:
        return importlib.metadata.version(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def _installed(globs):
    """["dist", name, version] when globs are a module's of an installed
    distribution (in site-packages, under its top-level name), else None:
    such code is identified by the distribution's version, as torch's is,
    not hashed function by function (libraries generate code, dataclass
    methods among it, that no name finds)."""
    modname = globs.get("__name__")
    filename = globs.get("__file__")
    if not isinstance(modname, str) or not isinstance(filename, str) or not _installed_file(filename):
        return None
    top = modname.split(".")[0]
    version = _dist_version(top)
    return ["dist", top, version] if version else None


# -- values, described without identities ------------------------------------------

def _torch_name(x):
    """A dtype, layout or memory format by its name in torch (getattr(torch, name) finds it)."""
    return str(x).removeprefix("torch.")


def _name_ref(obj):
    """[module, qualname] of a class, a builtin, a Python module or a
    function; [module, qualname, k] of a function a decorator wrapped (its
    name finds the wrapper, k steps up its __wrapped__ chain: HF models'
    forward under merge_with_config_defaults); [module, name] of a builtin
    its module holds under another qualname's name (torch.tanh, whose
    qualname is _VariableFunctionsClass.tanh)."""
    if isinstance(obj, types.ModuleType):
        return [obj.__name__, ""]
    modname, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(modname, str) and isinstance(qualname, str):
        found = _lookup(modname, qualname)
        for k in range(_MAX_WRAPPED + 1):
            if found is obj:
                return [modname, qualname, k] if k else [modname, qualname]
            found = getattr(found, "__wrapped__", None)
            if found is None:
                break
        name = getattr(obj, "__name__", None)
        if isinstance(obj, types.BuiltinFunctionType) and isinstance(name, str) and name != qualname and \
                _lookup(modname, name) is obj:
            return [modname, name]
    raise Unportable(f"{obj!r} cannot be found by name")


class _Describer:
    """Describes the values a trace's guards compare by identity."""

    def __init__(self, module_paths):
        self.module_paths = module_paths  # id(module) -> (root slot, its path below that module)
        self.depth = 0  # objects described by their attributes, nested
        self.nesting = 0  # values being described, nested
        self.budget = _MAX_DESCRIBED  # values left to describe

    def value(self, v, lenient=False):
        """v's description (raises Unportable); lenient: a value with none
        (a descriptor in a class's dict) is described by its type."""
        if lenient:
            try:
                return self.value(v)
            except Unportable:
                return ["kind", type(v).__module__, type(v).__qualname__]
        self.budget -= 1
        if self.budget < 0:
            raise Unportable(f"the guards hold more than {_MAX_DESCRIBED} values")
        self.nesting += 1
        try:
            return self._value(v)
        finally:
            self.nesting -= 1

    def _value(self, v):
        if self.nesting > _MAX_NESTING:
            raise Unportable(f"a guarded value nests deeper than {_MAX_NESTING} (it may hold itself)")
        t = type(v)
        if v is None or t in (bool, int, float, str):
            return ["p", v]
        if t is torch.torch_version.TorchVersion:  # torch.__version__: a str that compares as a version
            return ["torchversion", str(v)]
        if t in NUMPY_SCALARS:  # scale = 1 / np.sqrt(d): by its type's name and value
            return ["npscalar", t.__name__, v.item()]
        if t is torch.dtype:
            return ["dtype", _torch_name(v)]
        if t is torch.device:
            return ["device", str(v)]
        if t in (tuple, list, torch.Size):
            return ["seq", t.__name__, [self.value(x) for x in v]]
        if namedtuple_value(v):  # HP = Hparams(2.0, 1.0): its class and items
            return ["ntuple", _name_ref(t), [self.value(x) for x in v]]
        if t in (set, frozenset):
            return ["seq", t.__name__, sorted((self.value(x) for x in v), key=json.dumps)]
        if isinstance(v, dict) and t.__module__ in ("builtins", "collections"):
            if any(type(k) not in (str, int) for k in v):
                raise Unportable("a guarded dict has keys other than strings and ints")
            return ["map", _name_ref(t), [[k, self.value(x)] for k, x in v.items()]]
        if isinstance(v, torch.nn.Module):
            path = self.module_paths.get(id(v))
            if path is None:
                raise Unportable(f"a {t.__name__} module outside the guarded modules is held")
            return ["mod", _name_ref(t), path[0], path[1]]
        if isinstance(v, torch.Tensor):
            if t not in (torch.Tensor, torch.nn.Parameter) or not v.is_cpu or v.layout != torch.strided:
                raise Unportable(f"a {t.__name__} on {v.device} is held")
            return ["tensor", _name_ref(t), _torch_name(v.dtype), list(v.shape),
                    list(v.stride()), bool(v.requires_grad)]
        if isinstance(v, types.FunctionType) and isinstance(getattr(v, "_tn_jit", None), _C.JitFunction):
            return ["jit", self.value(v._tn_jit.fn)]  # the forward jit(module) installs
        if isinstance(v, types.FunctionType):
            ref = _name_ref(v)
            if versioned_code(v.__code__.co_filename):
                return ["obj", ref]
            return ["fn", ref, function_hash(v)]
        if isinstance(v, types.MethodType):  # a jitted module's forward, among others
            return ["method", self.value(v.__self__), self.value(v.__func__)]
        if t is _C.JitFunction:
            try:
                return ["obj", _name_ref(v)]  # @jit at module level
            except Unportable:
                return ["jit", self.value(v.fn)]  # jit(module) made it
        if isinstance(v, (type, types.BuiltinFunctionType, types.ModuleType)):
            return ["obj", _name_ref(v)]
        if t is types.CodeType:  # a helper's __code__ (_jit.guard_function): by what it does
            return ["code", code_hash(v)]
        if t is weakref.ref:  # nn.RNNBase's _flat_weight_refs: by what it refers to (None: dead)
            return ["weakref", self.value(v())]
        if t is functools.partial:  # its function and arguments are no attributes
            return ["partial", self.value(v.func), [self.value(a) for a in v.args],
                    [[k, self.value(x)] for k, x in v.keywords.items()]]
        if t in (property, staticmethod, classmethod):  # in a class's dict: by the functions it wraps
            fns = (v.fget, v.fset, v.fdel) if t is property else (v.__func__,)
            return ["wraps", t.__name__, [self._wrapped(f) for f in fns]]
        if isinstance(v, enum.Enum):  # a member of its class, by name (an IntEnum's value is an int's)
            ref = [t.__module__, f"{t.__qualname__}.{v.name}"]
            if _lookup(*ref) is v:
                return ["obj", ref]
        attrs = getattr(v, "__dict__", None)
        if type(attrs) is dict and self.depth < _MAX_OBJECT_DEPTH and state_in_dict(t):
            # a config object, say: by its attributes
            self.depth += 1
            try:
                return ["object", _name_ref(t), [[k, ["salted"] if _salted(k, x) else self.value(x)]
                                                 for k, x in attrs.items()]]
            finally:
                self.depth -= 1
        raise Unportable(f"a {t.__qualname__} object is held by identity")

    def _wrapped(self, fn):
        """A function a property or a static or class method wraps: by what it
        does (a getter defined in the class body has no name that finds it)."""
        if fn is None or not isinstance(fn, types.FunctionType):
            return self.value(fn)
        return ["fnhash", function_hash(fn)]


def _salted(name, value):
    """Whether attribute name of an object a record describes holds a hash
    of this process's: an int named *_hash (transformers' GenerationConfig
    keeps _original_object_hash, the hash of its JSON text, which
    PYTHONHASHSEED salts per process). A record describes it as any int
    (["salted"]): with its value, the record of a model that generate()
    ran would apply in no other process."""
    return type(value) is int and name.endswith("_hash")


def _matches(desc, v, live):
    """Whether live value v fits description desc (live: the slots loaded so far)."""
    kind = desc[0]
    if kind == "salted":
        return type(v) is int
    if kind == "p":
        want = desc[1]
        return same_value(v, want)
    if kind == "torchversion":
        return type(v) is torch.torch_version.TorchVersion and str(v) == desc[1]
    if kind == "npscalar":
        return type(v) in NUMPY_SCALARS and type(v).__name__ == desc[1] and same_value(v.item(), desc[2])
    if kind == "dtype":
        return v is getattr(torch, desc[1], None)
    if kind == "device":
        return type(v) is torch.device and str(v) == desc[1]
    if kind == "seq":
        if type(v).__name__ != desc[1] or type(v) not in (tuple, list, torch.Size, set, frozenset) \
                or len(v) != len(desc[2]):
            return False
        try:
            items = sorted(v, key=lambda x: json.dumps(_Describer({}).value(x))) if desc[1].endswith("set") else v
        except Unportable:
            return False
        return all(_matches(d, x, live) for d, x in zip(desc[2], items))
    if kind == "ntuple":
        return type(v) is _lookup(*desc[1]) and len(v) == len(desc[2]) and \
            all(_matches(d, x, live) for d, x in zip(desc[2], v))
    if kind == "map":
        return type(v) is _lookup(*desc[1]) and len(v) == len(desc[2]) and \
            all(k in v and _matches(d, v[k], live) for k, d in desc[2])
    if kind == "mod":
        if type(v) is not _lookup(*desc[1]):
            return False
        if desc[2] >= len(live):  # its slot comes later: checked when loaded
            live.deferred.append((v, desc[2], desc[3]))
            return True
        return v is _submodule(live[desc[2]], desc[3])
    if kind == "tensor":
        return type(v) is _lookup(*desc[1]) and v.is_cpu and v.layout == torch.strided and \
            str(v.dtype) == "torch." + desc[2] and list(v.shape) == desc[3] and list(v.stride()) == desc[4] and \
            v.requires_grad == desc[5]
    if kind == "object":
        attrs = getattr(v, "__dict__", None)
        return type(v) is _lookup(*desc[1]) and type(attrs) is dict and len(attrs) == len(desc[2]) and \
            all(k in attrs and _matches(d, attrs[k], live) for k, d in desc[2])
    if kind == "weakref":
        return type(v) is weakref.ref and _matches(desc[1], v(), live)
    if kind == "partial":
        return type(v) is functools.partial and _matches(desc[1], v.func, live) and \
            len(v.args) == len(desc[2]) and all(_matches(d, a, live) for d, a in zip(desc[2], v.args)) and \
            len(v.keywords) == len(desc[3]) and all(k in v.keywords and _matches(d, v.keywords[k], live)
                                                    for k, d in desc[3])
    if kind == "wraps":
        if type(v).__name__ != desc[1] or type(v) not in (property, staticmethod, classmethod):
            return False
        fns = (v.fget, v.fset, v.fdel) if type(v) is property else (v.__func__,)
        return all(_matches(d, f, live) for d, f in zip(desc[2], fns))
    if kind == "fnhash":
        return isinstance(v, types.FunctionType) and function_hash(v) == desc[1]
    if kind == "method":
        return type(v) is types.MethodType and _matches(desc[1], v.__self__, live) and \
            _matches(desc[2], v.__func__, live)
    if kind == "jit":
        jf = getattr(v, "_tn_jit", None) if isinstance(v, types.FunctionType) else v
        return type(jf) is _C.JitFunction and _matches(desc[1], jf.fn, live)
    if kind == "obj":
        return v is _lookup(*desc[1])
    if kind == "code":
        return type(v) is types.CodeType and code_hash(v) == desc[1]
    if kind == "kind":
        return type(v).__module__ == desc[1] and type(v).__qualname__ == desc[2]
    if kind == "fn":
        return v is _lookup(*desc[1]) and isinstance(v, types.FunctionType) and function_hash(v) == desc[2]
    return False


def _submodule(root, path):
    if not path:
        return root
    memo = _names.get()
    if memo is None:
        return root.get_submodule(path)
    key = ("module", id(root), path)  # the program holds root for the memo's life: its id stays its own
    if key not in memo:
        memo[key] = root.get_submodule(path)
    return memo[key]


# -- guard programs, by path ---------------------------------------------------------

def portable_spec(trace, upto=None, spec=None, skip=frozenset()):
    """The trace's guard program (the first upto instructions; spec: the
    entry's own, when it is not trace.spec: a dynamic variant's) with every
    held object replaced by its path or description; the instructions in
    skip as ["nop"]."""
    with _memo():
        return _portable_spec(trace, upto, trace.spec if spec is None else spec, skip)


def _portable_spec(trace, upto, spec, skip):
    if trace.opaque:
        raise Unportable(f"{trace.opaque[0]} (not guarded)")
    out = []
    describe = _Describer(trace.module_paths)
    for slot, inst in enumerate(spec[:upto]):
        kind = inst[0]
        if slot in skip:
            out.append(["nop"])
        elif kind in ("arg", "item", "key", "cell", "attrs", "func", "len", "same", "plain", "bare", "nop"):
            out.append(list(inst))
        elif kind == "const":
            out.append(["const", _portable_path(spec.paths.get(slot), inst[1], spec.names[slot])])
        elif kind == "type":
            out.append(["type", inst[1], _name_ref(inst[2])])
        elif kind in ("is", "eq"):
            out.append([kind, inst[1], describe.value(inst[2])])
        elif kind == "isweak":
            held = inst[2]()
            if held is None:
                raise Unportable(f"{spec.names[slot]} is gone")
            out.append(["isweak", inst[1], describe.value(held)])
        elif kind == "tensor":
            out.append(["tensor", inst[1], _torch_name(inst[2]), list(inst[3]),
                        None if inst[4] is None else list(inst[4]), inst[5]])
        elif kind in ("sizes", "distinct"):
            out.append([kind, list(inst[1])])
        elif kind == "order":
            out.append(["order", inst[1], list(inst[2])])
        elif kind == "dict":
            if any(type(k) not in (str, int) for k in inst[2]):
                raise Unportable(f"{spec.names[slot]} has keys other than strings and ints")
            lenient = spec.paths.get(inst[1], ("",))[0] == "classdict"
            out.append(["dict", inst[1], list(inst[2]),
                        [["absent"] if v is _C.GUARD_ABSENT else ["any"] if v is _C.GUARD_ANY else
                         describe.value(v, lenient) for v in inst[3]], inst[4]])
        elif kind == "call" and (spec.names[slot] in STATE or spec.names[slot] in READ_STATE) and \
                state_reader(spec.names[slot]) is inst[1]:
            out.append(["state", describe.value(inst[2])])
        else:
            raise Unportable(f"guard {kind} of {spec.names[slot]}")
    return out


def _portable_path(path, held, name):
    """The path of a held object as stored: a captured tensor by value; a
    module's globals checked to be what the name finds."""
    if path is None:
        raise Unportable(f"{name} is held by identity")
    if path[0] == "value":
        t = path[1]
        if t.numel() > _MAX_CONST_NUMEL or t.is_complex() or not t.is_cpu or t.layout != torch.strided:
            raise Unportable(f"{name} is not a real dense CPU tensor of at most {_MAX_CONST_NUMEL} elements")
        return ["value", _torch_name(t.dtype), list(t.shape), list(t.stride()),
                t.reshape(-1).tolist()]
    if path[0] == "classdict":
        return ["classdict", _name_ref(path[1])]
    if path[0] in ("global", "globals"):
        try:
            found = _resolve(path, None, ())
        except (KeyError, TypeError):
            found = None
        if found is not held:
            raise Unportable(f"{name} is not what its name finds")
    return list(path)


class Mismatch(Exception):
    """A record's guards do not hold for this call (the reason, in words)."""


def _resolve(path, fn, live):
    kind = path[0]
    if kind == "module":
        _, slot, sub, attr = path
        d = _submodule(live[slot], sub).__dict__
        return d if attr == "__dict__" else d[attr]
    if kind in ("global", "globals"):
        d = sys.modules[path[1]].__dict__
        return d[path[2]] if kind == "global" else d
    if kind == "closure":
        return fn.__closure__[path[1]]
    if kind == "objdict":  # the attributes of the object loaded at slot path[1]
        return live[path[1]].__dict__
    if kind == "classdict":
        cls = _lookup(*path[1])
        if not isinstance(cls, type):
            raise LookupError(f"no class {'.'.join(path[1])}")
        return _C.class_dict(cls)
    if kind == "value":
        _, dtype, sizes, strides, data = path
        t = torch.empty_strided(sizes, strides, dtype=getattr(torch, dtype))
        return t.copy_(torch.tensor(data, dtype=t.dtype).reshape(sizes))
    raise ValueError(f"unknown path {kind}")


def _change(desc, v):
    """How live value v differs from description desc, in words."""
    if desc[0] == "p":
        return f"{desc[1]!r} → {v!r}"
    return f"a {type(v).__name__} unlike the record's"


def live_spec(pspec, names, fn, args):
    """The guard program of a record rebuilt on live objects, and the value of
    each slot for args. Raises Mismatch (the reason) when it does not hold."""
    with _memo():
        return _live_spec(pspec, names, fn, args)


class _Live(list):
    """The values a record's guards load, slot by slot, as _live_spec makes
    them; deferred: (module, root slot, path) of the modules a description
    names by a slot loaded later (a global module: its globals' snapshot
    comes before the slot that loads it), checked once it is."""

    def __init__(self):
        super().__init__()
        self.deferred = []


def _live_spec(pspec, names, fn, args):
    spec, live = Spec(), _Live()
    for inst, name in zip(pspec, names):
        kind = inst[0]
        value = None
        try:
            if kind == "arg":
                value = args[inst[1]]
            elif kind in ("item", "key"):
                value = live[inst[1]][inst[2]]
            elif kind == "cell":
                value = live[inst[1]].cell_contents
            elif kind == "attrs":
                value = vars(live[inst[1]])
            elif kind == "func":
                value = func_field(live[inst[1]], inst[2])
                if value is NO_FIELD:
                    raise Mismatch(f"{name}: no function")
            elif kind == "const":
                value = _resolve(inst[1], fn, live)
                inst = ("const", value)
            elif kind == "type":
                t = _lookup(*inst[2])
                if not isinstance(t, type):
                    raise Mismatch(f"{name}: the type {'.'.join(inst[2])} is not loaded")
                inst = ("type", inst[1], t)
            elif kind in ("is", "eq", "isweak"):
                got = live[inst[1]]
                if not _matches(inst[2], got, live):
                    raise Mismatch(f"{name}: {_change(inst[2], got)}")
                inst = (kind, inst[1], weakref.ref(got) if kind == "isweak" else got)
            elif kind == "tensor":
                inst = ("tensor", inst[1], getattr(torch, inst[2]), tuple(inst[3]),
                        None if inst[4] is None else tuple(inst[4]), inst[5])
            elif kind in ("sizes", "distinct"):
                inst = (kind, tuple(inst[1]))
            elif kind == "order":
                inst = ("order", inst[1], tuple(inst[2]))
            elif kind == "dict":
                d = live[inst[1]]
                values = []
                for k, desc in zip(inst[2], inst[3]):
                    if desc == ["absent"]:  # a builtin the code read, shadowed by no global
                        if k in d:
                            raise Mismatch(shadowed(name, k))
                        values.append(_C.GUARD_ABSENT)
                        continue
                    if desc == ["any"] and k in d:  # a module's attribute no code of the trace named
                        values.append(_C.GUARD_ANY)
                        continue
                    if k not in d or not _matches(desc, d[k], live):
                        raise Mismatch(f"{entry_name(name, k)}: {'missing' if k not in d else _change(desc, d[k])}")
                    values.append(d[k])
                inst = ("dict", inst[1], tuple(inst[2]), tuple(values), inst[4])
            elif kind == "state":
                desc = inst[1]
                inst = ("call", state_reader(name), _simple_value(desc))
        except (LookupError, AttributeError, TypeError, ValueError) as exc:
            raise Mismatch(f"{name}: {type(exc).__name__}: {exc}") from None
        spec.add(tuple(inst), name)
        live.append(value)
    for v, root, path in live.deferred:
        try:
            same = root < len(live) and v is _submodule(live[root], path)
        except AttributeError:
            same = False
        if not same:
            raise Mismatch(f"{names[root] if root < len(names) else 'a module'}{'.' + path if path else ''}: "
                           "not the module the record names")
    failed = _C.GuardSet(list(spec)).check(*args)
    if failed >= 0:
        raise Mismatch(explain(spec, args, failed))
    return spec, live


# -- graphs ---------------------------------------------------------------------

# size arithmetic a symbolic graph calls besides operator's (a size at a scale factor: int(float(s) * 0.5))
_SIZE_FUNCTIONS = {f"{fn.__module__}.{fn.__name__}": fn for fn in (torch.sym_float, torch.sym_int, torch.sym_max,
                                                                   torch.sym_min, math.trunc, math.floor, math.ceil)}
_SIZE_FUNCTION_NAMES = {fn: name for name, fn in _SIZE_FUNCTIONS.items()}


def _target_name(target):
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    if getattr(operator, getattr(target, "__name__", ""), None) is target:
        return f"operator.{target.__name__}"
    if isinstance(target, types.BuiltinFunctionType | types.FunctionType) and target in _SIZE_FUNCTION_NAMES:
        return _SIZE_FUNCTION_NAMES[target]
    raise Unportable(f"the graph calls {target!r}")


def _target(name):
    if name.startswith("operator."):
        return getattr(operator, name.split(".", 1)[1])
    if name in _SIZE_FUNCTIONS:
        return _SIZE_FUNCTIONS[name]
    ns, rest = name.split("::", 1)
    op, overload = rest.rsplit(".", 1)
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


_ENUMS = {"dtype": torch.dtype, "layout": torch.layout, "mf": torch.memory_format}


def _encode_arg(a, index):
    if isinstance(a, torch.fx.Node):
        return {"n": index[a]}
    if a is None or type(a) in (bool, int, float, str):
        return a
    if isinstance(a, tuple):
        return {"t": [_encode_arg(x, index) for x in a]}
    if isinstance(a, list):
        return [_encode_arg(x, index) for x in a]
    for tag, t in _ENUMS.items():
        if type(a) is t:
            return {tag: _torch_name(a)}
    if type(a) is torch.device:
        return {"device": str(a)}
    raise Unportable(f"the graph holds a {type(a).__name__} argument")


def _decode_arg(a, nodes):
    if isinstance(a, list):
        return [_decode_arg(x, nodes) for x in a]
    if isinstance(a, dict):
        (tag, v), = a.items()
        if tag == "n":
            return nodes[v]
        if tag == "t":
            return tuple(_decode_arg(x, nodes) for x in v)
        if tag == "device":
            return torch.device(v)
        return getattr(torch, v)
    return a


def _encode_val(v, symbolic=False):
    if isinstance(v, torch.Tensor):
        dims = (*v.shape, *v.stride(), v.storage_offset())
        if not all(isinstance(d, int) for d in dims):
            if symbolic:  # no metadata: the graph runs only as the eager original of a stored plan
                return ["X"]
            raise Unportable("the graph has symbolic sizes")
        return ["T", _torch_name(v.dtype), list(v.shape), list(v.stride()), v.storage_offset()]
    if symbolic and isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ["X"]
    if isinstance(v, (list, tuple)):
        return ["L" if isinstance(v, list) else "U", [_encode_val(x, symbolic) for x in v]]
    if v is None or type(v) in (bool, int, float):
        return ["S", v]
    raise Unportable(f"a graph value is a {type(v).__name__}")


def _decode_val(v, mode):
    tag = v[0]
    if tag == "X":
        return None
    if tag == "T":
        _, dtype, sizes, strides, offset = v
        return fake_tensor(mode, getattr(torch, dtype), sizes, strides, offset, _CPU)
    if tag in ("L", "U"):
        items = [_decode_val(x, mode) for x in v[1]]
        return items if tag == "L" else tuple(items)
    return v[1]


def encode_graph(gm, symbolic=False):
    """The functional ATen graph gm as JSON-able lists, each node with its
    value's metadata (symbolic: a graph over symbolic sizes, whose symbolic
    values are stored without metadata; decoded, it can run but not be
    compiled)."""
    index, nodes = {}, []
    for node in gm.graph.nodes:
        index[node] = len(nodes)
        if node.op == "placeholder":
            item = ["p"]
        elif node.op == "call_function":
            item = ["c", _target_name(node.target), _encode_arg(tuple(node.args), index),
                    {k: _encode_arg(v, index) for k, v in node.kwargs.items()}]
        elif node.op == "output":
            item = ["o", _encode_arg(node.args[0], index)]
        else:
            raise Unportable(f"the graph has a {node.op} node")
        item.append(_encode_val(node.meta.get("val"), symbolic) if node.op != "output" else None)
        nodes.append(item)
    return nodes


def decode_graph(nodes):
    """A GraphModule from encode_graph's lists, its values fake tensors. Its
    Python code is generated on first use: the back end compiles a copy,
    and this one runs only if the compiled graph fails."""
    graph = torch.fx.Graph()
    mode = FakeTensorMode()
    made, placeholders = [], 0
    for item in nodes:
        op = item[0]
        if op == "p":
            node = graph.placeholder(f"in{placeholders}")
            placeholders += 1
        elif op == "c":
            node = graph.call_function(_target(item[1]), _decode_arg(item[2], made),
                                       {k: _decode_arg(v, made) for k, v in item[3].items()})
        else:
            node = graph.output(_decode_arg(item[1], made))
        if op != "o":
            node.meta["val"] = _decode_val(item[-1], mode)
        made.append(node)
    graph.lint()
    return _LazyGraphModule({}, graph)


class EagerGraph:
    """The eager original of a record's graph, decoded when first needed:
    a compiled plan calls it only if one of its steps fails, so a warm
    start decodes the graph once, for the back end to rewrite."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.gm = None

    def module(self):
        if self.gm is None:
            self.gm = decode_graph(self.nodes)
        return self.gm

    @property
    def graph(self):
        return self.module().graph

    def __call__(self, *args):
        return self.module()(*args)


# -- result structures -----------------------------------------------------------------

def _encode_context(c):
    if c is None or type(c) in (bool, int, float, str):
        return c
    if isinstance(c, (list, tuple)):
        return {"list" if isinstance(c, list) else "tuple": [_encode_context(x) for x in c]}
    if isinstance(c, type):
        return {"type": _name_ref(c)}
    raise Unportable(f"the result's structure holds a {type(c).__name__}")


def _decode_context(c):
    if isinstance(c, dict):
        (tag, v), = c.items()
        if tag == "type":
            return _lookup(*v)
        items = [_decode_context(x) for x in v]
        return items if tag == "list" else tuple(items)
    return c


def encode_treespec(spec):
    if spec.is_leaf():
        return None
    return [_name_ref(spec.type), _encode_context(spec.context), [encode_treespec(c) for c in spec.children()]]


def decode_treespec(e):
    if e is None:
        return pytree.treespec_leaf()
    typ = _lookup(*e[0])
    return pytree.TreeSpec(typ, _decode_context(e[1]), [decode_treespec(c) for c in e[2]])


# -- objects the result holds ---------------------------------------------------------

def _plain_state(t):
    """Whether instances of class t are made by t.__new__(t) and their
    __dict__, as copy.copy and pickle make them: no __slots__, no
    __reduce__, __getstate__ or __setstate__ of its own, no C base that
    keeps state out of __dict__."""
    return isinstance(t, type) and not issubclass(t, (torch.Tensor, torch.nn.Module, type)) and \
        t.__reduce_ex__ is object.__reduce_ex__ and t.__reduce__ is object.__reduce__ and \
        getattr(t, "__getstate__", object.__getstate__) is object.__getstate__ and \
        not hasattr(t, "__setstate__") and state_in_dict(t)


def encode_template(v, seen=None):
    """A description of template v, an object of a result that holds
    tensors (a DynamicCache) with None where they lie (_dynamic.rebuilt):
    numbers, strings, None, dtypes, devices, lists, tuples, dicts and
    objects of classes found by name whose state is their __dict__
    (_plain_state). decode_template makes it again (raises Unportable)."""
    seen = set() if seen is None else seen
    if len(seen) > _MAX_DESCRIBED:
        raise Unportable(f"the result holds an object of more than {_MAX_DESCRIBED} values")
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return ["p", v]
    if t is torch.dtype:
        return ["dtype", _torch_name(v)]
    if t is torch.device:
        return ["device", str(v)]
    if id(v) in seen:  # one list or object at two places: a copy would make two
        raise Unportable(f"the result holds a {t.__name__} twice")
    seen.add(id(v))
    if t in (list, tuple):
        return ["seq", t.__name__, [encode_template(x, seen) for x in v]]
    if t is dict and all(type(k) in (str, int) for k in v):
        return ["map", [[k, encode_template(x, seen)] for k, x in v.items()]]
    if _plain_state(t) and type(getattr(v, "__dict__", None)) is dict:
        return ["new", _name_ref(t), [[k, encode_template(x, seen)] for k, x in v.__dict__.items()]]
    raise Unportable(f"the result holds a {t.__qualname__}, which a record cannot describe")


def decode_template(e):
    """The object encode_template described (raises Mismatch when a class
    it names is not found, or has changed how it keeps its state)."""
    tag = e[0]
    if tag == "p":
        return e[1]
    if tag == "dtype":
        return getattr(torch, e[1])
    if tag == "device":
        return torch.device(e[1])
    if tag == "seq":
        items = [decode_template(x) for x in e[2]]
        return items if e[1] == "list" else tuple(items)
    if tag == "map":
        return {k: decode_template(x) for k, x in e[1]}
    assert tag == "new", tag
    cls = _lookup(*e[1])
    if not _plain_state(cls):
        raise Mismatch(f"the result's {'.'.join(e[1][:2])} is not the class the record describes")
    obj = cls.__new__(cls)
    obj.__dict__.update((k, decode_template(x)) for k, x in e[2])
    return obj


def _encode_plan_entry(p):
    """A result plan's entry p as a record holds it: an object holding
    tensors ("object", template, [(path, entry)]) by its template's
    description."""
    if p[0] == "object":
        return ["object", encode_template(p[1]), [[[list(step) for step in path], list(e)] for path, e in p[2]]]
    if p[0] == "const" and not (p[1] is None or type(p[1]) in (bool, int, float, str)):
        raise Unportable(f"the result holds a {type(p[1]).__name__}")
    return list(p)


def decode_plan(plan):
    """The result plan a record holds, as _jit's runner reads it."""
    return [("object", decode_template(p[1]), [(tuple(tuple(step) for step in path), tuple(e)) for path, e in p[2]])
            if p[0] == "object" else tuple(p) for p in plan]


# -- store and load ----------------------------------------------------------------

def _number_guard(a):
    """Whether portable guard a checks an int or a float: its value (eq),
    or only its type (a dynamic variant's int or float argument)."""
    return (a[0] == "eq" and a[2][0] == "p" and type(a[2][1]) in (int, float)) or \
        (a[0] == "type" and a[2] in (["builtins", "int"], ["builtins", "float"]))


def trace_key(fn, trace, pspec=None):
    """The record key of a call: versions and options, fn's code, the
    process state it depends on and its argument guards (trace after
    guard_arguments; pspec: its portable_spec when already made, of which
    the argument guards are the first instructions)."""
    from .backend import _key_context
    # the state every call is guarded on (what the trace read of READ_STATE is known after it ran: its guards)
    state = [[name, _Describer({}).value(value)] for name, value in trace.state.items() if name in STATE]
    # what modules' attributes hold (module_held) is left to each record's guards: where no code of its trace
    # named the attribute, it has none (relax_module_dicts), and a key that held it would differ by its contents
    held = {i for _, _, start, end, _ in trace.module_held for i in range(start, end)}
    arguments = (pspec if pspec is not None else portable_spec(trace, trace.argument_guards, skip=held))
    # tensors by dtype, rank and requires_grad, ints and floats by slot: every size's and every value's
    # variants (and a dynamic one) share the key
    # modules' attributes by name only: the record's guards check the values its trace named (relax_module_dicts),
    # and a key that held them would differ with every value of a counter no code reads
    paths = trace.spec.paths
    arguments = [["tensor", a[1], a[2], len(a[3]), a[5]] if a[0] == "tensor" else
                 ["number", a[1]] if _number_guard(a) else
                 ["attributes", a[1], a[2]] if a[0] == "dict" and _module_attributes(paths.get(a[1])) else
                 a for a in arguments[:trace.argument_guards]]
    arguments = _without(arguments, held)
    head = _function_head(fn) + [state, arguments]
    return _C.content_key(_key_context() + b"; jit trace " + json.dumps(head).encode())


# the portable instructions whose operand 1 is a slot (_portable_spec; trace_key's own forms)
_FROM_SLOT = frozenset(("item", "key", "cell", "attrs", "func", "len", "plain", "bare", "type", "is", "eq", "isweak", "tensor",
                        "order", "dict", "same", "number", "attributes"))


def _without(pspec, skip):
    """Portable instructions pspec without those at the indices in skip,
    and the slots the others read numbered as in that shorter program (a
    slot in skip as -1): what a module's list holds took as many
    instructions as it had items, and shifted every slot after it."""
    before, n = [], 0
    for i in range(len(pspec)):
        before.append(n)
        n += i in skip

    def slot(s):
        return -1 if s in skip else s - before[s]

    out = []
    for i, inst in enumerate(pspec):
        if i in skip:
            continue
        kind = inst[0]
        if kind in _FROM_SLOT:
            inst = [kind, slot(inst[1])] + list(inst[2:])
            if kind == "same":
                inst[2] = slot(inst[2])
        elif kind == "distinct":
            inst = [kind, [slot(s) for s in inst[1]]]
        elif kind == "sizes":
            raise Unportable("a sizes guard among the argument guards")
        out.append(inst)
    return out


def _module_attributes(path):
    """Whether path (a const slot's, _jit.guard_module) loads a module's __dict__."""
    return isinstance(path, tuple) and len(path) == 4 and path[0] == "module" and path[3] == "__dict__"


def _function_head(fn):
    """What identifies fn's code in a key: the record format, Python's
    version, where fn is defined and a hash of what it does (raises
    Unportable)."""
    return [FORMAT, sys.version, code_ref(fn.__code__, fn.__globals__), code_hash(fn.__code__)]


def function_key(fn):
    """The key of the mark that fn's code has trace records under some
    record key (store writes it): a miss looks it up before it makes the
    record key, which describes the arguments' guards (HF BERT's first
    miss, on a cold cache: 7-10 ms for a key that held nothing). Raises
    Unportable as trace_key does."""
    from .backend import _key_context
    return _C.content_key(_key_context() + b"; jit traced " + json.dumps(_function_head(fn)).encode())


def has_records(fn):
    """Whether fn's code may have trace records (its mark is stored)."""
    try:
        return cache.get(cache.TRACES, function_key(fn)) is not None
    except Unportable:
        return False


def read(key):
    """The variants stored under key, newest first ([] when none or unreadable)."""
    return _variants(cache.get(cache.TRACES, key))


def _variants(payload):
    """The variants of a stored payload (None: none), newest first."""
    if payload is None:
        return []
    try:
        record = json.loads(payload)
        return record["variants"] if record.get("format") == FORMAT else []
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def variant(trace, pspec, fgm, slots, checks, writebacks, out_plan, sets, objects, names=None, dense=(), random=True,
            inference=False, bindings=()):
    """The record of one traced entry, pspec its portable_spec (names: its
    spec's words, when it is not trace.spec); sets and objects: what it
    sets on the last objects of its slots (_jit._Sets); dense: the graph's
    inputs its runner copies dense ((input, order)); random: whether its
    graph draws random numbers; inference: whether it runs in inference
    mode, switched on inside the call; bindings: what library code found
    by name (_jit._library_bindings), checked when it loads (raises
    Unportable)."""
    codes = []
    for code, globs in trace.codes:
        if not versioned_code(code.co_filename) and not namedtuple_code(code, globs):
            ref = _installed(globs) or code_ref(code, globs)
            if ref not in codes:
                codes.append(ref)
    treespec, plan = out_plan
    encoded_spec = encode_treespec(treespec)
    if decode_treespec(encoded_spec) != treespec:
        raise Unportable("the result's structure does not survive its description")
    plan = [_encode_plan_entry(p) for p in plan]
    for _, value in checks:
        if type(value) not in (bool, int, float):
            raise Unportable(f"a value read from a tensor is a {type(value).__name__}")
    sets = [[k, attr, _set_entry(attr, p)] for k, attr, p in sets]
    # a dynamic variant's graph (names: its own spec's) holds symbolic values, a float's without any "sizes" guard
    symbolic = names is not None or any(inst[0] == "sizes" for inst in pspec)
    record = {"spec": pspec, "names": list(trace.spec.names if names is None else names), "slots": list(slots),
              "codes": codes, "graph": encode_graph(fgm, symbolic), "checks": [list(c) for c in checks],
              "writebacks": [list(w) for w in writebacks], "treespec": encoded_spec,
              "plan": plan, "sets": sets,
              "objects": objects, "random": random, "inference": inference,
              "bindings": describe_bindings(bindings),
              "dense": [[i, None if order is None else list(order)] for i, order in dense],
              "effects": [["" if f == _filename(trace.fn) else f, line, what]
                          for (f, line), what in trace.side_effects.items()]}
    record["id"] = record_id(record)
    return record


def _set_value(attr, value):
    """The description of a value a variant sets on an argument's attribute
    (a number, a string, None, a device or a dtype: a cache layer's device)."""
    desc = _Describer({}).value(value) if value is None or type(value) in (bool, int, float, str, torch.device,
                                                                           torch.dtype) else None
    if desc is None:
        raise Unportable(f"the call sets an argument's attribute {attr} to a {type(value).__name__}")
    return desc


def _set_entry(attr, p):
    """The description of plan entry p of what a variant sets on an
    argument object's attribute attr (_jit._Sets)."""
    if p[0] == "const":
        return ["const", _set_value(attr, p[1])]
    if p[0] == "append":
        return ["append", [[_name_ref(cls), [[a, _set_entry(a, e)] for a, e in attrs]] for cls, attrs in p[1]]]
    if p[0] == "setitems":
        return ["setitems", [[key, _set_entry(str(key), e)] for key, e in p[1]]]
    return list(p)


def _simple_value(desc):
    """The number, string, None, device or dtype desc describes."""
    return torch.device(desc[1]) if desc[0] == "device" else getattr(torch, desc[1]) if desc[0] == "dtype" else desc[1]


def dense_inputs(record):
    """[(input, order or None)] of the inputs a variant's record says its
    runner copies dense (variant's dense)."""
    return [(i, None if order is None else tuple(order)) for i, order in record.get("dense", ())]


def set_entry(desc):
    """The plan entry _set_entry described (raises Mismatch for a class
    this process cannot find)."""
    if desc[0] == "const":
        value = desc[1]
        return ("const", _simple_value(value))
    if desc[0] == "append":
        out = []
        for ref, attrs in desc[1]:
            cls = _lookup(*ref)
            if not isinstance(cls, type):
                raise Mismatch(f"the class {'.'.join(ref)} of objects it appends is not loaded")
            out.append((cls, [(a, set_entry(e)) for a, e in attrs]))
        return ("append", out)
    if desc[0] == "setitems":
        return ("setitems", [(key, set_entry(e)) for key, e in desc[1]])
    return tuple(desc)


def _filename(fn):
    """The file of function fn's code, or None."""
    return getattr(getattr(fn, "__code__", None), "co_filename", None)


def effects(record, fn):
    """(file, line, what) of the print and logging calls of record's trace
    that a compiled call skips; "" stands for fn's own file (a notebook
    cell's is another file in each kernel: the words named the old one)."""
    return [(f or _filename(fn), line, what) for f, line, what in record["effects"]]


def record_id(record):
    """The id of a variant record: the key of its content (its id aside)."""
    return _C.content_key(json.dumps({k: v for k, v in record.items() if k != "id"}).encode()).hex()


def store(fn, key, record, limit):
    """Adds variant record of fn under key, newest first, keeping limit of
    them, and fn's mark (function_key); returns whether it was stored.
    Processes and threads storing variants of one key at once keep each
    other's (cache.update)."""
    def add(payload):
        others = [v for v in _variants(payload) if v.get("id") != record["id"]]
        return json.dumps({"format": FORMAT, "variants": [record] + others[:max(0, limit - 1)]}).encode()
    if cache.update(cache.TRACES, key, add) and cache.put(cache.TRACES, function_key(fn), b"{}"):
        _C.stat_add("trace_records_stored")
        return True
    return False


def applies(v, fn, args):
    """The live guard program of variant v and the value of each of its
    slots for fn's call on args; raises Mismatch when v's guards, code or
    library bindings do not hold."""
    spec, live = live_spec(v["spec"], v["names"], fn, args)
    for ref in v["codes"]:
        if not code_matches(ref):
            what = f"{ref[1]} {ref[2]}" if ref[0] == "dist" else f"the code of {ref[1]}.{ref[2]}"
            raise Mismatch(f"{what} changed since the record was made")
    with _memo():
        for modname, name, attr, desc in v.get("bindings", ()):
            mod = sys.modules.get(modname)
            if mod is None:  # not imported yet: nothing patched it
                continue
            if attr == "code":  # the library function that ran, found by its name: still a library's of that name
                if not any(f.__code__.co_qualname == name and library_code(f.__code__.co_filename)
                           for f in _functions(_lookup(modname, name))):
                    raise Mismatch(f"{modname}.{name} is not the library function the trace ran (patched in one "
                                   "process and not the other)")
                continue
            value = vars(mod).get(name)
            if attr is not None:
                value = vars(value).get(attr) if isinstance(value, types.ModuleType) else None
            if not _matches(desc, value, _Live()):
                raise Mismatch(f"{modname}.{name}{'' if attr is None else '.' + attr} is not what the traced "
                               "library code found there (patched in one process and not the other)")
    return spec, live


def describe_bindings(bindings):
    """The records' form of _jit._library_bindings: each binding a name
    finds ([module, name, attribute, description]); one without a name
    that finds it (a function made at run time) is left out."""
    out = []
    with _memo():
        for modname, name, attr, value in bindings:
            if attr == "code":
                if any(f.__code__ is value for f in _functions(_lookup(modname, name))):  # found by its name
                    out.append([modname, name, attr, None])
                continue
            try:
                out.append([modname, name, attr, _Describer({}).value(value)])
            except Unportable:
                continue
    return out
