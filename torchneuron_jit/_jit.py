"""torchneuron_jit.jit: our own front door.

``jit(fn)`` wraps fn in a ``_C.JitFunction``: a call installs our PEP 523
frame hook (csrc/tracer) for its duration. The hook checks the guards of
fn's entries in C against the frame's arguments; a hit runs the entry's
compiled graph and never evaluates fn's bytecode. A miss runs fn eagerly
under :class:`_Recorder`, a TorchDispatchMode that records every ATen op
with its real inputs and outputs, so the call's result is eager's result;
then the recording becomes a functional ATen graph (make_fx over
functionalize, with the back end's decompositions), the back end compiles
it (backend.compile_inference: fusion, generated kernels, the persistent
artifact cache) and the guards that make it valid are handed to C:

- every argument, by position and path inside lists, tuples and dicts:
  tensors by dtype, device, sizes, strides and requires_grad; numbers,
  strings and None by value; modules by identity;
- modules: each submodule's attributes (its training flag among them),
  parameters, buffers, submodules and hooks, as dict snapshots (O(1) while
  the dict's version tag stands); an attribute no code of the call names,
  only to be there (relax_module_dicts);
- the primitive values of globals and closure cells the traced code reads,
  and the identity of tensors it reads from them;
- grad mode, the default dtype and CPU autocast (on, and its dtype);
- scalars read out of tensors (``item()``, ``bool()``): value guards
  checked after the graph ran; on a mismatch the call takes a side exit
  (the next entry, or a new trace) before anything is written back.

Each entry that can be described without object identities is also
stored in the persistent cache as a trace record (_records.py); a call no
entry accepts looks there before tracing, so a fresh process with a warm
cache neither traces nor lowers.

Mutations of arguments and buffers are written back after every check has
passed. What cannot be compiled (grad mode with tensors needing grad,
data-dependent shapes, hooks, unsupported argument types) gets an entry
that runs eagerly, with one warning naming the reason.
"""
import array
import atexit
import builtins
import collections
import collections.abc
import contextlib
import copy
import ctypes
import dataclasses
import dis
import enum
import functools
import gc
import inspect
import io
import itertools
import operator
import os
import pickle
import re
import random
import secrets
import signal
import sys
import tempfile
import threading
import time
import types
import uuid
import warnings
import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import _C, _dynamic, _fxgate, _log, _manager, _planform, _records, config, gemm
from ._spec import NUMPY_SCALARS, PRIMITIVES, Spec, entry_name, explain, same_value, state_in_dict, tensor_distance, \
    user_attributes
from ._spec import namedtuple_value as _namedtuple
from .graph import CASTS_INSIDE, FAST_PATHS, draws, marked

SUPPORTED_PYTHON = ((3, 11),)
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_CONTAINERS = (tuple, list, dict, set, frozenset)
# held by identity: what a record finds again by name
_DICTS = (dict, collections.OrderedDict)  # guarded by their items (and a Python subclass's attributes)
# the standard library's containers that keep their items in their __dict__: followed as the user's objects are
_STDLIB_CONTAINERS = (collections.UserDict, collections.UserList, collections.ChainMap, weakref.WeakValueDictionary)
# what holds values out of any guard's reach, changed in place (a.coef[0] = 5.0) or through its referent
_OPAQUE_MUTABLE = (array.array, bytearray, collections.deque, weakref.ReferenceType)
_NAMED = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType, _C.JitFunction)
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
# a module's own dicts, which guard_module guards itself
_MODULE_DICTS = frozenset(("_parameters", "_buffers", "_modules") + _HOOK_DICTS)




def _logging_codes():
    import logging
    names = ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log")
    codes = {getattr(logging.Logger, n).__code__ for n in names}
    codes |= {getattr(logging, n).__code__ for n in names if hasattr(getattr(logging, n), "__code__")}
    return frozenset(codes)


_LOGGING_CODES = _logging_codes()
_PRINT = print


# torch's settings of the process a call may set and set back (a scope of float64 around a RoPE table's
# arange): a compiled call skips the calls, and its graph's ops run under the caller's settings. Each by
# what the profile hook sees of it: a Python function's code (a call event), a C function itself (c_call)
_SETTERS = {getattr(f, "__code__", f): f"torch.{name}" for name, f in (
    (n, getattr(torch, n, None)) for n in (
        "set_default_dtype", "set_default_tensor_type", "set_default_device", "set_flush_denormal", "set_num_threads",
        "set_float32_matmul_precision", "use_deterministic_algorithms", "set_deterministic_debug_mode",
        "set_warn_always", "set_printoptions")) if f is not None}
# what a compiled call would skip that makes the call run eagerly (print and logging only warn)
_SKIPPED_WRITES = frozenset(("warnings.warn", "a write to a file", *_SETTERS.values()))


def _skipped_effect(fn):
    """What C function fn, called from traced user code, does that a
    compiled call would skip, as print is: warnings.warn, a write to a file
    (sys.stderr.write, a log's StringIO), one of torch's settings
    (_SETTERS); None for others."""
    if fn is warnings.warn or fn is warnings.warn_explicit:
        return "warnings.warn"
    if fn in _SETTERS:
        return _SETTERS[fn]
    if getattr(fn, "__name__", None) in ("write", "writelines") and isinstance(getattr(fn, "__self__", None),
                                                                               io.IOBase):
        return "a write to a file"
    return None


class _NotCompilable(Exception):
    """The trace is correct Python but no graph of ours can replace it."""


# -- the recorder --------------------------------------------------------------

# Ops tagged dynamic_output_shape whose result's shape follows from their
# arguments' shapes unless an index is a mask (bool or uint8): with integer
# indices, index gathers a shape the indices' shapes fix.
_INDEXING = (torch.ops.aten.index.Tensor,)


def _known_shape(func, args, kwargs):
    """Whether this call of an op tagged as data-dependent had a result
    whose shape its arguments' shapes determine (what it actually did, not
    what the op may do)."""
    if func not in _INDEXING:
        return False
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return all(i is None or (isinstance(i, torch.Tensor) and not i.dtype.is_floating_point
                             and i.dtype not in (torch.bool, torch.uint8)) for i in indices)


# Ops whose results' sizes their tensor arguments' values fix, though no tag says so: packing reads its lengths
_VALUE_SHAPED = (torch.ops.aten._pack_padded_sequence.default,)
# torch's functions that read a tensor argument's values in C++, with no ATen op to record (by name): tensor_split
# of a tensor of indices cuts with plain slices, _pad_packed_sequence fills the lengths it returns in place
_VALUE_READING_CALLS = frozenset(("tensor_split", "_pad_packed_sequence"))
# a tensor's methods that answer what no guard of its checks (its sizes, strides, dtype, device and requires_grad
# are): called by the user's code, a compiled call would answer the traced call's (_outside_source)
_UNGUARDED_READS = frozenset(("data_ptr", "storage_offset", "is_inference", "untyped_storage", "_is_view",
                              "is_shared", "is_pinned"))


# The Python methods of torch.Tensor that read its values without an ATen op, by code
_TENSOR_HASH = torch.Tensor.__hash__.__code__  # id(self): a dict keyed by tensors finds its entry by identity
_VALUE_READERS = {torch.Tensor.__repr__.__code__: "__repr__", torch.Tensor.__format__.__code__: "__format__",
                  torch.Tensor.__array__.__code__: "__array__"}
# torch's RNG seeded or reset by the traced code: a compiled call's random ops draw on from the caller's state
_AUTOCAST_ENTER = torch.amp.autocast_mode.autocast.__enter__.__code__
_RNG_WRITERS = {torch.random.manual_seed.__code__: "torch.manual_seed", torch.random.seed.__code__: "torch.seed",
                torch.random.set_rng_state.__code__: "torch.set_rng_state"}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# torch.compile's wrapper of a function (its code's name and file), and the reads of random's state its frame
# callback makes
_DYNAMO_FILE = os.path.join(_TORCH_DIR, "_dynamo", "eval_frame.py")
_RANDOM_STATE_CODES = (random.Random.getstate.__code__, random.Random.setstate.__code__)
_OWN_DIR = os.path.dirname(__file__) + os.sep
# A pseudo-op of the recorder's: the traced code read the values of its argument (tolist(), str()), which its result
# is a copy of
_VALUES = "values read"


def _needs_grad(args):
    """Whether an op's arguments (tensors, lists of them) hold a tensor that requires grad."""
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)) and _needs_grad(a):
            return True
    return False


_CASTS_INSIDE = frozenset(CASTS_INSIDE.values())


class _Recorder(TorchDispatchMode):
    """Records each ATen op run under it, with its real arguments and results."""

    # torch.cond and the other higher-order ops come here too (else they raise NotImplementedError in the user's
    # call): their Python subgraphs run eagerly, unseen, and the trace says why it cannot be compiled
    supports_higher_order_operators = True

    def __init__(self):
        super().__init__()
        self.ops = []
        # (code, instruction) of the user's line each op that made a tensor was called from (_dynamic.op_site):
        # a symbolic trace of the call must take the same path (_dynamic._same_path)
        self.sites, self.stop = [], None
        self.read_sites = []  # where each value read out of a tensor was read (_dynamic.read_site), in order
        self.problem = None
        self.nested = None  # why: an op made a nested tensor (its variant runs eagerly for every size)
        self.raised = None  # the first op that raised (what the code then did, no graph holds)
        self.inference = torch.is_inference_mode_enabled()  # as the call began
        self.inside = None  # as its ops ran (@torch.inference_mode() switches it on inside the call)
        self.grad, self.autocast = torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")
        # its problem is the call's modes' (grad mode with parameters that require grad), whatever the sizes: the
        # eager variant takes calls of every size (_eager_entry)
        self.any_size = False
        self.fast_half = None  # a fused fast path it ran in float16 or bfloat16 (what a symbolic trace cannot)
        self.skipped_codes = set()  # torch's code a higher-order op ran under this mode (Dynamo skipped it)

    def __enter__(self):
        from .backend import vf_whole
        vf_whole.__enter__()  # nn.GRU, nn.RNN, nn.LSTM, torch.stft: one op each (per time step, frame)
        try:
            return super().__enter__()
        except BaseException:
            vf_whole.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        from .backend import vf_whole
        try:
            return super().__exit__(*exc)
        finally:
            vf_whole.__exit__(None, None, None)
            for code in self.skipped_codes:
                torch._C._dynamo.eval_frame.reset_code(code)  # Dynamo decides afresh (frames of none run now)
            self.skipped_codes.clear()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        # the trace's profile hook (_Trace.profile) is off while this records (its checks and op_site's frame walk
        # made 15,000 hook events of a BERT call's 22,000, 30 ms of its trace), and on while the op runs
        hook = sys.getprofile()
        if not isinstance(getattr(hook, "__self__", None), _Trace):  # none, or another's (a C profiler's object)
            return self._record(func, args, kwargs or {}, None)
        sys.setprofile(None)
        try:
            return self._record(func, args, kwargs or {}, hook)
        finally:
            sys.setprofile(hook)

    @staticmethod
    def _run(hook, func, *args, **kwargs):
        """func(*args, **kwargs) with the trace's profile hook on (what it
        runs is the call's code)."""
        if hook is None:
            return func(*args, **kwargs)
        sys.setprofile(hook)
        try:
            return func(*args, **kwargs)
        finally:
            sys.setprofile(None)

    def _record(self, func, args, kwargs, hook):
        if isinstance(func, torch._ops.HigherOrderOperator):
            # what its subgraphs run is no op of this recording (the mode is off while it runs): the graph would
            # lack them. Whatever the sizes (any_size), as eager runs it
            self.any_size = self.any_size or self.problem is None
            self.problem = self.problem or (f"it calls the higher-order op torch.ops.higher_order.{func.name()}, "
                                            "which jit does not compile (torch.compile(backend='neuron') does)")
            # eager torch.cond runs itself through torch.compile, which skipped its frames for this mode, and marks
            # their code to be skipped for good: every torch.cond after, with no mode, failed in Dynamo
            # ("Unsupported: torch.* op returned non-Tensor"). __exit__ clears the marks
            frame = sys._getframe(2)  # __torch_dispatch__'s caller
            while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
                self.skipped_codes.add(frame.f_code)
                frame = frame.f_back
            return self._run(hook, func, *args, **kwargs)
        inference = torch.is_inference_mode_enabled()
        if inference:
            # is_nonzero of a mask check went into the graph, and its replay failed: every such call ran eagerly
            out = self._run(hook, _dynamic.decomposed, self, func, args, kwargs)
            if out is not NotImplemented:
                return out
        # (autocast reads as off under a dispatch mode, which runs ops with its key excluded: the call's state)
        casts_inside = func in _CASTS_INSIDE and self.autocast
        if casts_inside:
            # the ops it calls inside cast as eager's do, so the traced call's result is eager's; a graph node
            # would run it with autocast off
            self.any_size = self.any_size or self.problem is None
            self.problem = self.problem or (
                f"{func} (nn.TransformerEncoderLayer's fast path) runs under CPU "
                "autocast, which casts inside it where a compiled graph would not")
            torch._C._dispatch_tls_set_dispatch_key_excluded(torch._C.DispatchKey.AutocastCPU, False)
        try:
            out = self._run(hook, func, *args, **kwargs)
        except Exception as exc:  # the input's error: the call raises it, or the code catches it
            if self.raised is None:
                self.raised = f"{func} raised {type(exc).__name__}"
            raise
        finally:
            if casts_inside:
                torch._C._dispatch_tls_set_dispatch_key_excluded(torch._C.DispatchKey.AutocastCPU, True)
        if func in FAST_PATHS and self.fast_half is None and any(
                isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in args):
            self.fast_half = f"{func} in {next(a.dtype for a in args if isinstance(a, torch.Tensor))}"
        if getattr(func, "namespace", None) == "profiler":
            # torch.profiler.record_function's enter and exit (torch.optim's step() runs in one): marks for a
            # profiler, of no value the call computes; its handle, a ScriptObject, is nothing a graph can hold
            return out
        # item() and friends become value guards; other data-dependent ops cannot be replayed
        tags = getattr(func, "tags", ())
        if self.problem is None and func is not torch.ops.aten._local_scalar_dense.default and \
                (torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags or
                 func in _VALUE_SHAPED) and not _known_shape(func, args, kwargs):
            self.problem = f"{func} has a data-dependent result"
        if self.inside is None:
            self.inside = inference
        if self.problem is None and (inference != self.inside or self.inference and not inference):
            # eager's tensors made inside are inference tensors (or not): a compiled call's are as its ops all ran
            # (inference mode switched on before them: the graph runs in it)
            self.problem = "torch.inference_mode is switched inside the traced code"
        if self.problem is None and torch.is_grad_enabled() and _needs_grad(args) and not (
                # CPU autocast casts a parameter with grad mode on, whatever the call's, for its cast cache (and
                # reads as off while it does): autocast on as the call began, or switched on inside it (_Trace.profile)
                func is torch.ops.aten._to_copy.default and not self.grad and self.autocast):
            # the graph is an inference graph: with grad mode on inside the call (torch.enable_grad()) eager's
            # result has an autograd history a compiled call would not make
            self.problem = f"grad mode is on inside the traced code and tensors it uses require grad ({_log.NO_TRAINING})"
            self.any_size = True
        if self.problem is None and any(isinstance(a, torch.UntypedStorage) for a in args):
            # copy.deepcopy of a tensor (dataclasses.asdict makes one) sets a new tensor to a copy of its storage:
            # a storage is no graph constant (its code was not Python: "SyntaxError: invalid syntax")
            self.problem = (f"{func} of a tensor's storage: the traced code copies a tensor with copy.deepcopy "
                            "(dataclasses.asdict does), which jit does not compile (use .clone())")
        if not self.nested and isinstance(out, torch.Tensor) and out.is_nested:
            self.nested = (f"{func} makes a nested tensor (nn.TransformerEncoder's fast path, taken in eval mode "
                           "with a src_key_padding_mask), which jit does not compile; its result keeps 0s at padded "
                           "positions, which the layers' own ops would not (build the encoder with "
                           "enable_nested_tensor=False to compile it)")
        if func is torch.ops.aten.lift_fresh.default:
            # torch.tensor(...): the graph's constant is the tensor as made, before the call writes it (the
            # traced call returns that tensor itself, and the caller may write it too)
            args = (args[0].clone(),)
        self.ops.append((func, args, kwargs, out))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.read_sites.append(_dynamic.read_site())
        if _dynamic.on_path(func, args, out):
            self.sites.append(_dynamic.op_site(self.stop))
        return out


class _Trace:
    """One traced call: built by begin, finished by end."""

    def __init__(self, fn, args, codes, jf=None):
        self.fn = fn
        self.args = args
        self.codes = codes
        self.spec = Spec()
        self.tensor_slot = {}   # id(tensor) -> slot that loads it
        self.tensors = []       # keeps them alive (ids stay unique)
        self.grads = {}         # id(tensor) -> its .grad when guarded (a gradient no guard loads)
        self.problems = []
        self.unguardable = None  # (problem, slot, type) of the first argument value jit cannot guard
        # (slot, words, value) of values inside argument objects that jit cannot guard (a BatchEncoding's
        # Rust encodings): watched while the call runs (watch), the variant runs eagerly if it reads them
        self.unread = []
        self.watched = []  # (object, attribute, its list, the _Watched list in its place)
        self.state = _records.read_state()  # name -> value, each guarded
        if self.state["forward AD level"] >= 0:  # dual tensors: their tangents are no graph's
            self.problems.append("it runs under forward-mode AD (torch.autograd.forward_ad.dual_level)")
        if self.state["Python modes"]:  # their code sees each op eagerly: a compiled call's ops it would not
            self.problems.append(f"it runs under {self.state['Python modes']} (a TorchFunctionMode or "
                                 "TorchDispatchMode), whose code a compiled call would not run")
        self.recorder = _Recorder()
        self.recorder.stop = getattr(fn, "__code__", None)  # op sites are looked for up to the traced frame
        self.inference_inside = False  # its ops all ran in inference mode, switched on inside the call (_prepare)
        self.modules_seen = set()  # ids of the modules guard_module has guarded
        self.classes_seen = set()  # the classes guard_class has guarded
        self.module_paths = {}  # id(module) -> (slot of the module it was reached from, path below that)
        self.argument_guards = 0  # instructions guard_arguments wrote (the record key's part)
        self.opaque = []  # what the guards leave out and a record cannot describe, in words
        self.side_effects = {}  # (file, line) -> "print" or "logging": calls a compiled call skips
        self.prev_profile = None
        # Python state the call may change, as it was before the code that reaches it ran:
        # (words, a function describing it (_state_of), what it said then); compared when the trace ends
        self.before = []
        self.before_seen = set()  # ids of the objects in before, and (id(globals), name) pairs
        self.frames_seen = set()  # code objects whose frame's globals and closure are in before
        self.outside = {}  # (file, line) -> what non-torch source of values the traced code called
        self.content_guards = 0  # containers and objects guard_content has guarded
        self.lenient = []  # (attribute or key, problems) of what modules' attributes hold (guard_content)
        self.content_seen = set()  # ids of what modules' attributes hold that guard_content has guarded
        self.content_reused = set()  # those of them another place holds too, whose guards serve both
        # (slot, object, words) of the objects of library classes modules' attributes hold (a model's config):
        # guard_library_held guards the attributes the traced code names after the trace
        self.library_held = []
        # (slot, value, words) of the classes, functions and Python modules arguments and modules' attributes
        # hold, guarded by identity: guard_named_held guards what they hold after the trace
        self.named_held = []
        self.user_named = None  # user_names()
        self.maybe_read = set()  # (id(globals), name) guarded though the code may not read them (guard_globals)
        self.writes = []  # what the call did that a compiled call cannot (check_writes), in words
        self.jf = weakref.ref(jf) if jf is not None else None  # the JitFunction whose call this is, to publish to
        self.call_args = args  # the arguments before the frame ran (begin copies their containers and objects)
        self.sizes_only = False  # guard_arguments leaves modules' insides out (_note_sizes)
        # argument objects guarded by their attributes (guard_object): (slot, object, its attributes as they
        # were, words); what the call sets on them a compiled call sets too (_graph_of's sets)
        self.objects = []
        self.object_slot = {}  # id(object) -> the slot that loads it first
        self.object_parts = []  # (list or dict, its items as they were, words) inside those objects
        self.part_slot = {}  # id of such a list or dict -> the slot that loads it first
        self.owned = set()  # ids of those objects and containers: check_writes leaves them to _graph_of
        self.inside_object = 0  # guard_value is guarding what such an object holds
        self.list_owner = {}  # id of a list such an object's attribute holds -> (number in objects, attribute)
        self.arg_copies = {}  # id of an argument's object or container -> its copy in call_args (begin)
        self.called_codes = None  # the code objects the call ran (called), made when first asked
        self.functions_seen = set()  # ids of the functions guard_function has guarded
        # identifier strings the arguments, globals and closure variables of user code that reaches globals by
        # a name held as data hold (globals()[NAME], getattr(settings, key)): names it may read (_held_names)
        self.held_names = set()
        self.own_tensor_slots = []  # the first slot of each tensor argument not inside an argument object
        self.hashed = {}  # id -> a tensor user code hashed (SCALE[w], w in seen): its identity decides
        self.by_name_codes = set()  # the user codes that reach globals by name (remember_frame)
        self.in_dynamo = 0  # torch.compile'd calls the traced call is inside
        self.dynamo_ran = False  # it called a torch.compile'd function (relax_module_dicts)
        self.by_name_call = False  # user code called a builtin that reads attributes by name (relax_module_dicts)
        self.module_dicts = []  # the "dict" guards of modules' attributes (guard_module, relax_module_dicts)
        # (slot of a module's __dict__, attribute, first and end instruction, id of the value) of the guards on what
        # a module's attribute holds (a list, a dict, an object of the user's): "nop" where no code names it
        # (relax_module_dicts)
        self.module_held = []

    # -- calls that only tracing runs ---------------------------------------------

    def profile(self, frame, event, arg):
        """sys.setprofile hook while the frame runs: notes print and logging
        calls, calls of non-torch sources of values (random, time, os.environ,
        numpy's RNG, ...) made from user code, and the state each user frame
        can reach as it was before the frame ran."""
        code = frame.f_code
        if code.co_name == "compile_wrapper" and code.co_filename == _DYNAMO_FILE:
            # a torch.compile'd function: Dynamo runs its frames as they are under the recording (their ops
            # recorded), marks their code to be skipped for good (the recorder resets it) and reads random's
            # state at each frame (not the code's)
            self.in_dynamo += 1 if event == "call" else -1 if event == "return" else 0
            self.dynamo_ran = True
        elif event == "call" and self.in_dynamo:
            self.recorder.skipped_codes.add(code)
        if event != "call" and event != "c_call":  # a return (half the events): nothing more to note
            return
        if event == "call" and code in self.by_name_codes:  # each call's: for k in KEYS: helper(k)
            _held_names(self.held_names, _argument_values(frame))
        if event == "call" and code not in self.frames_seen:
            self.frames_seen.add(code)
            try:
                if not _records.library_code(code.co_filename):
                    self.remember_frame(frame)
            except Exception as exc:  # ours: never into the user's code; the variant runs eagerly
                self.problems.append(f"reading the state {code.co_qualname} can reach failed "
                                     f"({type(exc).__name__}: {exc})")
        if event == "call" and code is _TENSOR_HASH and frame.f_back is not None and \
                not _records.library_code(frame.f_back.f_code.co_filename):
            t = frame.f_locals.get("self")
            self.hashed.setdefault(id(t), t)
        if event == "call" and code is _AUTOCAST_ENTER:  # with torch.autocast(...) inside the call
            self.recorder.autocast = True
        if event == "call" and code in _RNG_WRITERS:  # whoever calls it (torch wraps it: the caller's line)
            caller = frame.f_back
            while caller is not None and caller.f_code.co_filename.startswith(_TORCH_DIR):
                caller = caller.f_back
            where = f" at {caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else ""
            self.writes.append(f"it calls {_RNG_WRITERS[code]}{where}, which a compiled call would skip "
                               "(its random ops would draw on from the caller's generator: seed before the call)")
        if event in ("call", "c_call"):  # torch.get_num_threads(): guarded at the value the trace read
            name = _STATE_READS.get(code if event == "call" else arg)  # a C function hashes by identity
            if name is not None and name not in self.state:
                caller = frame.f_back if event == "call" else frame
                if caller is None or not caller.f_code.co_filename.startswith(_OWN_DIR):  # our recorder's
                    self.state[name] = _records.state_reader(name)()
        if (event == "call" and code in _VALUE_READERS) or \
                (event == "c_call" and type(getattr(arg, "__self__", None)) in _TENSOR_TYPES):
            self.note_value_read(frame, event, arg)
        if event == "c_call" and self.recorder.problem is None and getattr(arg, "__name__", None) in \
                _VALUE_READING_CALLS and (isinstance(getattr(arg, "__self__", None), torch.Tensor) or (
                    getattr(arg, "__self__", None) is None and getattr(arg, "__module__", None) == "torch")):
            # torch.tensor_split, x.tensor_split, torch._VF._pad_packed_sequence: no op of the recording reads
            # the values, which the graph would replay from this call
            self.recorder.problem = (f"torch.{arg.__name__} reads a tensor argument's values in C++, which a "
                                     "compiled call would replay from the traced call (a data-dependent result)")
        if event == "c_call":
            if _records.library_code(code.co_filename):  # what library code calls is the library's
                return
            if not self.by_name_call and _by_name_builtin(arg):
                self.by_name_call = True
            what = "print" if arg is _PRINT else _skipped_effect(arg) or _outside_source(arg)
            caller = frame
        elif event == "call":
            if self.in_dynamo and code in _RANDOM_STATE_CODES:
                return
            what = "logging" if code in _LOGGING_CODES else \
                _SETTERS.get(code) or _outside_code(code)
            caller = frame.f_back if what is not None else None  # (f_back makes the caller's frame object)
            if caller is None:
                return
            # through the standard library (os.environ.get is Mapping.get, in _collections_abc)
            while what not in (None, "logging") and caller.f_back is not None and \
                    _records.stdlib_file(caller.f_code.co_filename):
                caller = caller.f_back
        else:
            return
        if what is None:
            return
        filename = caller.f_code.co_filename
        if caller.f_code in _LOGGING_CODES or _records.library_code(filename):
            return
        if what in ("print", "logging"):
            self.side_effects.setdefault((filename, caller.f_lineno), what)
        elif what in _SKIPPED_WRITES:  # an error filter, a log the user reads, torch's settings: eager
            self.writes.append(f"it calls {what} at {filename}:{caller.f_lineno}, which a compiled call would skip")
        else:
            self.outside.setdefault((filename, caller.f_lineno), what)

    def note_value_read(self, frame, event, arg):
        """A tensor's values read in Python without an ATen op (tolist(),
        str(), format(), numpy()): tolist and the strings become a value
        check of the graph, as item() is (the tensor as read, compared
        byte for byte after the graph ran); numpy() shares the tensor's
        memory, whose reads and writes no graph replays: the variant runs
        eagerly."""
        if event == "c_call":
            t, name = arg.__self__, getattr(arg, "__name__", None)
            if name not in ("tolist", "numpy"):
                return
            caller = frame
        else:
            name = _VALUE_READERS[frame.f_code]
            t, caller = frame.f_locals.get("self"), frame.f_back
        if not isinstance(t, torch.Tensor) or isinstance(t, torch._subclasses.FakeTensor):
            return
        if name in ("numpy", "__array__"):
            where = f" at {caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else ""
            self.problems.append(f"it reads a tensor's memory through numpy(){where}, which a compiled call would "
                                 "not replay (convert to numpy outside the jitted function)")
            return
        if name in ("__repr__", "__format__"):  # str(x), f"{x}": the string torch's print options make
            self.state.setdefault("torch print options", _records.print_options())
        with torch.utils._python_dispatch._disable_current_modes():
            self.recorder.ops.append((_VALUES, (t,), {}, t.detach().clone()))

    # -- Python state the call may write ------------------------------------------

    def remember(self, words, value):
        """Notes value (reached by words) and its state now, once per object,
        when it is something a call can change in place (a tensor: its
        Python attributes, x.tag = ..., which no graph sets)."""
        if type(value) in _TENSOR_TYPES:
            if ("data", id(value)) not in self.before_seen:  # x.data = y, x.set_(...): no graph rebinds an argument
                self.before_seen.add(("data", id(value)))
                describe = functools.partial(_tensor_binding, value)
                self.before.append((words, describe, describe()))
            words, value = f"{words}'s attributes", value.__dict__
        elif type(value) in (list, tuple, dict):  # the tensors it holds, as above
            for k, item in (value.items() if type(value) is dict else enumerate(value)):
                if type(item) in _TENSOR_TYPES:
                    self.remember(f"{words}[{k!r}]", item)
        elif type(value) in (types.MethodType, types.BuiltinMethodType) and \
                not isinstance(value.__self__, (types.ModuleType, type(None))):
            # LOG_APPEND = LOG.append: what the call changes is its object
            self.remember(f"{words}.__self__", value.__self__)
        if id(value) in self.before_seen or id(value) in self.owned or not _mutable(value):
            return
        self.before_seen.add(id(value))
        # an argument object's state is _graph_of's to compare (what the call sets, a compiled call sets)
        describe = functools.partial(_state_of, value, opaque=frozenset(self.owned))
        self.before.append((words, describe, describe()))

    def remember_module(self, module, names):
        """Notes the attributes names of a module or class of the user's
        (the code that reads settings.SCALE may assign it too) and what
        they hold."""
        d = module.__dict__
        for attr in names:
            if attr in d and (id(d), attr) not in self.before_seen:
                self.before_seen.add((id(d), attr))
                describe = functools.partial(_attribute_state, d, attr)
                self.before.append((f"{module.__name__}.{attr}", describe, describe()))
                self.remember(f"{module.__name__}.{attr}", d[attr])

    def remember_frame(self, frame):
        """The globals a user frame's code loads and its closure variables,
        before the frame runs."""
        code, globs = frame.f_code, frame.f_globals
        loads = _global_loads(code)
        if not self.by_name_call and any(_by_name_reader(globs.get(n)) for n in loads) or \
                any(_by_name_reader(frame.f_locals.get(n)) for n in code.co_freevars):
            self.by_name_call = True  # GA = getattr; GA(self, k) (relax_module_dicts)
        if _reaches_by_name(code):
            self.by_name_codes.add(code)
            _held_names(self.held_names, itertools.chain(_argument_values(frame), (
                globs[n] for n in loads if n in globs), (frame.f_locals.get(n) for n in code.co_freevars)))
        # and names written another way (globals()["N"] += 1, setattr(sys.modules[__name__], "N", ...)): any
        # string constant or attribute name of the code that names a global, as guard_globals reads them
        for name in loads + tuple(n for n in _by_name(code, self.held_names) if n in globs and n not in loads):
            if name in globs and (id(globs), name) not in self.before_seen:
                self.before_seen.add((id(globs), name))
                self.remember(f"global {name}", globs[name])
                # the binding itself (globals()["N"] += 1 rebinds N with no STORE_GLOBAL of the code's)
                describe = functools.partial(_global_binding, globs, name)
                self.before.append((f"global {name}", describe, describe()))
            if name in globs and (_user_module(globs[name]) or _user_class(globs[name])):
                # Stats.calls += 1: the attributes this frame's code names (another frame's named others)
                self.remember_module(globs[name], code.co_names)
        arguments = code.co_argcount + code.co_kwonlyargcount
        if arguments and any(n in code.co_varnames[:arguments] for n in ("cls", "self")):
            # a class method's cls.n += 1, a method's type(self).calls += 1: the attributes its code names
            local = frame.f_locals
            for name in ("cls", "self"):
                value = local.get(name)
                cls = value if isinstance(value, type) else type(value)
                if name in code.co_varnames[:arguments] and _user_class(cls):
                    self.remember_module(cls, code.co_names)
        fn = _function_of(frame) if arguments else None
        if fn is not None:  # def bump(state=[0]): state[0] += 1 writes what every call's default is
            defaults = fn.__defaults__ or ()
            names = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount]
            for name, value in itertools.chain(zip(names, defaults), (fn.__kwdefaults__ or {}).items()):
                self.remember(f"the default of {code.co_qualname}'s argument {name}", value)
        if code.co_freevars:
            local = frame.f_locals
            for name in code.co_freevars:
                if name in local:
                    self.remember(f"closure variable {name}", local[name])
                    if _user_class(local[name]):
                        self.remember_module(local[name], code.co_names)

    def check_writes(self):
        """Problems for what the traced call wrote that outlives it: the state
        remembered before (globals, closure variables, arguments and what
        they hold) compared with the state now, and assignments to globals
        and to closure variables the call does not own, with file and line.
        A compiled call would skip each of them."""
        now = _records.read_state()
        now.update((name, _records.state_reader(name)()) for name in self.state.keys() - now.keys())
        for name in now.keys() | self.state.keys():  # torch.set_grad_enabled(False) left set by the call
            if now.get(name) != self.state.get(name):
                self.writes.append(f"it sets torch's {name} ({self.state.get(name)} → {now.get(name)}) during the "
                                   "call, which a compiled call would skip (set it around the call, or inside "
                                   "a with block)")
                break
        for t in self.tensors:
            if _grad_of(t) is not self.grads.get(id(t)):
                self.writes.append(f"it sets {self.spec.names[self.tensor_slot[id(t)]]}.grad during the call, which "
                                   "a compiled call would skip (training steps go through torch.compile for now)")
                break
        for code, what, line in _rebindings([c for c, _ in self.codes])[:1]:  # its words name the line
            self.writes.append(f"it assigns {what} at {code.co_filename}:{line}, which a compiled call would skip "
                               "(return the new value instead)")
        for words, describe, was in self.before:
            change = _state_change(words, was, describe())
            if change is not None:
                where = _write_sites([c for c, _ in self.codes])
                self.writes.append(f"it writes {change} during the call{where}, which a compiled call would "
                                   "skip (return the new value instead, or pass the state in as a tensor)")
                break
        modules = [m for a in self.args if isinstance(a, torch.nn.Module) for m in a.modules()]
        for (filename, line), name in list(_unguarded_attributes([c for c, _ in self.codes], modules).items())[:1]:
            self.writes.append(f"it reads .{name} at {filename}:{line}, which no guard checks (a tensor's "
                               f"{'version counter' if name == '_version' else 'view base'}): a compiled call "
                               "would keep the traced call's")
        self.outside.update(_outside_globals(self.codes))
        for (filename, line), what in list(self.outside.items())[:1]:
            self.writes.append(f"it calls {what} at {filename}:{line}, whose result a compiled call would keep "
                               "from the traced call (pass the value in as an argument)")
        self.problems.extend(self.writes[:1])

    # -- guards on arguments ---------------------------------------------------

    def guard_value(self, slot, value, name):
        spec = self.spec
        t = type(value)
        if t in _TENSOR_TYPES:
            if value.is_nested:  # the words of its eager variant (guarding its sizes fails after, as before)
                self.problems.append(f"{name} is a nested tensor; only dense CPU tensors of plain dtypes are compiled")
            elif not value.is_cpu or value.layout != torch.strided or value.is_quantized:
                what = f"a quantized ({value.dtype})" if value.is_quantized else f"a {value.device} {value.layout}"
                self.problems.append(f"{name} is {what} tensor; only dense CPU tensors of plain dtypes are compiled")
            attrs = user_attributes(value)
            if attrs:  # x.scale = ... set by the caller, which the code may read
                self.problems.append(f"{name} has Python attributes ({', '.join(attrs)}), which jit does not guard")
            spec.add(("type", slot, t), name)
            spec.add(("tensor", slot, value.dtype, tuple(value.shape), tuple(value.stride()),
                      bool(value.requires_grad)), name)
            if not marked(value):  # a compiled graph's kernels read memory: a marked tensor takes another path
                spec.add(("plain", slot), name)
            if not attrs:  # one the caller sets later (x.scale = 2.0) the code may read
                spec.add(("bare", slot), name)
            first = self.tensor_slot.setdefault(id(value), slot)
            if first != slot:  # one tensor passed twice: the graph reads it once, for both
                spec.add(("same", slot, first), name)
            elif not self.inside_object:  # one of an argument object is its object's (guard_distinct)
                self.own_tensor_slots.append(slot)
            self.tensors.append(value)
            self.grads.setdefault(id(value), _grad_of(value))
        elif t is bool or value is None:
            spec.add(("is", slot, value), name)
        elif t in PRIMITIVES or _by_value(value):
            spec.add(("eq", slot, value), name)
        elif t in (list, tuple, torch.Size) or _namedtuple(value):
            spec.add(("type", slot, t), name)  # a NamedTuple (a PackedSequence) by its class and items
            if t is list and self.inside_object:  # the call may append to it
                self.own(value, list(value), name, slot)
            mark = len(spec), len(self.unread)
            spec.add(("len", slot, len(value)), name)
            for k, item in enumerate(value):
                self.guard_value(spec.add(("item", slot, k), f"{name}[{k}]"), item, f"{name}[{k}]")
            if value and t is list and len(self.unread) - mark[1] == len(value):
                # every item one jit cannot guard (a BatchEncoding's encodings, one per sequence): the list is
                # watched instead (watch), and neither its length nor its items are guarded
                del spec[mark[0]:], spec.names[mark[0]:], self.unread[mark[1]:]
                self.unread.append((slot, name, value))
        elif t is dict:
            spec.add(("type", slot, t), name)
            spec.add(("len", slot, len(value), tuple(value)), name)  # in order: code may iterate it
            if self.inside_object:
                self.own(value, dict(value), name, slot)
            for k, item in value.items():
                if type(k) not in (str, int):
                    self.problems.append(f"{name} has a key of type {type(k).__name__}")
                    continue
                self.guard_value(spec.add(("key", slot, k), f"{name}[{k!r}]"), item, f"{name}[{k!r}]")
        elif isinstance(value, torch.nn.Module):
            # weakly: a jitted function does not keep the modules passed to it alive
            spec.add(("isweak", slot, weakref.ref(value)), name)
            if not self.sizes_only:
                self.guard_module(value, name, slot)
        elif isinstance(value, _NAMED):
            spec.add(("is", slot, value), name)
            if not self.sizes_only:  # what it holds (cls.k, a module's SCALE, a helper's closure) as well
                self.named_held.append((slot, value, name))
        elif _dynamic.plain_object(value):
            self.guard_object(slot, value, name)
        elif _model_output(value):
            # a transformers ModelOutput (encoder_outputs of an encoder-decoder's generate()): an OrderedDict
            # and a dataclass, read as either; its items as a dict's, in order, and its attributes as an object's
            spec.add(("type", slot, t), name)
            self.guard_entries(slot, value, name, lambda k: f"{name}[{k!r}]")
            self.guard_entries(spec.add(("attrs", slot), f"{name}.__dict__"), vars(value), f"{name}'s attributes",
                               lambda k: f"{name}.{k}")
        else:
            spec.add(("type", slot, t), name)
            if self.inside_object:  # a list attribute of an argument object holds it: watch may do
                self.unread.append((slot, name, value))
            else:
                self.unguardable_value(slot, name, t)

    def unguardable_value(self, slot, name, t):
        self.problems.append(f"{name} is a {t.__qualname__}: jit guards tensors, numbers, strings, None, "
                             "lists, tuples and dicts of them, modules, and objects of Python classes "
                             "holding those")
        if self.unguardable is None:
            self.unguardable = (self.problems[-1], slot, t)

    def watch(self):
        """Puts a _Watched list in place of each list attribute of an
        argument object whose items jit cannot guard (a tokenizer's
        BatchEncoding holds its Rust encodings so; the model reads its
        tensors): they are the graph's business only if the call reads
        them, which the list notes. Other such values are unguardable."""
        owners = {slot: obj for slot, obj, _, _ in self.objects}
        spec = self.spec
        for slot, name, value in self.unread:
            attrs = spec[slot][1] if type(value) is list and spec[slot][0] == "key" else None
            obj = owners.get(spec[attrs][1]) if attrs is not None and spec[attrs][0] == "attrs" else None
            if obj is None or vars(obj).get(spec[slot][2]) is not value:
                self.unguardable_value(slot, name, type(value))
                continue
            watched = _Watched(value)
            watched.words = f"{name}, whose items are {type(value[0]).__qualname__}s"
            vars(obj)[spec[slot][2]] = watched
            self.watched.append((obj, spec[slot][2], value, watched))

    def unwatch(self):
        """Puts back the lists watch replaced (with what the call left in
        them); a read of one is a problem of the variant."""
        for obj, attr, original, watched in self.watched:
            if vars(obj).get(attr) is watched:
                vars(obj)[attr] = original
            if watched.read:
                original[:] = list.copy(watched)  # what the call appended, as eager leaves it
                self.problems.append(f"it reads {watched.words} that jit cannot guard (pass what the function "
                                     "needs as tensors)")
        self.watched = []

    def guard_object(self, slot, value, name):
        """An argument's object of a Python class (a transformers
        DynamicCache): its type and class, and each attribute as an
        argument's value (tensors are graph inputs), the attributes' names
        in order. Not by identity: a generation loop passes a new cache
        to each generate(). What the call sets on it, a compiled call sets
        (_graph_of); a list or dict inside it must stay as it was."""
        spec, t = self.spec, type(value)
        spec.add(("type", slot, t), name)
        first = self.object_slot.setdefault(id(value), slot)
        if first != slot:  # one object reached twice (a layer that refers to its cache): the same again
            spec.add(("same", slot, first), name)
            return
        if len(self.objects) >= _MAX_OBJECTS or not self.inside_object and \
                next(itertools.islice(_dynamic.held_values(value), _MAX_HELD, None), None) is not None:
            self.problems.append(f"{name} holds more than {_MAX_OBJECTS} objects or {_MAX_HELD} values, which "
                                 "jit does not guard one by one (pass what the function needs as arguments)")
            return
        if not self.sizes_only:  # a miss's sizes need none of it (_note_sizes: on every call while a build runs)
            self.guard_classes(t)
        attrs = vars(value)
        self.objects.append((slot, value, dict(attrs), name))
        self.owned.add(id(value))
        for k, item in attrs.items():
            if type(item) in (list, dict):  # the call may append objects to it (a DynamicCache's layers)
                self.list_owner.setdefault(id(item), (len(self.objects) - 1, k))  # or set items
        self.inside_object += 1
        try:
            self.guard_entries(spec.add(("attrs", slot), f"{name}.__dict__"), attrs, f"{name}'s attributes",
                               lambda k: f"{name}.{k}")
        finally:
            self.inside_object -= 1

    def guard_entries(self, slot, entries, name, words):
        """The keys of dict entries (loaded at slot), in order (code may
        iterate it), and each value as an argument's (words(key) names it)."""
        spec = self.spec
        spec.add(("len", slot, len(entries), tuple(entries)), name)
        for k, item in list(entries.items()):
            self.guard_value(spec.add(("key", slot, k), words(k)), item, words(k))

    def own(self, container, items, name, slot):
        """Notes a list or dict inside an argument object (loaded at slot),
        as it is: the call may not change it (_graph_of). One reached
        twice is guarded to be one again."""
        first = self.part_slot.setdefault(id(container), slot)
        if first != slot:
            self.spec.add(("same", slot, first), name)
        if id(container) not in self.owned:
            self.owned.add(id(container))
            self.object_parts.append((container, items, name))

    def guard_distinct(self):
        """Guards the argument objects, and the lists and dicts they hold,
        to be as many different ones as in the trace: where the call sets
        an attribute of one, a call that passes it twice (or shares a
        layer between two caches) reads at the other place what the first
        set, where the traced call read the value from before."""
        slots = sorted([slot for slot, _, _, _ in self.objects] + list(self.part_slot.values()))
        if len(slots) > 1:
            self.spec.add(("distinct", tuple(slots)), "the argument objects the call sets attributes on, "
                          "and the others")

    def guard_module(self, module, name, slot):
        """Guards module (loaded at slot) and its submodules: their dicts as
        snapshots; their parameters, buffers and tensor attributes get slots."""
        hooks = torch.nn.modules.module
        for hook_dict in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks"):
            d = getattr(hooks, hook_dict, None)
            if isinstance(d, dict):
                self.guard_dict(d, f"torch.nn.modules.module.{hook_dict}", ("global", hooks.__name__, hook_dict))
                if d:
                    self.problems.append("global module hooks are registered")
        for sub_name, sub in module.named_modules():
            qual = f"{name}.{sub_name}" if sub_name else name
            if id(sub) in self.modules_seen:
                continue
            self.modules_seen.add(id(sub))
            self.module_paths[id(sub)] = (slot, sub_name)
            self.guard_classes(type(sub))
            attrs = sub.__dict__
            d = self.guard_dict(attrs, qual, ("module", slot, sub_name, "__dict__"))
            relaxable = _relaxable(type(sub))
            if relaxable:
                self.module_dicts.append(len(self.spec) - 1)
            for key, v in list(attrs.items()):  # self.cfg["scale"] = 2.0 after the trace: a miss
                if key in _MODULE_DICTS:
                    continue
                if id(v) in self.content_seen:
                    self.content_reused.add(id(v))
                    continue
                if _held_state(v):
                    self.content_seen.add(id(v))
                    start = len(self.spec)
                    self.guard_content(self.spec.add(("key", d, key), f"{qual}.{key}"), v, f"{qual}.{key}",
                                       lenient=True, key=key)
                    if relaxable:
                        self.module_held.append((d, key, start, len(self.spec), id(v)))
                elif _library_object(v):
                    self.content_seen.add(id(v))
                    self.library_held.append((self.spec.add(("key", d, key), f"{qual}.{key}"), v, f"{qual}.{key}"))
                elif isinstance(v, _NAMED):  # self.cfg = Settings (a class), self.act = helper
                    self.content_seen.add(id(v))
                    self.named_held.append((self.spec.add(("key", d, key), f"{qual}.{key}"), v, f"{qual}.{key}"))
                elif hasattr(type(v), "__array_interface__") or isinstance(v, _OPAQUE_MUTABLE):
                    # a numpy array, an array.array: memory no guard reads; a weakref: what it refers to
                    self.lenient.append((key, [
                        f"{qual}.{key} is a weak reference, whose referent jit cannot guard (hold the object itself)"
                        if isinstance(v, weakref.ReferenceType) else f"{qual}.{key} is a {type(v).__qualname__}, "
                        "whose contents jit cannot guard (hold it as a tensor: register_buffer)"]))
            for attr in ("_parameters", "_buffers", "_modules"):
                self.guard_dict(attrs[attr], f"{qual}.{attr}", ("module", slot, sub_name, attr))
            for attr in _HOOK_DICTS:
                d = attrs.get(attr)
                if isinstance(d, dict):
                    hooks = self.guard_dict(d, f"{qual}.{attr}", ("module", slot, sub_name, attr))
                    for key, hook in list(d.items()):  # what a hook holds: a closure's list, its object's flag
                        at = f"{qual}.{attr}[{key}]"
                        if type(hook) is types.FunctionType:
                            self.named_held.append((self.spec.add(("key", hooks, key), at), hook, at))
                        elif _content_guarded(hook) and id(hook) in self.content_seen:
                            self.content_reused.add(id(hook))
                        elif _content_guarded(hook):
                            self.content_seen.add(id(hook))
                            self.guard_content(self.spec.add(("key", hooks, key), at), hook, at, lenient=True)
            for attr in ("_parameters", "_buffers", "__dict__"):
                d = attrs if attr == "__dict__" else attrs[attr]
                for key, t in d.items():
                    if type(t) in _TENSOR_TYPES:
                        self.param_slot(d, key, t, f"{qual}.{key}", ("module", slot, sub_name, attr))

    def guard_classes(self, cls):
        """Snapshots of the dicts of cls and its bases (but object), and of
        its metaclass's if the user's (an installed distribution's: its
        primitives, guard_distribution_class): a method or class attribute
        replaced after the trace is a miss. A tool that
        patches a class for a while (make_fx patches nn.Module) costs one
        full comparison once it has put the attribute back."""
        meta = type(cls)  # Registry.scale may be its metaclass's attribute
        for c in cls.__mro__[:-1] + (meta.__mro__[:-2] if meta is not type else ()):
            if c in self.classes_seen:
                continue
            self.classes_seen.add(c)
            if _library_class(c):
                if _records.distribution_code(_defined_in(c)):
                    self.guard_distribution_class(c)
            else:
                d = _C.class_dict(c)
                slot = self.guard_dict(d, f"class {c.__qualname__}", ("classdict", c))
                for k, v in list(d.items()):  # a list or dict a class attribute holds, changed in place
                    if type(k) is str and not (k.startswith("__") and k.endswith("__")) and \
                            (type(v) in (list, dict, set) or _dynamic.plain_object(v)):
                        words = f"{c.__qualname__}.{k}"
                        self.guard_content(self.spec.add(("key", slot, k), words), v, words, lenient=True, key=k)

    def guard_distribution_class(self, c):
        """The numbers, strings, flags and Nones among the attributes of
        class c of an installed distribution (not torch's), by value, and
        its functions by identity, as guard_distribution_globals does its
        globals: a team's package installed with pip had Head.temperature =
        0.1 set at run time and answered with 1.0; LlamaMLP.forward patched
        in a notebook cell kept the old method's answer. Its other
        attributes are its own objects."""
        d = _C.class_dict(c)
        keys = tuple(k for k, v in d.items() if type(k) is str and (
            (not k.startswith("__") and type(v) in PRIMITIVES) or _function_or_class(v)))
        if keys:
            slot = self.spec.add(("const", d), f"class {c.__qualname__}", ("classdict", c))
            self.spec.add(("dict", slot, keys, tuple(d[k] for k in keys), False), f"class {c.__qualname__}")

    def guard_dict(self, d, name, path=None):
        """A snapshot of dict d (found by path in another process): every
        key, its value by identity (or, for primitives, by value)."""
        keys = tuple(d.keys())
        slot = self.spec.add(("const", d), name, path)
        self.spec.add(("dict", slot, keys, tuple(d[k] for k in keys), True), name)
        return slot

    def param_slot(self, d, key, tensor, name, path):
        """A slot loading tensor from dict d (a module's parameters, buffers or
        attributes), for the graph to take it as an input, guarded as a
        tensor argument is: model.half() and p.data = ... keep the
        Parameter and change its dtype or sizes in place, which the code may
        read (h.to(self.weight.dtype)) and the graph was traced for."""
        slot = self.spec.add(("key", self.spec.add(("const", d), name, path), key), name)
        if id(tensor) in self.tensor_slot:  # a global or another module's too: the graph reads one input for both
            self.spec.add(("same", slot, self.tensor_slot[id(tensor)]), name)
            return
        self.tensor_slot[id(tensor)] = self.tensor_guard(slot, tensor, name)
        self.tensors.append(tensor)
        self.grads.setdefault(id(tensor), _grad_of(tensor))

    def tensor_guard(self, slot, tensor, words):
        """slot, with a guard that the tensor it loads is as tensor is now:
        dtype, sizes, strides and requires_grad, which requires_grad_(),
        resize_() and set_() change in place (a global's, or one a container
        holds: the guard on its identity holds)."""
        self.spec.add(("tensor", slot, tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()),
                       bool(tensor.requires_grad)), words)
        return slot

    def guard_arguments(self):
        code = self.fn.__code__
        names = code.co_varnames[:len(self.args)]
        # *args and **kwargs are made for the call: what the caller passed in them is its
        varargs = code.co_argcount + code.co_kwonlyargcount if code.co_flags & inspect.CO_VARARGS else -1
        varkw = code.co_argcount + code.co_kwonlyargcount + (varargs >= 0) \
            if code.co_flags & inspect.CO_VARKEYWORDS else -1
        for i, (name, value) in enumerate(zip(names, self.args)):
            first = len(self.spec)
            self.guard_value(self.spec.add(("arg", i), name), value, name)
            if i == varargs and type(value) is tuple:
                self.name_varargs(first, name, _wrapped_parameters(self.fn))
            if self.sizes_only:  # what the call may write: a trace's (the state before it ran)
                continue
            if i == varargs and type(value) is tuple:
                for k, item in enumerate(value):
                    self.remember(f"argument {name}[{k}]", item)
            elif i == varkw and type(value) is dict:
                for k, item in value.items():
                    self.remember(f"argument {name}[{k!r}]", item)
            else:
                self.remember(f"argument {name}", value)
        slots = list(self.own_tensor_slots)
        for k, name, cell, value in _closure_cells(self.fn):
            if isinstance(value, PRIMITIVES + _NAMED + (torch.nn.Module,)) or type(value) in _TENSOR_TYPES or \
                    _by_value(value) or type(value) is torch.Size:
                c = self.spec.add(("const", cell), name, ("closure", k))
                self.guard_value(self.spec.add(("cell", c), name), value, name)
        # as many different tensors as in the trace (code may ask `q is kv`; one passed twice is "same")
        if len(slots) > 1:
            self.spec.add(("distinct", tuple(slots)), "the tensor arguments (one passed where the trace had two)")
        self.argument_guards = len(self.spec)

    def name_varargs(self, first, name, parameters):
        """The words of the guards from slot first on that name item k of
        *args (name[k]) say parameters[k] instead: transformers' decorators
        wrap forward in (self, *args, **kwargs), and model(input_ids) was
        "args[0]" in guards, misses and storm words."""
        names = self.spec.names
        for slot in range(first, len(names)):
            words = names[slot]
            for k, parameter in enumerate(parameters):
                prefix = f"{name}[{k}]"
                if words.startswith(prefix):
                    names[slot] = parameter + words[len(prefix):]
                    break

    def guard_closure(self):
        """The contents of the containers and objects fn's closure variables
        hold (after the trace: what it read), by content (guard_content),
        and what the functions it called hold (guard_function)."""
        for k, name, cell, value in _closure_cells(self.fn):
            if _content_guarded(value) or self.called(value):  # a helper it called: what that holds too
                name = f"closure {name}"
                c = self.spec.add(("const", cell), name, ("closure", k))
                guard = self.guard_function if self.called(value) else self.guard_content
                guard(self.spec.add(("cell", c), name), value, name)

    def guard_content(self, slot, value, words, depth=0, lenient=False, key=None):
        """Guards what value (loaded at slot) holds, so that a change to it
        after the trace is a miss in words (global CFG['scale']: 2.0 → 5.0):
        a dict by a snapshot (O(1) while its version tag stands), a list item
        by item, a set by value, a plain object by its __dict__ and its
        class; containers and objects inside them the same way, to depth
        _MAX_DEPTH. Tensors, numbers, strings, functions, classes and modules
        inside are held by identity or value. What cannot be guarded so
        (an object without a __dict__, too deep, too large) is a problem:
        the variant runs eagerly; lenient (what a module's attributes hold):
        it stays held as it was (by identity), and the variant compiles,
        unless the traced code names key, the attribute or key that holds
        value (check_lenient)."""
        spec, t = self.spec, type(value)
        self.content_guards += 1
        problems = [] if lenient else self.problems
        if lenient and isinstance(key, str):
            self.lenient.append((key, problems))
        if depth > _MAX_DEPTH or self.content_guards > _MAX_CONTENT:
            problems.append(f"{words} holds state nested deeper than {_MAX_DEPTH} or larger than {_MAX_CONTENT} "
                            "values, which jit does not guard (pass what the function needs as arguments)")
            return
        if isinstance(value, torch.nn.Module):
            spec.add(("is", slot, value), words)
            self.guard_module(value, words, slot)
            return
        if isinstance(value, type):
            self.guard_classes(value)
            return
        if t is types.MethodType:
            # a bound method (@torch.no_grad()'s wrapper holds its context's clone): its function and object are
            # the method's for good; a user's object by its content too
            spec.add(("is", slot, value), words)
            owner = value.__self__
            if _content_guarded(owner) and not _library_class(type(owner)):
                self.guard_content(spec.add(("const", owner), f"{words}.__self__"), owner, f"{words}.__self__",
                                   depth + 1, lenient, key)
            return
        if isinstance(value, dict) and (t in _DICTS or state_in_dict(t, _DICTS)):
            # a subclass of the user's: its items, its class, and its attributes where it may have any (none yet
            # too: SD.mult = 3.0 that its __getitem__ reads answered with its class's mult)
            spec.add(("type", slot, t), words)
            keys = tuple(dict.keys(value))  # as stored: a subclass's __iter__ or __getitem__ may differ
            spec.add(("dict", slot, keys, tuple(dict.__getitem__(value, k) for k in keys), True), words + "[...]")
            for k in keys:
                item = dict.__getitem__(value, k)
                if _content_guarded(item):
                    self.guard_content(spec.add(("key", slot, k), f"{words}[{k!r}]"), item, f"{words}[{k!r}]",
                                       depth + 1, lenient, k)
            if t not in _DICTS and getattr(value, "__dict__", None) is not None:
                self.guard_attributes(slot, value, words, depth, lenient)
        elif t is list:
            spec.add(("type", slot, list), words)
            spec.add(("len", slot, len(value)), words)
            for k, item in enumerate(value):
                s = spec.add(("item", slot, k), f"{words}[{k}]")
                if type(item) in PRIMITIVES:
                    self.guard_value(s, item, f"{words}[{k}]")
                else:
                    spec.add(("is", s, item), f"{words}[{k}]")
                    if _content_guarded(item):
                        self.guard_content(s, item, f"{words}[{k}]", depth + 1, lenient, key)
        elif t is tuple or _namedtuple(value):  # HP = Hparams(2.0, 1.0): its items, as a tuple's
            for k, item in enumerate(value):
                if _content_guarded(item):
                    self.guard_content(spec.add(("item", slot, k), f"{words}[{k}]"), item, f"{words}[{k}]", depth + 1,
                                       lenient, key)
        elif t in (set, frozenset):
            if not all(type(v) in PRIMITIVES for v in value):
                problems.append(f"{words} is a set of other values than numbers and strings, which jit does "
                                "not guard")
            elif t is set:
                spec.add(("eq", slot, set(value)), words)
        elif t is functools.partial:
            # act = partial(F.leaky_relu, negative_slope=0.2): its function, arguments and keywords (its own
            # attributes, which no code of torch's reads, aside)
            spec.add(("type", slot, t), words)
            func = spec.add(("func", slot, "partial_func"), f"{words}.func")
            self.guard_held(func, value.func, f"{words}.func")
            if self.called(value.func):
                self.guard_function(func, value.func, f"{words}.func")
            self.guard_held(spec.add(("func", slot, "partial_args"), f"{words}.args"), value.args, f"{words}.args")
            self.guard_held(spec.add(("func", slot, "partial_keywords"), f"{words}.keywords"), value.keywords,
                            f"{words}.keywords")
        elif t is functools._lru_cache_wrapper:
            # @lru_cache def alibi_slopes(n): it answers from its cache, as eagerly, or runs the function it
            # wraps (its __dict__'s __wrapped__: guarded as a function the call ran, where it ran)
            spec.add(("type", slot, t), words)
            self.guard_attributes(slot, value, words, depth, lenient)
            if self.called(value.__wrapped__):
                d = spec.add(("const", value.__dict__), f"{words}.__dict__", ("objdict", slot))
                self.guard_function(spec.add(("key", d, "__wrapped__"), f"{words}.__wrapped__"), value.__wrapped__,
                                    f"{words}.__wrapped__")
        elif isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, _NAMED) and \
                state_in_dict(t):
            spec.add(("type", slot, t), words)
            self.guard_attributes(slot, value, words, depth, lenient)
        elif not isinstance(value, BaseException):
            # slots, a C type's fields, a dict subclass of a library's: state outside any __dict__. An exception
            # to raise (raise ERR on a branch the call did not take: one it took raised, and made no variant) is
            # held by identity
            problems.append(f"{words} is a {t.__qualname__}, whose contents jit cannot guard (pass what the "
                            "function needs from it as an argument)")

    def guard_hashed(self):
        """The tensors user code hashed (SCALE[w] with SCALE a dict keyed by
        tensors, w in seen) that guards load, by identity, weakly: what it
        found depends on which object it was (a tensor's hash is its id)."""
        for t in self.hashed.values():
            slot = self.tensor_slot.get(id(t))
            if slot is not None:
                self.spec.add(("isweak", slot, weakref.ref(t)), f"{self.spec.names[slot]} (hashed: a dict or set "
                              "keyed by tensors looks it up by identity)")

    def guard_tensor_attributes(self, tensors):
        """The Python attributes of the tensors among tensors that guards
        load (parameters, buffers, globals), where user code names one
        (self.w.scale, a flag on a buffer): a snapshot of the tensor's
        __dict__. An argument's make the call eager (guard_value)."""
        names = None
        for t in {id(t): t for t in tensors}.values():
            slot = self.tensor_slot.get(id(t))
            if slot is None or not user_attributes(t):
                continue
            if names is None:
                names = _names_in([c for c, _ in self.codes if not _records.library_code(c.co_filename)])
            if names.isdisjoint(user_attributes(t)):
                continue
            if id(t.__dict__) in self.content_seen:
                self.content_reused.add(id(t.__dict__))
                continue
            self.content_seen.add(id(t.__dict__))
            attrs, words = t.__dict__, self.spec.names[slot]
            d = self.spec.add(("const", attrs), f"{words}.__dict__", ("objdict", slot))
            keys = tuple(attrs)
            self.spec.add(("dict", d, keys, tuple(attrs[k] for k in keys), True), f"{words}'s attributes")

    def guard_attributes(self, slot, value, words, depth, lenient):
        """guard_content's part for an object's __dict__ (its type guarded)."""
        spec, t = self.spec, type(value)
        self.guard_classes(t)
        attrs = value.__dict__
        d = spec.add(("const", attrs), f"{words}.__dict__", ("objdict", slot))
        keys = tuple(attrs)
        spec.add(("dict", d, keys, tuple(attrs[k] for k in keys), True), words + ".*")
        for k in keys:  # what a library object's attributes hold is the library's (see _state_of)
            if _content_guarded(attrs[k]) and (not _library_class(t) or isinstance(value, _STDLIB_CONTAINERS)):
                self.guard_content(spec.add(("key", d, k), f"{words}.{k}"), attrs[k], f"{words}.{k}", depth + 1,
                                   lenient, k)

    def guard_globals(self, used_constants):
        """The globals the traced (user) code loads, one snapshot per module:
        primitives by value; functions, classes, Python modules and
        containers by identity (a record describes them by name, code hash or
        content); tensors the graph took as constants by identity, and
        loaded from there; a builtin it loads as absent from the module's
        globals (a global defined later shadows it). Other objects are not
        guarded, and keep the trace out of the persistent cache."""
        guarded, seen = {}, set()  # id(globals) -> (globals, {name: value})
        for code, globs in self.codes:
            if _records.namedtuple_code(code, globs):
                continue
            if _records.library_code(code.co_filename):
                if _records.distribution_code(code.co_filename):
                    self.guard_distribution_globals(guarded, seen, code, globs)
                continue
            names = guarded.setdefault(id(globs), (globs, {}, "globals"))[1]
            loads = _global_loads(code)
            # names read another way (getattr(settings, "SCALE"), globals()["SCALE"],
            # sys.modules[__name__].SCALE): any attribute name or string constant of the code's, and where it
            # reaches globals by a name held as data (globals()[NAME], getattr(settings, key)), the names its
            # arguments, globals and closure variables held
            by_name = _by_name(code, self.held_names)
            named = code.co_names + _string_constants(code) + (tuple(self.held_names) if by_name else ())
            for name in loads + tuple(n for n in by_name if n in globs and n not in loads):
                value = globs.get(name)
                read = name in loads  # the others may be no read at all: guarded where that costs nothing
                if _user_module(value):
                    # a module of the user's (import settings; settings.SCALE): the attributes the
                    # code names, as globals of that module
                    attrs = guarded.setdefault(id(value.__dict__), (value.__dict__, {}, value.__name__))[1]
                    for attr in named:
                        if attr in value.__dict__ and (id(value.__dict__), attr) not in seen:
                            seen.add((id(value.__dict__), attr))
                            self.guard_global_value(attrs, attr, value.__dict__[attr], used_constants,
                                                    attr in code.co_names)
                elif isinstance(value, types.ModuleType) and name in loads:
                    self.guard_library_names(guarded, seen, value, code.co_names, used_constants)
                if (id(globs), name) in seen:
                    continue
                seen.add((id(globs), name))
                if name in globs:
                    self.guard_global_value(names, name, value, used_constants, read)
                elif hasattr(builtins, name):  # a builtin: no global may come to shadow it
                    names[name] = _C.GUARD_ABSENT
                    # nor may the builtin itself be replaced unseen (builtins.abs = ... after the trace)
                    d = builtins.__dict__
                    if read and (id(d), name) not in seen and isinstance(d[name], _NAMED):
                        seen.add((id(d), name))
                        self.guard_global_value(guarded.setdefault(id(d), (d, {}, "builtins"))[1], name, d[name],
                                                used_constants)
        for globs, names, label in guarded.values():
            if names:
                d = self.spec.add(("const", globs), label, ("globals", globs.get("__name__")))
                self.spec.add(("dict", d, tuple(names), tuple(names.values()), False), label)
                for name, value in names.items():
                    words = entry_name(label, name)
                    if value is _C.GUARD_ABSENT:
                        continue
                    if type(value) in _TENSOR_TYPES:
                        slot = self.spec.add(("key", d, name), words)
                        if id(value) not in self.tensor_slot:
                            self.tensor_slot[id(value)] = self.tensor_guard(slot, value, words)
                            self.guard_tensor_attributes([value])
                        else:  # B = W, or W = model.embed.weight: the graph reads one input for both, which a
                            # process where they are two (a trace record's) must not take
                            self.spec.add(("same", slot, self.tensor_slot[id(value)]), words)
                    elif _content_guarded(value):
                        self.guard_content(self.spec.add(("key", d, name), words), value, words,
                                           lenient=(id(names), name) in self.maybe_read)
                    elif self.called(value):
                        self.guard_function(self.spec.add(("key", d, name), words), value, words)

    def guard_library_names(self, guarded, seen, module, names, used_constants, depth=0):
        """The functions and classes a library's module (import
        torch.nn.functional as F) holds under the names user code names,
        by identity, in guard_globals' snapshots (guarded), and so in the
        modules it holds under those names (torch.nn.functional.gelu): the
        library's code is taken as its version fixes it, but user code that
        reads F.gelu after F.gelu = quick_gelu calls the new one. Its
        numbers, strings, flags and Nones by value (math.pi, a library's
        FLAG the user's code reads as lib.FLAG, set after the trace).
        Library values no record can name are left out."""
        d = module.__dict__
        attrs = None
        for attr in names:
            value = d.get(attr)
            if (id(d), attr) in seen or attr not in d or not (type(value) in PRIMITIVES or isinstance(
                    value, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType))):
                continue
            seen.add((id(d), attr))
            if isinstance(value, types.ModuleType):
                if depth < 3 and not _user_module(value):
                    self.guard_library_names(guarded, seen, value, names, used_constants, depth + 1)
                continue
            if attrs is None:
                attrs = guarded.setdefault(id(d), (d, {}, module.__name__))[1]
            # the user's function in its place (F.relu = lambda t: ...): guarded though no record can name it
            users = isinstance(value, types.FunctionType) and not _records.library_code(value.__code__.co_filename)
            self.guard_global_value(attrs, attr, value, used_constants, users)

    def guard_tensor_methods(self):
        """The entries of torch.Tensor's own dict under the names the user's
        code names that a tensor has (x.softmax, x.split), by identity, or
        as absent where TensorBase's method answers: a method patched
        after the trace (torch.Tensor.softmax = ...) is a miss. A name
        lookup each, only for the names the user's code spells."""
        named = sorted(n for n in self.user_names() if hasattr(torch.Tensor, n))
        if not named:
            return
        d = _C.class_dict(torch.Tensor)
        slot = self.spec.add(("const", d), "class Tensor", ("classdict", torch.Tensor))
        self.spec.add(("dict", slot, tuple(named), tuple(d.get(n, _C.GUARD_ABSENT) for n in named), False),
                      "class Tensor")

    def called(self, value):
        """Whether value is a Python function whose code the traced call ran."""
        if type(value) is not types.FunctionType:
            return False
        if self.called_codes is None:
            self.called_codes = {code for code, _ in self.codes}
        return value.__code__ in self.called_codes

    def guard_function(self, slot, fn, words):
        """What a function the traced call ran (loaded at slot) holds besides
        its identity, which a snapshot guards: its code, its defaults and
        keyword defaults, its attributes, and what its closure cells hold,
        so that a helper changed in place after the trace (helper.__code__
        = ..., act.__defaults__ = (2.0,), h.factor = 4.0, a factory's
        nonlocal rebound by a setter) is a miss. Values guard_value cannot follow are held by
        identity."""
        if id(fn) in self.functions_seen:
            return
        self.functions_seen.add(id(fn))
        spec = self.spec
        spec.add(("is", spec.add(("func", slot, "code"), f"{words}.__code__"), fn.__code__), f"{words}.__code__")
        for field in ("defaults", "kwdefaults"):
            value = getattr(fn, f"__{field}__")
            self.guard_held(spec.add(("func", slot, field), f"{words}.__{field}__"), value, f"{words}.__{field}__")
        # its attributes (h.factor = 4.0 after the trace, a decorator's wrapper.scale), by their contents
        attrs = spec.add(("const", fn.__dict__), f"{words}.__dict__", ("objdict", slot))
        self.guard_content(attrs, fn.__dict__, f"{words}.__dict__", lenient=True)
        if fn.__closure__:
            cells = spec.add(("func", slot, "closure"), f"{words}.__closure__")
            for k, cell in enumerate(fn.__closure__):
                try:
                    value = cell.cell_contents
                except ValueError:  # empty: the trace read nothing there
                    continue
                name = f"{words}'s closure variable {fn.__code__.co_freevars[k]}"
                c = spec.add(("cell", spec.add(("item", cells, k), name)), name)
                if self.called(value):
                    self.guard_function(c, value, name)
                else:
                    self.guard_held(c, value, name)

    def guard_held(self, slot, value, words):
        """value (loaded at slot) by value where guard_value guards it so
        without a problem (numbers, strings, None, immutable values, tuples
        and dicts of them), else by identity; a container or object by
        content as well (guard_content, leniently)."""
        if _simple(value):
            self.guard_value(slot, value, words)
            return
        self.spec.add(("is", slot, value), words)
        if not _content_guarded(value):
            return
        if id(value) in self.content_seen:
            self.content_reused.add(id(value))
        else:
            self.content_seen.add(id(value))
            self.guard_content(slot, value, words, lenient=True)

    def user_names(self):
        """The names the user code the traced call ran names (_names_in),
        made once (after the trace: its codes are all noted)."""
        if self.user_named is None:
            self.user_named = _names_in(_user_codes([c for c, _ in self.codes]))
        return self.user_named

    def guard_named_held(self):
        """What the classes, functions and Python modules of the user's that
        arguments and modules' attributes hold hold in turn, as globals'
        are guarded: a class's dict (cls.k = 7.0 after the trace), a
        function the call ran by its code, defaults and closure, a module's
        attributes the user code names (settings.SCALE)."""
        for slot, value, words in self.named_held:
            if isinstance(value, type):
                if _user_class(value):
                    self.guard_classes(value)
            elif type(value) is types.FunctionType:
                if self.called(value):
                    self.guard_function(slot, value, words)
            elif _user_module(value):
                named = self.user_names()
                attrs = value.__dict__
                d = self.spec.add(("const", attrs), f"{words}.__dict__", ("objdict", slot))
                for key in [k for k in attrs if k in named]:
                    self.guard_held(self.spec.add(("key", d, key), f"{words}.{key}"), attrs[key], f"{words}.{key}")

    def guard_library_held(self):
        """The attributes of the library objects modules hold (a model's
        config: output_hidden_states, use_cache, final_logit_softcapping,
        which a model's forward reads on every call) that the code the
        traced call ran names, by value (numbers, strings, None) or
        identity, and each object's attribute names, in order. Not all: what
        no code of the call names is the library's business (a tokenizer's
        vocabulary, caches it fills)."""
        if not self.library_held:
            return
        named = _names_in([c for c, _ in self.codes])
        spec = self.spec
        for slot, obj, words in self.library_held:
            attrs = vars(obj)
            aliases = getattr(type(obj), "attribute_map", None)  # a config's hidden_size is its n_embd
            names = named | {aliases[n] for n in named if n in aliases} if isinstance(aliases, dict) else named
            d = spec.add(("attrs", slot), f"{words}.__dict__")
            spec.add(("len", d, len(attrs), tuple(attrs)), f"{words}'s attributes")
            for key in [k for k in attrs if k in names]:
                value, at = attrs[key], f"{words}.{key}"
                item = spec.add(("key", d, key), at)
                if _simple(value):
                    self.guard_value(item, value, at)
                else:
                    spec.add(("is", item, value), at)

    def check_lenient(self):
        """A problem for the first value a module's attribute holds that jit
        could not guard (a numpy array, an object with __slots__, a config
        nested too deep) whose attribute or key the traced user code names
        (self.arr, cfg["scale"]): held by identity, a change to it in place
        would go unseen. What the code does not name stays held so (a
        model's attributes hold much that its forward never reads)."""
        held = [(key, problems[0]) for key, problems in self.lenient if problems]
        if not held:
            return
        named = self.user_names()
        for key, problem in held:
            if key in named:
                self.problems.append(problem)
                return

    def relax_module_dicts(self):
        """The modules' attributes that no code the call ran names, and that
        no code of the user's reaches by a name held as data (getattr(self,
        key)), guarded to be there, whatever they hold (_C.GUARD_ANY): a
        counter or a timestamp the caller sets on the model between calls
        (model.calls = i) was a miss on every call, then a storm, and the
        function ran eagerly for good. Only modules of the user's and
        torch's classes (_relaxable). The attribute names stay guarded in
        order, the named ones by value or identity; parameters, buffers,
        submodules and hooks are dicts of their own, guarded whole. A call
        of a torch.compile'd function (Dynamo's code, not the one the
        trace saw, reads the attributes) relaxes nothing, nor does user
        code that reads attributes by name another way: a builtin of
        _BY_NAME_BUILTINS called from it (GA = getattr; GA(self, k)), the
        names in _RELAX_BY_NAME (inspect.getmembers(self),
        self.__getstate__()), an operator.attrgetter a module holds. Names
        include the words inside the code's strings ("{0.scale}".format).
        What an attribute holds that another place (an attribute, a hook,
        a closure) holds too keeps its guards."""
        codes = [c for c, _ in self.codes]
        if not self.module_dicts or self.dynamo_ran or self.by_name_call or \
                any(_relax_blocked(c) for c in _user_codes(codes)) or \
                any(_by_name_reader(v) for inst in self.spec if inst[0] == "dict" for v in inst[3]):
            return
        named = _words_in(codes) | self.held_names
        spec = self.spec
        for index in self.module_dicts:
            if spec[index][0] == "nop":  # inside what an attribute no code names holds (below, an earlier call)
                continue
            kind, slot, keys, values, sized = spec[index]
            assert kind == "dict" and sized
            values = tuple(v if type(k) is not str or k in named or k in _MODULE_DICTS else _C.GUARD_ANY
                           for k, v in zip(keys, values))
            spec[index] = (kind, slot, keys, values, sized)
        # what such an attribute holds (a history list, a stats dict the caller fills): no guard, where no other
        # guard, no pending one and no graph input reads a slot its guards load
        pending = {slot for slot, _, _ in self.named_held + self.library_held} | set(self.tensor_slot.values()) | \
            set(self.object_slot.values()) | set(self.part_slot.values())
        last = _last_readers(spec) if self.module_held else {}
        for d, key, start, end, held in self.module_held:
            # another attribute, a hook, a closure holding the same object was left to these guards
            if key in named or spec[start][0] == "nop" or held in self.content_reused or \
                    any(s in pending or last.get(s, -1) >= end for s in range(start, end)):
                continue
            for i in range(start, end):
                spec[i] = ("nop",)

    def guard_grad(self, words, grad, used_constants):
        """A problem when the graph took grad, the gradient words names (the
        .grad of a tensor), as a captured tensor: no guard loads a gradient,
        so every call would read the traced call's."""
        if grad is not None and id(grad) in used_constants and not self.problems:
            self.problems.append(f"it reads {words}, which a compiled call would take from the traced call "
                                 "(training steps go through torch.compile for now)")

    def guard_distribution_globals(self, guarded, seen, code, globs):
        """The numbers, strings, flags and Nones among the globals an
        installed distribution's code loads (guard_globals), by value, and
        its functions and classes by identity: a team's own package
        installed with pip is such code, and a flag of its read from the
        environment at import, or a constant edited and reinstalled under
        the same version, changed the answer with no retrace, warm starts
        too; transformers' apply_rotary_pos_emb patched in a notebook cell
        kept the old function's answer. A dict or list of such values
        (SETTINGS = {"scale": 2.0}) is guarded by its contents as well, as
        the user's are: SETTINGS["scale"] = 5.0 kept the traced answer. Its
        other globals are its own objects."""
        names = guarded.setdefault(id(globs), (globs, {}, "globals"))[1]
        for name in _global_loads(code):
            if name in globs and (id(globs), name) not in seen and (
                    type(globs[name]) in PRIMITIVES or _function_or_class(globs[name]) or
                    _primitive_container(globs[name])):
                seen.add((id(globs), name))
                names[name] = globs[name]

    def guard_global_value(self, names, name, value, used_constants, read=True):
        """Adds global name (value) to names, the entries of its module's
        snapshot, when it is guarded there; not read (a name the code may
        not read as a global: an attribute's, a string): only where that
        keeps the variant compiled and its record portable."""
        t = type(value)
        if t in _TENSOR_TYPES:
            if read:  # one the code reads only for its sizes too (W.shape[0])
                names[name] = value
                self.guard_grad(f"global {name}.grad", _grad_of(value), used_constants)
            return
        # immutable values other than numbers and strings by identity (dtypes, enum members)
        if not (t in _IMMUTABLE or t in _CONTAINERS or _namedtuple(value) or
                isinstance(value, (enum.Enum,) + _NAMED) or _content_guarded(value)):
            if read:
                self.opaque.append(f"global {name} holds a {t.__qualname__}")
            return
        if not read:
            try:
                _records._Describer({}).value(value)
            except _records.Unportable:
                return
            self.maybe_read.add((id(names), name))  # names: the entries of one globals dict (guard_globals)
        names[name] = value


# -- Python state: what guard_content guards, what a call may write ---------------

_MAX_DEPTH = 6          # containers inside containers guard_content follows
_MAX_CONTENT = 2000     # containers and objects one trace guards by content
_MAX_STATE = 50000      # values one _state_of describes before it stops at identities
_MAX_OBJECTS = 1024     # argument objects one trace guards by their attributes (a cache: one per layer)
_MAX_HELD = 20000       # values one argument's object holds, at most, to be guarded by its attributes
# values that never change in place: held by value or identity, never followed
_IMMUTABLE = PRIMITIVES + (complex, bytes, range, slice, type(Ellipsis), torch.dtype, torch.device, torch.layout,
                            torch.memory_format, torch.Size, frozenset,
                            torch.torch_version.TorchVersion,  # torch.__version__ (sentence-transformers keeps it)
                            ) + NUMPY_SCALARS


def _model_output(value):
    """Whether value is an OrderedDict that is a dataclass too, with
    string keys (transformers' ModelOutput): pytree flattens it as a dict."""
    return isinstance(value, collections.OrderedDict) and dataclasses.is_dataclass(value) and \
        all(type(k) is str for k in value) and isinstance(getattr(value, "__dict__", None), dict)


def _by_value(value):
    """Whether guard_value compares value by type and value (an eq guard,
    _spec.same_value's rule): a value that never changes in place and is no
    number, string or sequence (a dtype, a device, an enum member, a
    slice, a complex number, bytes, a range)."""
    t = type(value)
    return (t in _IMMUTABLE and t not in PRIMITIVES and t not in (torch.Size, frozenset)) or \
        isinstance(value, enum.Enum)


def _simple(value, depth=0):
    """Whether guard_value guards value by value, without a problem: a
    number, string, None or other immutable value, or a tuple, or a dict
    with string keys, of those."""
    t = type(value)
    if t in PRIMITIVES or _by_value(value):
        return True
    if depth < _MAX_DEPTH and t is tuple:
        return all(_simple(v, depth + 1) for v in value)
    if depth < _MAX_DEPTH and t is dict:
        return all(type(k) is str and _simple(v, depth + 1) for k, v in value.items())
    return False


def _primitive_container(value, most=64):
    """Whether value is a plain dict (of str or int keys) or list of at
    most `most` numbers, strings, flags and Nones: a library's settings."""
    if type(value) is dict:
        return len(value) <= most and all(type(k) in (str, int) and type(v) in PRIMITIVES for k, v in value.items())
    return type(value) is list and len(value) <= most and all(type(v) in PRIMITIVES for v in value)


def _content_guarded(value):
    """Whether guard_content follows value: a container, a module, a user
    class or any other object that may change in place (tensors are held
    by identity and their data read by the graph; functions, library
    classes and Python modules by identity)."""
    t = type(value)
    if t in _IMMUTABLE or t in _TENSOR_TYPES or isinstance(value, enum.Enum):
        return False
    if t is tuple or _namedtuple(value):
        return any(_content_guarded(v) for v in value)
    if isinstance(value, type):
        return not _library_class(value)
    return not isinstance(value, _NAMED)


def _held_state(value):
    """Whether guard_module follows what a module's attribute holds by
    content: a container, or an object of a user's class (a library's,
    such as a model's config, and bound methods of modules and libraries'
    objects stay held by identity; a user object's bound method by what
    its object holds too)."""
    if not _content_guarded(value):
        return False
    t = type(value)
    if t is types.MethodType:  # self.fn = helper.meth: what helper holds (helper.k = 5.0 after the trace)
        owner = value.__self__
        return not isinstance(owner, (torch.nn.Module, type)) and not _library_class(type(owner)) and \
            _content_guarded(owner)
    return t in (dict, list, tuple, set) or \
        not (isinstance(value, (torch.nn.Module, type)) or _library_class(t))


def _library_object(value):
    """Whether value is an object of a library's class that keeps its state
    in its __dict__ (a transformers PretrainedConfig), not a module, a
    bound method or a class."""
    t = type(value)
    return _library_class(t) and not isinstance(value, (torch.nn.Module, types.MethodType, type)) and \
        state_in_dict(t) and type(getattr(value, "__dict__", None)) is dict


def _attribute_state(d, attr):
    """The state of entry attr of dict d (a module's), as _state_of says it:
    deleted and bound to another object are changes."""
    return _state_of(d[attr]) if attr in d else ("deleted",)


def _user_module(value):
    """Whether value is a Python module of the user's (not a library's)."""
    return isinstance(value, types.ModuleType) and not _records.library_code(getattr(value, "__file__", "") or "")


def _closure_cells(fn):
    """(index, name, cell, value) of each of fn's closure cells that holds a value."""
    for k, cell in enumerate(fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        yield k, fn.__code__.co_freevars[k], cell, value


def _library_class(cls):
    return _records.library_code(_defined_in(cls))


_BINDING = ("memory", "sizes", "strides", "storage offset", "dtype")


def _function_or_class(value):
    """Whether value is a function or class, which guards hold by identity
    (a trace record names it by module and qualified name; one no name
    finds, a lambda patched in, keeps the trace out of the cache)."""
    return isinstance(value, (types.FunctionType, type))


def _tensor_binding(t):
    """What tensor t is bound to, in _state_of's form: its memory, sizes,
    strides, offset and dtype (_BINDING, compared by _state_change)."""
    return ("binding", None, (t.untyped_storage().data_ptr(), tuple(t.shape), tuple(t.stride()), t.storage_offset(),
                              t.dtype))


def _made_by_code(value):
    """Whether value holds what code computes when it runs, out of reach of
    held_tensors: an iterator or generator (iter([x + 1]), map, zip), a
    function with a closure (lambda: y * 2), a bound method, a partial."""
    return isinstance(value, (collections.abc.Iterator, types.MethodType, functools.partial)) or \
        (isinstance(value, types.FunctionType) and bool(value.__closure__))


def _reaches_tensor(value, known, most=10000):
    """Whether value reaches a tensor other than those whose ids are in
    known through what the collector sees it hold (slots, a C type's
    fields, its __dict__), not through classes, modules, functions or
    torch modules; beyond most objects, True (it cannot tell). For a
    result's leaf, known: the tensors held_tensors finds in it."""
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            if id(v) not in known:
                return True
            continue
        if id(v) in seen or type(v) in _IMMUTABLE or isinstance(v, (type, types.ModuleType, types.FunctionType,
                                                                     types.BuiltinFunctionType, types.CodeType,
                                                                     torch.nn.Module)):
            continue
        if len(seen) >= most:
            return True
        seen.add(id(v))
        todo.extend(gc.get_referents(v))
    return False


def _mutable(value):
    """Whether a call can change value in place (what _state_of follows)."""
    t = type(value)
    return not (t in _IMMUTABLE or t in _TENSOR_TYPES or isinstance(value, (type, types.ModuleType, enum.Enum)) or
                isinstance(value, (types.FunctionType, types.BuiltinFunctionType, _C.JitFunction)))


def _state_of(value, budget=None, depth=0, inside=None, opaque=frozenset()):
    """A description of value's Python state that compares equal while
    nothing in it changes: numbers and strings by value, tensors, functions
    and classes by identity, containers, modules and other objects by
    identity and content (their __dict__), _MAX_DEPTH deep and to
    _MAX_STATE values; an object inside itself, or whose id is in opaque,
    by identity."""
    budget = budget if budget is not None else [_MAX_STATE]
    inside = inside if inside is not None else set()
    budget[0] -= 1
    t = type(value)
    if t in _IMMUTABLE:
        return ("v", t, value)
    if t is types.MethodType and isinstance(getattr(value.__func__, "_tn_jit", None), _C.JitFunction):
        # jit(module)'s forward, by its module: the one jit installs in its place when the class's forward is
        # replaced is no write of the call's (a jitted function over it ran eagerly after IPython's autoreload)
        return ("id", ("jit forward", id(value.__self__)))
    if budget[0] < 0 or depth > _MAX_DEPTH or id(value) in inside or id(value) in opaque or not _mutable(value):
        return ("id", id(value))
    inside.add(id(value))
    try:
        if t in (list, tuple):
            return ("seq", id(value), t, [_state_of(v, budget, depth + 1, inside, opaque) for v in value])
        if isinstance(value, dict):
            return ("map", id(value), t, [(k, _state_of(v, budget, depth + 1, inside, opaque))
                                          for k, v in list(value.items())])
        if t is set:
            return ("set", id(value), frozenset(value))
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict):
            # an instance of a library class (a logger, a config) by its own attributes only:
            # what they hold is the library's (a logger's level cache fills as it logs)
            inner = depth + 1 if not _library_class(t) else _MAX_DEPTH + 1
            return ("obj", id(value), t, [(k, _state_of(v, budget, inner, inside, opaque))
                                          for k, v in list(attrs.items())])
        return ("id", id(value))
    finally:
        inside.discard(id(value))


def _library_bindings(codes):
    """[(module, name, attribute or None, value)] of the functions and
    classes library code found through its module's globals, and through
    the attributes its code names on a module it found there (nn.GELU's
    F.gelu): what a process that patched them at startup (liger-kernel
    replaces transformers' apply_rotary_pos_emb) finds instead. jit guards
    none of them on each call; a trace record checks them when it loads."""
    out, seen = [], set()
    for code, globs in codes:
        modname = globs.get("__name__")
        if not isinstance(modname, str):
            continue
        library = _records.library_code(code.co_filename)
        if library and "<" not in code.co_qualname and (modname, code.co_qualname) not in seen:
            # the method or function itself, by its name (LayerNorm.forward replaced on the class)
            seen.add((modname, code.co_qualname))
            out.append((modname, code.co_qualname, "code", code))
        for name in _global_loads(code):
            value = globs.get(name)
            if isinstance(value, types.ModuleType) and (library or _records.library_code(
                    getattr(value, "__file__", None) or "<builtin>")):  # the user's F.gelu too
                for attr in code.co_names:
                    if (modname, name, attr) not in seen and isinstance(vars(value).get(attr), _BOUND):
                        seen.add((modname, name, attr))
                        out.append((modname, name, attr, vars(value)[attr]))
            elif library and isinstance(value, _BOUND) and (modname, name, None) not in seen:
                seen.add((modname, name, None))
                out.append((modname, name, None, value))
    return out


_BOUND = (types.FunctionType, types.BuiltinFunctionType, type)  # what a patch replaces


def _global_binding(d, name):
    """What global name of globals d is bound to, as _state_of describes a
    value: a number or string by value, any other object by identity
    (what it holds is remember's to follow)."""
    if name not in d:
        return ("deleted",)
    v = d[name]
    return ("v", type(v), v) if type(v) in _IMMUTABLE else ("id", id(v))


def _state_change(words, was, now):
    """How the state described by was became now, in words naming the
    first place that differs (global CFG['n'] (an int)), or None: no
    values, so that the words are the same on every call that writes."""
    if "deleted" in (was[0], now[0]):
        return None if was[0] == now[0] else f"{words} ({'deleted' if now[0] == 'deleted' else 'set'})"
    if was[0] != now[0] or (was[0] != "v" and was[1] != now[1]):
        return f"{words} (another object)"
    kind = was[0]
    if kind == "binding":  # a tensor's: what of it changed, and the ways code changes it
        changed = [part for part, a, b in zip(_BINDING, was[2], now[2]) if a != b]
        return None if not changed else (
            f"{words}'s {' and '.join(changed)} (an in-place view op: x.unsqueeze_(0), x.t_(); x.data = y, "
            "x.set_(), an out= or resize_ that grows it)")
    if kind == "v":
        return None if same_value(was[2], now[2]) else f"{words} ({'an' if type(was[2]).__name__[0] in 'aeiou' else 'a'} {type(was[2]).__name__})"
    if kind == "id":
        return None
    if kind == "set":
        return None if was[2] == now[2] else f"{words} (a set's items)"
    if kind == "seq":
        if len(was[3]) != len(now[3]):
            return f"{words} (its length)"
        for k, (a, b) in enumerate(zip(was[3], now[3])):
            change = _state_change(f"{words}[{k}]", a, b)
            if change:
                return change
        return None
    before, after = dict(was[3]), dict(now[3])
    step = (lambda k: f"{words}[{k!r}]") if kind == "map" else (lambda k: f"{words}.{k}")
    for k in before:
        if k not in after:
            return f"{step(k)} (deleted)"
        change = _state_change(step(k), before[k], after[k])
        if change:
            return change
    added = [k for k in after if k not in before]
    return f"{step(added[0])} (set)" if added else None


_STORES = {"STORE_ATTR": "an attribute", "DELETE_ATTR": "an attribute", "STORE_SUBSCR": "an item",
           "DELETE_SUBSCR": "an item"}
_MUTATORS = frozenset(("append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem",
                       "add", "discard", "sort", "reverse", "__setitem__", "__delitem__", "__setattr__"))


_code_instructions = weakref.WeakKeyDictionary()


def _instructions(code, nested=True):
    """(code, instruction, line) of code's instructions, and of the code
    objects nested in it when nested; disassembled once per code object."""
    own = _code_instructions.get(code)
    if own is None:
        own = tuple((code, i, i.positions.lineno if i.positions else None) for i in dis.get_instructions(code))
        _code_instructions[code] = own
    yield from own
    if nested:
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                yield from _instructions(c)


def _names_in(codes):
    """The attribute and global names codes name, and the identifiers among
    their string constants (getattr(settings, "SCALE"))."""
    return {n for c in codes for n in c.co_names + _string_constants(c)}


def _user_codes(codes):
    return [c for c in dict.fromkeys(codes) if not _records.library_code(c.co_filename)]


def _source_codes(codes):
    """The user codes that have a source file (not exec'd or generated: a
    dataclass's __init__ comes from "<string>")."""
    return [c for c in _user_codes(codes) if not c.co_filename.startswith("<")] or _user_codes(codes)


def _write_sites(codes):
    """Where the user code a trace ran may write outside its locals, in
    words (' (at f.py:12: an item set)'), or ''."""
    sites = []
    for code in _source_codes(codes):
        for c, i, line in _instructions(code):
            if i.opname in _STORES:
                sites.append(f"{c.co_filename}:{line}: {_STORES[i.opname]} {'deleted' if 'DELETE' in i.opname else 'set'}")
            elif i.opname in ("LOAD_METHOD", "LOAD_ATTR") and i.argval in _MUTATORS:
                sites.append(f"{c.co_filename}:{line}: .{i.argval}()")
    sites = list(dict.fromkeys(sites))
    return f" (at {'; '.join(sites[:3])})" if sites else ""


def _rebindings(codes):
    """(code, words, line) for each assignment the user code a trace ran
    makes to a global, or to a closure variable that no code of the trace
    owns (a cell of an enclosing call that outlives this one)."""
    codes = _user_codes(codes)
    owned = set()  # (code nested in an executed code, a cell variable of that code)
    for outer in codes:
        for c, _, _ in _instructions(outer):
            if c is not outer:
                owned.update((c, name) for name in outer.co_cellvars)
    out = []
    for code in codes:
        for _, i, line in _instructions(code, nested=False):
            if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                out.append((code, f"global {i.argval}", line))
            elif i.opname in ("STORE_DEREF", "DELETE_DEREF") and i.argval in code.co_freevars and \
                    (code, i.argval) not in owned:
                out.append((code, f"closure variable {i.argval}", line))
    return out


# the READ_STATE readers by what the profile hook sees of them: a Python function's code, a C function itself
_STATE_READS = {getattr(read, "__code__", read): name for name, read in _records.READ_STATE.items()}
# autocast's dtype, which STATE guards only while autocast is on: read by the code (its own call of the reader)
_STATE_READS[torch.get_autocast_dtype] = _STATE_READS[torch.get_autocast_cpu_dtype] = "CPU autocast dtype"

# non-torch sources of values: the files of their Python code, and the modules of their C functions
_OUTSIDE_FILES = {os._Environ.__getitem__.__code__.co_filename: "os", random.Random.randint.__code__.co_filename:
                  "random", uuid.uuid4.__code__.co_filename: "uuid", secrets.token_bytes.__code__.co_filename:
                  "secrets"}
_RNG_STATE_CODE = torch.random.get_rng_state.__code__
# torch.Tensor's Python methods that read what no guard checks (_UNGUARDED_READS' in Python: their own calls are
# torch's): a tensor in shared memory (a DataLoader worker's batch), the size of the storage a view is of
_UNGUARDED_CODES = {torch.Tensor.is_shared.__code__: "Tensor.is_shared()",
                    torch.Tensor.storage.__code__: "Tensor.storage()"}
# the attributes of a tensor no guard checks, read by user code: its version counter (a cache refreshed after
# in-place updates) and the tensor a view is of; an attribute read makes no profile event (_unguarded_attributes)
_UNGUARDED_ATTRIBUTES = frozenset(("_version", "_base"))
_OUTSIDE_MODULES = ("random", "_random", "time", "datetime", "_datetime", "uuid", "_uuid", "secrets", "numpy.random",
                    "posix")


def _outside_source(fn):
    """What builtin fn, called from traced user code, reads from outside
    torch (random.random(), time.time(), ...), or None."""
    mod = getattr(fn, "__module__", None)
    owner = getattr(fn, "__self__", None)
    if fn is id:  # PACKED[id(w)]: another object of the same sizes takes another entry
        return "id()"
    if isinstance(owner, (torch.Tensor, torch.UntypedStorage)) and getattr(fn, "__name__", None) in _UNGUARDED_READS:
        # x.storage_offset() of a slice at another offset answered the traced call's
        return f"{type(owner).__name__}.{fn.__name__}()"
    if not mod and owner is not None:
        mod = owner.__module__ if isinstance(owner, type) else type(owner).__module__
    if not isinstance(mod, str) or not (mod in _OUTSIDE_MODULES or mod.startswith("numpy.random")):
        return None
    if mod == "posix" and getattr(fn, "__name__", "") not in ("urandom", "getrandom", "times"):
        return None
    return f"{mod}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}()"


def _outside_globals(codes):
    """{(file, line): words} for the non-torch sources of values user code
    reaches through its globals that the profile hook cannot see calls of:
    numpy's RNG (Cython functions make no call events), through numpy,
    numpy.random or a function of it held by a global."""
    np = sys.modules.get("numpy")
    if np is None:
        return {}
    found = {}
    for code, globs in codes:
        if _records.library_code(code.co_filename):
            continue
        for c, i, line in _instructions(code):
            if i.opname not in ("LOAD_GLOBAL", "LOAD_NAME"):
                continue
            value = globs.get(i.argval)
            if value is np and "random" in c.co_names or value is np.random or \
                    str(getattr(value, "__module__", None) or "").startswith("numpy.random"):
                found.setdefault((c.co_filename, line), "numpy.random")
    return found


def _unguarded_attributes(codes, modules):
    """{(file, line): name} of the attributes in _UNGUARDED_ATTRIBUTES the
    user code among codes reads, of whatever object (no type is known from
    the code): a name one of modules (the call's, with their submodules)
    holds as its own attribute (self._base = nn.Linear(...)) is the user's."""
    found = {}
    for code in _user_codes(codes):
        for c, i, line in _instructions(code):
            if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and i.argval in _UNGUARDED_ATTRIBUTES:
                found.setdefault((c.co_filename, line), i.argval)
    owned = {name for name in set(found.values()) for m in modules
             if any(name in d for d in (m.__dict__, m._modules, m._parameters, m._buffers))}
    return {where: name for where, name in found.items() if name not in owned}


def _outside_code(code):
    """What Python function of a non-torch source code is (os.environ[...],
    random.Random.randint()), or None."""
    if code is _RNG_STATE_CODE:  # a tensor of the generator's state, which each random op moves on
        return "torch.get_rng_state()"
    if code in _UNGUARDED_CODES:
        return _UNGUARDED_CODES[code]
    mod = _OUTSIDE_FILES.get(code.co_filename)
    if mod is None:
        return None
    if mod == "os" and code.co_qualname.startswith("_Environ"):
        return "os.environ"
    return f"{mod}.{code.co_qualname}()"


def _wrapped_parameters(fn):
    """The names of the parameters of the function fn wraps (functools.wraps)
    that the items of fn's *args take, where fn's own leading parameters
    are the wrapped function's first ones (transformers' decorators:
    wrapper(self, *args, **kwargs) around forward(self, input_ids, ...));
    else ()."""
    inner = getattr(fn, "__wrapped__", None)
    while isinstance(getattr(inner, "__wrapped__", None), types.FunctionType):
        inner = inner.__wrapped__
    if not isinstance(inner, types.FunctionType):
        return ()
    own, code = fn.__code__, inner.__code__
    lead = own.co_varnames[:own.co_argcount]
    wrapped = code.co_varnames[:code.co_argcount]
    return wrapped[len(lead):] if wrapped[:len(lead)] == lead else ()


def _function_of(frame):
    """The function running frame, found by its code's name where code
    names functions: a global of its module, an attribute of the class of
    its self or cls argument, or a global of its caller's (a function, or a
    class holding it as a static method); else None."""
    code = frame.f_code

    def match(value):  # no attribute lookup that could run code (a lazy module's __getattr__ imports)
        if isinstance(value, type):  # through its classes' dicts: no descriptor runs
            value = next((vars(k)[code.co_name] for k in value.__mro__ if code.co_name in vars(k)), None)
        if isinstance(value, (staticmethod, classmethod, types.MethodType)):
            value = value.__func__
        return value if isinstance(value, types.FunctionType) and value.__code__ is code else None

    fn = match(frame.f_globals.get(code.co_name))
    if fn is None and code.co_argcount and code.co_varnames[0] in ("self", "cls"):
        first = frame.f_locals.get(code.co_varnames[0])
        fn = match(first if isinstance(first, type) else type(first))
    caller = frame.f_back  # not its locals: reading f_locals keeps what they hold alive in the frame
    if fn is None and caller is not None:
        fn = next((f for f in map(match, list(caller.f_globals.values())) if f is not None), None)
    return fn


def _user_class(value):
    """Whether value is a class of the user's (not a library's)."""
    return isinstance(value, type) and not _library_class(value)


# what reads or writes an object's attributes by a name held as data, however the code reaches it: as a global or
# closure variable of the user's code (GA = getattr; from inspect import getmembers as gm), what a module or its
# class holds (D = object.__getattribute__, functools.partial(getattr, self, "k"), property(attrgetter("k"))),
# called from C (functools.reduce(GA, names, self)); and what runs code on other threads, whose names no trace sees
_BY_NAME_READERS = frozenset(map(id, (getattr, setattr, hasattr, delattr, vars, dir, object.__getattribute__,
                                      object.__setattr__, inspect.getmembers, inspect.getattr_static,
                                      operator.attrgetter, operator.methodcaller, threading, threading.Thread,
                                      __import__("concurrent.futures").futures)))
# names of what reads an object's attributes by name or as a dict, where user code names them (relax_module_dicts)
_RELAX_BY_NAME = frozenset(("getmembers", "getattr_static", "__getstate__", "__reduce_ex__", "__reduce__", "asdict",
                            "astuple", "methodcaller", "__dir__", "__slots__", "__match_args__"))


_relaxable_classes = weakref.WeakKeyDictionary()


def _relaxable(cls):
    """Whether the attributes of a module of class cls may be relaxed
    (relax_module_dicts): cls and its bases are the user's or torch's, none
    an installed distribution's. transformers' code reads its modules'
    attributes by names it builds (Gemma3's rotary embedding:
    getattr(self, f"{layer_type}_attention_scaling")), which no code
    spells: a changed scaling answered with the traced one."""
    r = _relaxable_classes.get(cls)
    if r is None:
        r = _relaxable_classes[cls] = not any(_records.distribution_code(_defined_in(c)) for c in cls.__mro__[:-1])
    return r


def _by_name_reader(value, depth=0):
    """Whether value reads attributes by a name held as data when called
    (_BY_NAME_READERS, an attrgetter, a partial or a property over one,
    a method wrapper of __getattribute__), or runs threads."""
    if id(value) in _BY_NAME_READERS or isinstance(value, (operator.attrgetter, operator.methodcaller)):
        return True
    if depth > 2:
        return False
    if type(value) is functools.partial:
        return _by_name_reader(value.func, depth + 1)
    if type(value) is property:
        return any(_by_name_reader(f, depth + 1) for f in (value.fget, value.fset) if f is not None)
    if type(value).__name__ in ("method-wrapper", "builtin_function_or_method"):
        return getattr(value, "__name__", None) in ("__getattribute__", "__reduce_ex__", "__reduce__", "__dir__")
    return isinstance(value, type) and issubclass(value, (threading.Thread,))


def _by_name_builtin(fn):
    """Whether C function fn (a profile c_call's) reads attributes by a
    name held as data (_by_name_reader), called from user code."""
    return _by_name_reader(fn) or getattr(fn, "__name__", None) in ("__getstate__",)


_relax_blocked_codes = weakref.WeakKeyDictionary()


def _relax_blocked(code):
    """Whether user code reaches attributes by a name held as data
    (_reaches_by_name, _RELAX_BY_NAME) or matches a class pattern (case
    M(k=v): the names are a tuple constant, or the class's __match_args__);
    worked out once per code object."""
    r = _relax_blocked_codes.get(code)
    if r is None:
        r = _relax_blocked_codes[code] = _reaches_by_name(code) or bool(_RELAX_BY_NAME.intersection(code.co_names)) \
            or any(i.opname == "MATCH_CLASS" for _, i, _ in _instructions(code, nested=False))
    return r


def _words_in(codes):
    """_names_in, and every identifier inside the string constants of the
    user's codes among them ("{0.scale}".format(self) reads scale; the
    messages in torch's code name no attribute it reads)."""
    words = _names_in(codes)
    for c in _user_codes(codes):
        for const in c.co_consts:
            if type(const) is str and not const.isidentifier() and len(const) < 4096:
                words.update(_WORD.findall(const))
    return words


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _last_readers(spec):
    """{slot: the last instruction of spec that reads it}: as its source,
    the other tensor of a "same" or one of a "distinct"; a "sizes"
    program, whose operands hold slots, reads every slot before it."""
    last = {}
    for i, inst in enumerate(spec):
        kind = inst[0]
        if kind in ("arg", "const", "call", "nop"):
            continue
        if kind == "sizes":
            last.update(dict.fromkeys(range(i), i))
        elif kind == "distinct":
            last.update(dict.fromkeys(inst[1], i))
        else:
            last[inst[1]] = i
            if kind == "same":
                last[inst[2]] = i
    return last


def _defined_in(cls):
    """The file of the module that defined cls ("" when it has none)."""
    return getattr(sys.modules.get(cls.__module__), "__file__", None) or ""


_global_names = weakref.WeakKeyDictionary()


def _string_constants(code):
    """The identifiers among code's string constants (getattr(m, "X"))."""
    return tuple(c for c in code.co_consts if type(c) is str and c.isidentifier())


def _by_name(code, held=()):
    """The names code may read or write a global by without loading it
    (globals()["SCALE"], getattr(sys.modules[__name__], "SCALE")): its
    attribute names and identifier strings, and the names held (a trace's
    held_names: globals()[NAME], getattr(settings, key)), where it calls or
    names what reaches globals by name; none where it does not (a result's
    {"logits": y}, a dataclass field's self.loss = loss: a global loss
    the caller rebinds on every call is no read)."""
    if not _reaches_by_name(code):
        return ()
    return code.co_names + _string_constants(code) + tuple(held)


_reaches = weakref.WeakKeyDictionary()


def _reaches_by_name(code):
    """Whether code calls or names what reaches globals by a name held as
    data (_REACHES_BY_NAME); worked out once per code object."""
    r = _reaches.get(code)
    if r is None:
        r = _reaches[code] = bool(_REACHES_BY_NAME.intersection(code.co_names))
    return r


_MAX_HELD_NAMES = 1000  # strings one trace takes from what by-name code holds (a vocabulary is no names)


def _held_names(names, values):
    """Adds to set names the identifier strings among values and the items,
    keys and values of the containers among them (one level), up to
    _MAX_HELD_NAMES in all."""
    for v in values:
        items = (v,) if type(v) is str else itertools.chain(v, v.values()) if type(v) is dict else \
            v if type(v) in (list, tuple, set, frozenset) else ()
        for item in itertools.islice(items, _MAX_HELD_NAMES):
            if len(names) >= _MAX_HELD_NAMES:
                return
            if type(item) is str and item.isidentifier():
                names.add(item)


def _argument_values(frame):
    """The values of frame's arguments (as the call passed them, at its
    start)."""
    code, local = frame.f_code, frame.f_locals
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) + \
        bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return [local[name] for name in code.co_varnames[:n] if name in local]


# what reads or writes a module's globals by a name held as data
_REACHES_BY_NAME = frozenset(("globals", "vars", "getattr", "setattr", "delattr", "hasattr", "modules", "__dict__",
                              "eval", "exec", "attrgetter", "import_module", "__import__", "__getattribute__",
                              "__setattr__", "f_globals"))


def _global_loads(code):
    """The names code loads as globals (LOAD_GLOBAL, LOAD_NAME)."""
    names = _global_names.get(code)
    if names is None:
        names = tuple(dict.fromkeys(i.argval for _, i, _ in _instructions(code, nested=False)
                                    if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")))
        _global_names[code] = names
    return names


# -- building the graph --------------------------------------------------------

def _graph_of(trace, result):
    """The recorded ops as an FX graph over the trace's external tensors.
    Returns (the fx.Graph, its inputs (the external tensors, in placeholder
    order), the captured ones among them (id -> tensor), the output plan
    (treespec, per leaf how to make it), the value checks, what the call
    set on argument objects (_Sets)). The build makes
    its GraphModule (FX writes and compiles its Python code: ~10 ms of a
    BERT layer's traced call) where it needs one: a symbolic build needs
    none."""
    graph = torch.fx.Graph()
    env = {}           # id(tensor) -> fx node
    inputs = []        # the external tensors, one placeholder each
    constants = {}     # id(tensor) -> tensor, tensors no guard loads (captured)
    checks = []        # (graph output index, expected scalar)
    scalar_sources = []
    literals = set()   # ids of the tensors torch.tensor(...) made: results never view them

    holders = []       # the placeholder of each input

    def external(t):
        node = graph.placeholder(f"in{len(inputs)}")
        node.meta["val"] = t
        inputs.append(t)
        holders.append(node)
        env[id(t)] = node
        return node

    def arg(a):
        if isinstance(a, torch.Tensor):
            node = env.get(id(a))
            if node is None:
                if id(a) not in trace.tensor_slot:
                    constants[id(a)] = a
                node = external(a)
            return node
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        if isinstance(a, (torch.ScriptObject, torch.Generator)):  # no literal of the graph's code can hold it
            what = "packed weights (torch.ao.quantization's dynamic quantization)" if \
                isinstance(a, torch.ScriptObject) else "a torch.Generator (generator=)"
            raise _NotCompilable(f"it calls {func} with {what}, which jit does not compile")
        return a

    leaves, treespec = _dynamic.result_leaves(result)
    object_sets = _object_sets(trace)
    set_values = [x for _, _, v in object_sets for x in
                  ([a for _, attrs in v for _, a in attrs] if isinstance(v, _Append) else
                   [a for _, a in v] if isinstance(v, _SetItems) else [v])]
    for leaf in leaves + set_values:  # arguments returned or set as they are, used by no op
        if isinstance(leaf, torch.Tensor) and id(leaf) in trace.tensor_slot and id(leaf) not in env:
            external(leaf)
    for func, args, kwargs, out in trace.recorder.ops:
        fargs, fkwargs = arg(args), {k: arg(v) for k, v in kwargs.items()}
        if func is torch.ops.aten._local_scalar_dense.default or func is _VALUES:
            scalar_sources.append((fargs[0], out))
            continue
        if func is torch.ops.aten.lift_fresh.default:
            # torch.tensor(...) in the traced code: a new tensor on every call, as eager makes one (the traced
            # one is a constant of the graph: written in place or returned, it would be shared by all calls)
            func = torch.ops.aten.lift_fresh_copy.default
            literals.add(id(args[0]))
        if func is torch.ops.aten.native_batch_norm.default and not fkwargs and _dynamic.writes_statistics(fargs):
            # batch norm in training mode writes its running statistics, which its schema does not say: made
            # functional (_functional), the writes are write-backs applied after the value checks, not writes
            # inside the graph that a failed check would leave made
            func = _dynamic.native_batch_norm
        node = graph.call_function(func, tuple(fargs), fkwargs)
        if isinstance(out, torch.Tensor):
            env[id(out)] = node
        elif isinstance(out, (list, tuple)):
            for k, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = graph.call_function(operator.getitem, (node, k))
                    env[id(o)] = item

    outputs, plan = [], []
    input_ids = {id(t): k for k, t in enumerate(inputs)}

    def entry(t):
        # an argument, or a tensor the code captured (a global) returned as it is: that object itself
        if id(t) in input_ids and (id(t) not in constants or env[id(t)] is holders[input_ids[id(t)]]):
            return ("in", input_ids[id(t)])
        if id(t) not in env:
            raise _NotCompilable("the result holds a tensor the traced code did not compute or receive")
        # a view marked conjugate or negative (z.conj() returned) is no view of the input's values: the graph's
        base = None if marked(t) else _alias_of(t, [None if id(x) in literals else x for x in inputs])
        if base is not None:
            # requires_grad as traced: a view that detach() made of an input that requires grad does not
            view = ("view", base, tuple(t.shape), tuple(t.stride()), t.storage_offset(), bool(t.requires_grad))
            if t.dtype != inputs[base].dtype:  # x.view(torch.int32), view_as_real(z): the input's bytes read as t's
                view += (str(t.dtype).removeprefix("torch."),)
                try:
                    same = _rebuilt_view(view, inputs).data_ptr() == t.data_ptr()
                except RuntimeError:
                    same = False
                if not same:
                    raise _NotCompilable(f"it returns a {t.dtype} view of an argument that no view of its "
                                         f"{inputs[base].dtype} elements makes")
            return view
        if user_attributes(t):  # r.tag = ...: Python attributes the call set on a tensor it returns
            raise _NotCompilable(f"a tensor of its result has Python attributes ({', '.join(user_attributes(t))}) "
                                 "that a compiled call would not set")
        if t.requires_grad:  # made to require grad in the call (torch.ones(3, requires_grad=True)): no graph does
            raise _NotCompilable(f"its result requires grad (a tensor the call made to require it; {_log.NO_TRAINING})")
        outputs.append(env[id(t)])
        return ("out", len(outputs) - 1)

    used = {}  # number of an argument object in trace.objects -> its number among the runner's objects

    def argument_object(k):
        return used.setdefault(k, len(used))

    object_number = {id(obj): k for k, (_, obj, _, _) in enumerate(trace.objects)}
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            plan.append(entry(leaf))
            continue
        if id(leaf) in object_number:  # an argument's object itself (the cache a generation step returns)
            plan.append(("obj", argument_object(object_number[id(leaf)])))
            continue
        held = _dynamic.held_tensors(leaf)
        if _reaches_tensor(leaf, {id(t) for _, t in held}):
            # in slots, a C type's fields: a copy of it (or of what holds it) would hold the traced call's
            raise _NotCompilable(f"the result holds a {type(leaf).__name__} that holds tensors outside a "
                                 "__dict__ (slots), which jit does not rebuild for each call")
        if not held:
            if _made_by_code(leaf):  # what it yields or computes is the call's, which no graph returns
                raise _NotCompilable(f"the result holds a {type(leaf).__name__}, whose values a compiled call would "
                                     "keep from the traced call (return the values themselves)")
            # the traced call's own value is the caller's: a mutable one is copied as it is now
            try:
                plan.append(("const", copy.deepcopy(leaf) if _mutable(leaf) else leaf))
            except Exception as exc:
                raise _NotCompilable(f"the result holds a {type(leaf).__name__} that cannot be copied for each call "
                                     f"({type(exc).__name__}: {exc})") from None
            continue
        # an object holding tensors (a DynamicCache): each call returns a copy with its own; the template
        # keeps none of the traced call's
        try:
            template = _dynamic.rebuilt(leaf, [(path, None) for path, _ in held])
        except Exception as exc:
            raise _NotCompilable(f"the result holds a {type(leaf).__name__} holding tensors that cannot be copied "
                                 f"({type(exc).__name__}: {exc})") from None
        plan.append(("object", template, [(path, entry(t)) for path, t in held]))
    def value(v):
        return entry(v) if isinstance(v, torch.Tensor) else ("const", v)

    sets = [(argument_object(k), attr, ("append", [(cls, [(a, value(x)) for a, x in attrs]) for cls, attrs in v])
             if isinstance(v, _Append) else ("setitems", [(key, value(x)) for key, x in v])
             if isinstance(v, _SetItems) else value(v)) for k, attr, v in object_sets]
    for node, value in scalar_sources:
        checks.append((len(outputs), value))
        outputs.append(node)
    graph.output(tuple(outputs))
    objects = [trace.objects[k] for k in sorted(used, key=used.get)]
    return graph, inputs, constants, (treespec, plan), checks, _Sets(sets, objects)


class _Sets:
    """What a traced call set on its argument objects, for a compiled call to
    set again: sets, (object number, attribute, plan entry of the value);
    objects, the trace.objects entries they number (the runner takes
    those objects after its tensors)."""

    __slots__ = ("sets", "objects")

    def __init__(self, sets, objects):
        self.sets, self.objects = sets, objects


def _object_sets(trace):
    """[(number in trace.objects, attribute, value)] of what the traced
    call set on its argument objects, in their dicts' order. Raises
    _NotCompilable for a change a compiled call would not make again: an
    attribute deleted, or set to a value that is no tensor, number,
    string, None or other value guarded by value, or a list or dict they
    hold changed."""
    sets = []
    for k, (_, obj, before, name) in enumerate(trace.objects):
        now = vars(obj)
        if list(now)[:len(before)] != list(before):
            raise _NotCompilable(f"it deletes an attribute of {name} during the call, which a compiled call "
                                 "would not")
        for attr, v in now.items():
            if attr in before and v is before[attr]:
                continue
            if not _settable_value(v):
                raise _NotCompilable(f"it sets {name}.{attr} to a {type(v).__name__} during the call, which a "
                                     "compiled call would not (it sets tensors, numbers, strings and None again)")
            sets.append((k, attr, v))
    for container, items, name in trace.object_parts:
        kept = len(container) >= len(items) and (
            all(a is b for a, b in zip(container, items)) if type(container) is list else
            list(container) == list(items) and all(container[key] is v for key, v in items.items()))
        if type(container) is dict:
            new = _items_set(trace, container, items)
            if new:
                sets.append((*trace.list_owner[id(container)], _SetItems(new)))
            if new is not None:
                continue
        new = _appended(trace, container, items) if kept and len(container) > len(items) else None
        if new is not None:
            sets.append((*trace.list_owner[id(container)], _Append(new)))
        elif not kept or len(container) != len(items):
            raise _NotCompilable(f"it changes {name} during the call, which a compiled call would not (it sets "
                                 "the attributes of objects again, and appends new objects of plain attributes "
                                 "to a list an object's attribute holds, not other items of lists and dicts)")
    return sets


class _Append(list):
    """The objects a call appended to a list an argument object's attribute
    holds, each (its class, [(attribute, value)]): a DynamicCache made
    without a config appends its layers in its first call."""


class _SetItems(list):
    """The items a call set in a dict an argument object's attribute holds,
    [(key, value)]: an EncoderDecoderCache notes each layer's cross-attention
    cache is filled (is_updated[layer] = True)."""


def _settable_value(v):
    """Whether a compiled call sets v again as the traced call did: a
    tensor (an output), or a number, string, None or other value by value."""
    return type(v) in _TENSOR_TYPES or type(v) in PRIMITIVES or _by_value(v)


def _items_set(trace, d, items):
    """[(key, value)] of the items dict d (an argument object's attribute)
    has that differ from its items as they were (new keys after the old
    ones, in order), or None where a compiled call could not set them
    again (a key deleted or moved, a value it cannot set, a dict no
    attribute holds)."""
    if id(d) not in trace.list_owner or list(d)[:len(items)] != list(items):
        return None
    out = [(k, v) for k, v in d.items() if k not in items or v is not items[k]]
    return out if all(type(k) in (str, int) and _settable_value(v) for k, v in out) else None


def _appended(trace, lst, items):
    """[(class, [(attribute, value)])] of the objects list lst (an
    argument object's attribute) has after its items as they were, or
    None where a compiled call could not make them again: an object that
    was there before, one that is no plain object (_dynamic.plain_object),
    or an attribute that is no tensor, number, string, None or other value
    guarded by value."""
    if id(lst) not in trace.list_owner or type(lst) is not list:
        return None
    out = []
    for v in lst[len(items):]:
        if id(v) in trace.owned or id(v) in trace.object_slot or not _dynamic.plain_object(v):
            return None
        attrs = list(vars(v).items())
        if not all(_settable_value(a) for _, a in attrs):
            return None
        out.append((type(v), attrs))
    return out


def _alias_of(t, inputs):
    """The index of the input whose memory t views, or None (inputs None are skipped)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except RuntimeError:
        return None
    for k, x in enumerate(inputs):
        if x is not None and x.untyped_storage().data_ptr() == ptr and ptr != 0:
            return k
    return None


def _functional(gm, inputs, tracing_mode="fake"):
    """gm as a functional, decomposed ATen graph (make_fx over functionalize)
    whose mutations of inputs are returned, not applied: (graph module,
    [(input index, output index)]). inputs are real tensors, or (with
    tracing_mode "real", inside their fake mode) fake ones."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from .backend import decompositions

    # gm holds autocast's casts as its trace made them: traced again under the caller's autocast, its ops would
    # be cast again (a matmul the code ran with autocast off inside, in bfloat16)
    with torch.autocast("cpu", enabled=False):
        fgm = make_fx(torch.func.functionalize(gm, remove="mutations"), decomposition_table=decompositions(),
                      tracing_mode=tracing_mode)(*inputs)
    placeholders = [n for n in fgm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in fgm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    writebacks = []
    for node in list(fgm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                and node.args[0] in placeholders:
            writebacks.append((placeholders.index(node.args[0]), len(outs)))
            outs.append(node.args[1])
            node.replace_all_uses_with(node.args[0])
            fgm.graph.erase_node(node)
    out_node.args = (tuple(outs),)
    fgm.graph.eliminate_dead_code()  # make_fx keeps ops whose results nothing reads
    fgm.graph.lint()
    fgm.recompile()
    return fgm, writebacks


class _QuietMeta:
    """While a build traces on this thread (with _quiet_meta: ...), the
    error FakeTensorMode logs with its traceback when an op's meta kernel
    refuses its inputs (~44 lines on stderr per trace) is dropped: the build
    says what it does about it (a real trace, or a static variant, in
    explain())."""

    def __init__(self):
        self.local = threading.local()
        import logging
        logging.getLogger("torch._subclasses.fake_tensor").addFilter(self.filter)

    def filter(self, record):
        return not (getattr(self.local, "on", 0) and
                    record.getMessage().startswith("failed while attempting to run meta"))

    def __enter__(self):
        self.local.on = getattr(self.local, "on", 0) + 1

    def __exit__(self, *exc):
        self.local.on -= 1


_quiet_meta = _QuietMeta()


def _fake_refused(exc):
    """Whether exc came from an op's fake or meta kernel (a meta function's
    own check, stricter than the CPU kernel's)."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.endswith(("_meta_registrations.py", os.path.join("_subclasses", "fake_impls.py"))):
            return True
        tb = tb.tb_next
    return False


def _copies(inputs):
    """inputs with each tensor cloned (a trace that runs its ops for real writes into them)."""
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _same_bytes(a, b):
    """Whether tensors a and b hold the same dtype, sizes and bytes (NaN is NaN, -0.0 is not 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def _grad_of(t):
    """t.grad, without the warning of a non-leaf tensor's (None)."""
    return t.grad if t.is_leaf else None


def _rebuilt_view(p, inputs):
    """The view plan entry p ("view", input, sizes, strides, offset,
    requires_grad[, dtype name]) describes, of this call's inputs."""
    x = inputs[p[1]]
    if len(p) > 6:  # the input's bytes as another dtype: sizes, strides and offset count its elements
        x = x.view(getattr(torch, p[6]))
    view = x.as_strided(p[2], p[3], p[4])
    if len(p) > 5 and view.requires_grad != p[5]:  # x.detach(), or x.detach().requires_grad_()
        view = view.detach().requires_grad_(p[5])
    return view


# The value the last side exit on this thread read (_Runner.__call__), for
# the words of the miss that follows it (_Tracer.explain); _SHARED where
# the call's tensors share memory and the variant writes into one.
_side_exit = threading.local()
_SHARED = object()


@contextlib.contextmanager
def _modes_off(inference, grad, autocast):
    """The modes a runner's graph runs in: inference mode (switched on
    inside the traced call), grad mode off (the call began with it on),
    CPU autocast off (the graph holds its casts)."""
    with contextlib.ExitStack() as stack:
        if autocast:
            stack.enter_context(torch.autocast("cpu", enabled=False))
        stack.enter_context(torch.inference_mode() if inference else torch.no_grad())
        yield


def _grad_mode_views(outs):
    """outs with each view among them (of a tensor the graph made) as a
    tensor of its own over the same memory: autograd refuses to let a view
    made with grad off be changed in place under grad mode (x.t().flatten()
    returned, then out.mul_(w) with a w that requires grad), where eager's
    result may be (the graph's views are often its own: eager's reshape of
    x.t() copies)."""
    if not any(type(o) in _TENSOR_TYPES and o._is_view() for o in outs):
        return outs
    return [o.detach() if type(o) in _TENSOR_TYPES and o._is_view() else o for o in outs]


class _Watched(list):
    """A list an argument object holds, of values jit cannot guard, in its
    place while the traced call runs (_Trace.watch): reading or changing
    it (its length too) marks it read."""

    __slots__ = ("read", "words")

    def _marks(name):
        method = getattr(list, name)

        def marked(self, *args, **kwargs):
            self.read = True
            return method(self, *args, **kwargs)

        marked.__name__ = name
        return marked

    for _name in ("__len__", "__getitem__", "__iter__", "__reversed__", "__contains__", "index", "count", "copy", "__eq__",
                  "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__repr__", "__reduce_ex__", "__add__",
                  "__mul__", "__rmul__", "__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
                  "insert", "pop", "remove", "clear", "sort", "reverse"):
        locals()[_name] = _marks(_name)
    del _name, _marks

    def __init__(self, items):
        super().__init__(items)
        self.read = False


class _Runner:
    """An entry's compiled call: the graph, its value checks, write-backs,
    and the result rebuilt in the shape eager returned."""

    __slots__ = ("compiled", "checks", "writebacks", "treespec", "plan", "single", "record", "sets", "objects", "dense",
                 "random", "grad", "inference", "autocast")

    def __init__(self, compiled, checks, writebacks, out_plan, sets=(), objects=0, dense=(), random=True, grad=False,
                 inference=False, autocast=False):
        self.record = None  # the id of its trace record, when it has one
        # the variant's calls begin in grad mode: no op of the trace recorded a history (the recorder refuses
        # one that would: compiled training is not built), as under @torch.no_grad() inside, so the graph
        # runs with grad mode off, where the ops it leaves to PyTorch would make one of inputs that require grad
        self.grad = grad
        self.inference = inference  # the trace's ops all ran in inference mode, switched on inside the call
        # the variant's calls begin under CPU autocast: the graph holds its casts as ops, where the trace made
        # them (not where the code turned it off inside), so the ops it leaves to PyTorch run with it off
        self.autocast = autocast
        self.compiled = compiled  # boxed: backend.compile_inference's result (a _C.Plan, or the eager graph)
        self.checks = checks
        self.writebacks = writebacks
        self.treespec, self.plan = out_plan
        # (object, attribute, plan entry): what the call sets on argument objects (_Sets), the objects
        # the last inputs, after the graph's tensors
        self.sets, self.objects = sets, objects
        # (input, _dynamic.dense_order) of the inputs copied dense first: any strides of theirs pass the guards
        self.dense = tuple(dense)
        self.random = random  # the graph draws random numbers (draws): a call that raises puts torch's RNG back
        # a result that is one computed tensor skips the rebuild
        self.single = self.plan[0][1] if self.treespec.is_leaf() and self.plan[0][0] == "out" else None

    def direct(self):
        """The entry's runner: a _C.ItemRunner calling the compiled plan
        itself when this runner would only pick one of its outputs (no value
        checks, no write-backs, one computed tensor returned); else this
        one."""
        if self.checks or self.writebacks or self.objects or self.dense or self.random or self.grad or \
                self.inference or self.autocast or self.single is None or not isinstance(self.compiled, _C.Plan):
            return self
        return _C.ItemRunner(self.compiled.call, self.single, self)

    def __call__(self, *inputs):
        objects = ()
        if self.objects:
            objects, inputs = inputs[-self.objects:], inputs[:-self.objects]
        if self.dense:
            inputs = list(inputs)
            for i, order in self.dense:
                inputs[i] = _dynamic.densified(inputs[i], order)
        # a side exit, or an exception, runs the call again eagerly: the numbers the graph drew (torch.rand)
        # are drawn again, as eager's
        rng = torch.get_rng_state() if self.checks or self.random else None
        if self.writebacks:
            # inputs that share memory (views of one another): eager's order of reads and writes matters;
            # a symbolic variant's inputs hold its sizes and numbers too. Tensors of no elements share none (every
            # empty tensor's storage is at address 0: an empty cache layer's keys and values missed every call)
            storages = [x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor) and x.numel()]
            if len(set(storages)) != len(storages):
                _side_exit.value = _SHARED
                return _C.SIDE_EXIT
        try:
            if self.inference or self.grad or self.autocast:
                with _modes_off(self.inference, self.grad, self.autocast):
                    outs = self.compiled(list(inputs))
            else:
                outs = self.compiled(list(inputs))
        except BaseException:
            if rng is not None:
                torch.set_rng_state(rng)
            raise
        for k, want in self.checks:
            if isinstance(want, torch.Tensor):  # values read with tolist(), str(): the same bytes
                same = _same_bytes(outs[k], want)
                got = f"a tensor of {outs[k].numel()} elements"
            else:
                got = outs[k].item()
                same = same_value(got, want)
            if not same:
                torch.set_rng_state(rng)
                _side_exit.value = got  # what the miss's words say it read now
                return _C.SIDE_EXIT
        if self.writebacks:
            if not torch.is_inference_mode_enabled() and any(inputs[i].is_inference() for i, _ in self.writebacks):
                # eager's write lands, then its version counter raises: the frame runs as eager runs it (a
                # write-back that raised after its write would have been made twice)
                raise RuntimeError("a write into an inference tensor outside inference mode")
            with torch.no_grad():
                for i, k in self.writebacks:
                    inputs[i].copy_(outs[k])
        if self.grad:
            outs = _grad_mode_views(outs)
        for k, attr, p in self.sets:  # as the traced call left them (a cache layer's keys and values)
            if p[0] == "append":  # new objects at the end of a list (a DynamicCache's layers)
                lst = vars(objects[k])[attr]
                for cls, attrs in p[1]:
                    new = object.__new__(cls)
                    vars(new).update((a, self._leaf(e, outs, inputs, objects)) for a, e in attrs)
                    lst.append(new)
            elif p[0] == "setitems":  # items of a dict (an EncoderDecoderCache's is_updated)
                d = vars(objects[k])[attr]
                for key, e in p[1]:
                    d[key] = self._leaf(e, outs, inputs, objects)
            else:
                vars(objects[k])[attr] = self._leaf(p, outs, inputs, objects)
        if self.single is not None:
            return outs[self.single]
        return pytree.tree_unflatten([self._leaf(p, outs, inputs, objects) for p in self.plan], self.treespec)

    @classmethod
    def _leaf(cls, p, outs, inputs, objects=()):
        """The result's leaf that plan entry p makes."""
        kind = p[0]
        if kind == "out":
            return outs[p[1]]
        if kind == "in":
            return inputs[p[1]]
        if kind == "obj":  # an argument's object, as the call left it
            return objects[p[1]]
        if kind == "view":
            return _rebuilt_view(p, inputs)
        if kind == "object":
            return _dynamic.rebuilt(p[1], [(path, cls._leaf(e, outs, inputs)) for path, e in p[2]])
        # a value the traced call returned: a mutable one (a set) is the caller's to change, as each eager call's is
        return copy.deepcopy(p[1]) if _mutable(p[1]) else p[1]


# -- the tracer the frame hook calls ----------------------------------------------

def _path_spec(spec, slot, t):
    """A guard program of the loads of spec that lead to slot (an
    argument, an item or key of one, ...) and a check that it holds a t."""
    chain = [slot]
    while spec[chain[-1]][0] not in ("arg", "const"):
        chain.append(spec[chain[-1]][1])
    out, moved = Spec(), {}
    for s in reversed(chain):
        inst = spec[s]
        if inst[0] not in ("arg", "const"):
            inst = (inst[0], moved[inst[1]], *inst[2:])
        moved[s] = out.add(inst, spec.names[s], spec.paths.get(s))
    out.add(("type", moved[slot], t), spec.names[slot])
    return out


def _set_entries(p):
    """The plan entries of the values a set (_Sets) makes: its own, the
    items' it sets, or the attributes' of the objects it appends."""
    if p[0] == "setitems":
        return [e for _, e in p[1]]
    if p[0] == "append":
        return [e for _, attrs in p[1] for _, e in attrs]
    return [p]


def _settable(p):
    """Whether a symbolic graph can set plan entry p on an object: a
    computed tensor, or a value by value (a size among them)."""
    return p[0] == "out" or p[0] == "const" and (type(p[1]) in PRIMITIVES or _by_value(p[1]))


def _wrote_before(trace):
    """Whether a trace of the same JitFunction wrote what trace writes (its
    words) before; notes that this one did."""
    jf = _jf_of(trace)
    if jf is None:
        return True
    wrote = jf.__dict__.setdefault("_tn_wrote", set())
    key = re.sub(r" at 0x[0-9a-f]+", "", trace.writes[0])  # which tensor it set is new on every call
    before = key in wrote
    wrote.add(key)
    return before


def _dead_after(trace):
    """Whether trace's guards fail on its arguments as the call left them
    (it set an attribute its guards snapshot)."""
    try:
        return _C.GuardSet(list(trace.spec)).check(*trace.args) >= 0
    except Exception:  # ours: taken as alive (its eager entry, with its warning)
        return False


def _types_spec(trace, hooks=False):
    """Guards that take every call with the types of trace's arguments (an
    eager entry whose reason holds whatever the sizes and values); with
    hooks, and with the modules' hooks the trace found: a write a hook
    makes on every call (the old weight_norm's, prune's) ends when the hook
    is removed (remove_weight_norm before serving), and the next call
    traces again (the entry took every call, eagerly, for good)."""
    spec = Spec()
    for i, a in enumerate(trace.args):
        spec.add(("type", spec.add(("arg", i), f"argument {i}"), type(a)), f"argument {i}")
    moved = {}
    for s, (inst, name) in enumerate(zip(trace.spec, trace.spec.names)):
        path = trace.spec.paths.get(s)
        if hooks and inst[0] == "const" and isinstance(path, tuple) and path[0] == "module" and \
                path[-1] in _HOOK_DICTS:
            moved[s] = spec.add(inst, name)
        elif inst[0] == "dict" and inst[1] in moved:
            spec.add((inst[0], moved[inst[1]], *inst[2:]), name)
    return spec


def _note_own_write(trace):
    """A trace whose guards fail on what its own call left, though no write
    of its was found (a forward pre-hook that sets a module's weight on each
    call: torch.nn.utils.prune, the old weight_norm and spectral_norm): that
    is its write, a problem (its build's own check dropped it as changed
    "while its variant was built", four times, and the function ran
    eagerly for good with those words)."""
    try:  # the arguments as the call found them (what it sets on argument objects, a compiled call sets too)
        failed = _C.GuardSet(list(trace.spec)).check(*trace.call_args)
        if failed < 0:
            return
        what = explain(trace.spec, trace.call_args, failed)
    except Exception:  # ours: the build's own check drops it, as before
        return
    trace.writes.append(f"it sets what its guards check during the call ({what}), which a compiled call would "
                        "skip (a forward pre-hook that sets a module's weight, as torch.nn.utils.prune and the old "
                        "weight_norm and spectral_norm do: torch.nn.utils.parametrize compiles)")
    trace.problems.append(trace.writes[-1])


def _jf_of(trace):
    """The JitFunction whose call trace is, or None."""
    return trace.jf() if trace.jf is not None else None


def _eager_entry(trace, spec, reason):
    """The entry of a trace that cannot be compiled: it runs eagerly, with
    one warning; the recompilation manager counts a failed trace. Where the
    reason is the call's modes' (_Recorder.any_size), it takes calls of
    every size: with grad mode on over parameters that require grad,
    each new sequence length traced again, failed, and the backoff ended
    in running every call eagerly for good, no_grad ones too. Such an
    entry is no failed trace of the function's: calls in grad mode from
    several threads at once each traced one before any entry was there,
    and four of them ran the function eagerly for good."""
    _log.warn_once(f"{_where(trace.fn)} runs eagerly: {reason}")
    jf = _jf_of(trace)
    modes = trace.recorder.any_size and reason == trace.recorder.problem
    if jf is not None and modes:
        _manager.decided(jf, f"calls in the traced call's modes run eagerly: {reason}")
    elif jf is not None:
        _manager.traced(jf, False, reason)
    if modes:
        sized, spec = spec, Spec()
        for inst, name in zip(sized, sized.names):
            if inst[0] == "tensor":  # any sizes, row-major (an eager entry answers any call right)
                inst = inst[:3] + ((None,) * len(inst[3]), None) + inst[5:]
            spec.add(inst, name)
        spec.paths = dict(sized.paths)
    return (spec, (), None)


def _with_numbers(out_plan, numbers):
    """out_plan with the numbers a symbolic graph returns ([(result leaf,
    path, graph output)]: sizes an object of the result holds, a
    transformers sliding-window cache's length) put in their objects' items,
    in place of the traced call's values its template holds."""
    if not numbers:
        return out_plan
    treespec, plan = out_plan
    plan = list(plan)
    for leaf, path, k in numbers:
        kind, template = plan[leaf][:2]
        assert kind in ("object", "const")  # a const: an object of sizes only (x.shape), made for each call
        items = list(plan[leaf][2]) if kind == "object" else []
        plan[leaf] = ("object", template, items + [(path, ("out", k))])
    return treespec, plan


def _dims_words(names, dims):
    """{slot: dimensions} (_dynamic.observe) in words: "x dim 1, n"."""
    return ", ".join(names[slot] if d is None else f"{names[slot]} strides (copied dense)"
                     if d == _dynamic.STRIDES_PLACE else f"{names[slot]} dim {d}"
                     for slot, ds in dims.items() for d in ds)


class _Again(Exception):
    """_Build._compile_with: calls noted while it ran made dims (more
    than its own) dynamic."""

    def __init__(self, dims):
        super().__init__()
        self.dims = dims


class _Build:
    """The compile of a prepared trace (_Tracer._prepare): its symbolic
    trace where sizes keep changing, the functional graph, the back end's
    plan, the trace record. Runs on the calling thread (compile_blocking,
    or no JitFunction to publish to) or on the build thread (_builds)."""

    def __init__(self, tracer, trace, graph, inputs, slots, out_plan, checks, sets):
        self.tracer, self.trace, self.graph, self.inputs = tracer, trace, graph, inputs
        self.slots, self.out_plan, self.checks, self.sets = slots, out_plan, checks, sets
        # the dimensions that keep changing, noted where the call traced (a build's child remembers nothing)
        self.dims = _dynamic.observe(trace)
        self.record = None  # the id of the trace record finish stored

    _AGAIN = 2  # times a build begins again, at most, as sizes noted meanwhile make more dimensions dynamic

    def _dims_now(self):
        """{slot: dimensions} that keep changing as of now: those noted
        where the call traced, and those the calls noted since make so
        (_Tracer._note_sizes: a server's next request, of another length,
        came while the first one's variant was built; a build's child
        knows those noted before it was forked)."""
        now = {slot: set(ds) for slot, ds in self.dims.items()}
        for slot, ds in _dynamic.observe(self.trace).items():
            now.setdefault(slot, set()).update(ds)
        return now

    def _grew(self, dims):
        """The dimensions that keep changing now, where more do than dims
        (the build's own): its variant would be specialised where the next
        calls' sizes are not; else None."""
        now = self._dims_now()
        return now if any(not ds <= dims.get(slot, set()) for slot, ds in now.items()) else None

    def finish(self):
        """The entry (spec, slots, runner), stored as a trace record when
        it can be; an eager one, with one warning, when compiling fails;
        None when what the trace read changed before the build was done (a
        symbolic trace runs the function again: it must have seen the state
        the guards describe)."""
        trace, jf = self.trace, _jf_of(self.trace)
        try:
            with _compile_lock, torch.set_grad_enabled(trace.state["grad mode"]):
                entry, record = self._compile()
                failed = _C.GuardSet(list(entry[0])).check(*trace.call_args)
                if failed >= 0:
                    change = explain(entry[0], trace.call_args, failed)
                    words = f"what the trace read changed while its variant was built ({change}); it is dropped"
                    _log.event("recompiles", f"{_where(trace.fn)}: {words} (the next call traces again)")
                    if jf is not None:
                        _manager.miss(jf, change)  # a global that changes on every call: the storm's words
                        _manager.traced(jf, False, words)
                    return None
                if _records_on():
                    entry[2].record = self.record = record()
                if jf is not None:
                    _manager.traced(jf, True, "compiled")
                return (entry[0], entry[1], entry[2].direct())
        except _NotCompilable as exc:
            return _eager_entry(trace, trace.spec, str(exc))
        except Exception as exc:  # any failure of ours: this variant runs eagerly
            return _eager_entry(trace, trace.spec, f"compiling the trace failed ({type(exc).__name__}: {exc})")

    def _compile(self):
        """(entry with its _Runner, a function storing its trace record and
        returning the record's id). Made again (_AGAIN times at most) where
        calls noted meanwhile make more dimensions dynamic than it was made
        with: the variant it would publish is specialised where the calls
        it is for are not, and the next one missed it to trace again (HF
        BERT served back to back: its static variant took 1.2 s in a
        child, and the calls ran eagerly through that build and the
        dynamic one's)."""
        dims = self._dims_now()
        for _ in range(self._AGAIN):
            try:
                return self._compile_with(dims, True)
            except _Again as exc:
                new = {slot: ds - dims.get(slot, set()) for slot, ds in exc.dims.items()}
                _log.event("recompiles", f"{_where(self.trace.fn)}: calls while its variant was built changed "
                                         f"{_dims_words(self.trace.spec.names, new)}; it is built again, dynamic there")
                dims = exc.dims
        return self._compile_with(dims, False)

    def _compile_with(self, dims, may_again):
        """_compile with dims dynamic; raises _Again (may_again) where more
        keep changing once its graph is made, or once it is compiled."""
        trace, inputs, slots, out_plan, checks = self.trace, self.inputs, self.slots, self.out_plan, self.checks
        tracer, sets = self.tracer, self.sets.sets
        objects = [slot for slot, _, _, _ in self.sets.objects]  # the runner's last inputs

        def again():
            now = self._grew(dims) if may_again else None
            if now is not None:
                raise _Again(now)

        with _quiet_meta:
            sym = tracer._symbolic(trace, inputs, checks, out_plan, dims, self.sets)
        again()
        from . import backend
        if sym is not None:
            spec = _dynamic.spec_of(trace, sym)
            captured = {id(t): s for t, s in zip(inputs, slots)}
            # tensors the symbolic run made itself (torch.tensor(...) in the code): constants by value
            slots = [s if isinstance(s, int) else captured[id(s)] if id(s) in captured else
                     spec.add(("const", s), "a tensor the traced code made", ("value", s)) for s in sym.slots]
            with torch.no_grad(), torch.autocast("cpu", enabled=False):  # the graph holds autocast's casts
                compiled = backend.compile_inference(sym.fgm, sym.examples)
            again()
            _C.stat_add("dynamic_traces")
            out_plan = _with_numbers(out_plan, sym.numbers)
            # an argument returned as it is (an encoder-decoder's encoder_last_hidden_state): its place among
            # the symbolic graph's inputs
            moved = {id(t): j for j, t in enumerate(sym.examples)}
            out_plan = (out_plan[0], [("in", moved[id(inputs[p[1]])]) if p[0] == "in" else p for p in out_plan[1]])
            runner = _Runner(compiled, sym.checks, sym.writebacks, out_plan, sym.sets, len(objects), sym.dense,
                             draws(sym.fgm), trace.state["grad mode"], trace.inference_inside,
                             trace.state["CPU autocast"])
            return (spec, tuple(slots + objects), runner), lambda: tracer._store(
                trace, sym.fgm, slots + objects, sym.checks, sym.writebacks, out_plan, compiled, sym.sets,
                len(objects), spec, sym.dense, runner.random, runner.inference)
        with torch.no_grad(), _quiet_meta:
            try:
                fgm, writebacks = _functional(torch.fx.GraphModule({}, self.graph), inputs)
            except Exception as exc:
                if not _fake_refused(exc):
                    raise
                # an op whose fake kernel refuses what its CPU kernel takes (as grouped_mm's does in float32,
                # which backend.grouped_mm takes instead): the graph traced on copies of the inputs, its ops
                # run for real (a static variant: the symbolic trace has no real run)
                fgm, writebacks = _functional(torch.fx.GraphModule({}, self.graph), _copies(inputs), "real")
        again()
        with torch.no_grad(), torch.autocast("cpu", enabled=False):  # the graph holds autocast's casts
            compiled = backend.compile_inference(fgm, inputs)
        again()
        runner = _Runner(compiled, checks, writebacks, out_plan, sets, len(objects), random=draws(fgm),
                         grad=trace.state["grad mode"], inference=trace.inference_inside,
                         autocast=trace.state["CPU autocast"])
        return (trace.spec, tuple(slots + objects), runner), lambda: tracer._store(
            trace, fgm, slots + objects, checks, writebacks, out_plan, compiled, sets, len(objects),
            random=runner.random, inference=runner.inference)


class _GcHold:
    """Python's cyclic collector paused from a trace's start to the end of
    its build (build_gc_off): a trace and its build allocate enough to set
    off a collection of the whole heap, ~0.3 s of the GIL with torch and
    transformers loaded, inside the traced call or a call served beside the
    build. Objects they drop while it is paused are freed by their counts
    without reaching the old generation. Holds nest; the last one resumes it
    where a hold found it on."""

    def __init__(self):
        self.lock = threading.Lock()
        self.holds = 0
        self.dropped = 0  # holds after_fork dropped, whose releases release nothing
        self.resume = False

    def hold(self):
        """One hold more; a release must follow."""
        with self.lock:
            if self.holds == 0:
                self.resume = gc.isenabled() and config.build_gc_off
                if self.resume:
                    gc.disable()
            self.holds += 1

    def release(self):
        """One hold less; True when this one resumed the collector. A hold
        taken before this process forked (after_fork dropped it) releases
        nothing."""
        with self.lock:
            if self.holds == 0:
                assert self.dropped > 0
                self.dropped -= 1
                return False
            self.holds -= 1
            if self.holds == 0 and self.resume:
                self.resume = False
                gc.enable()
                return True
            return False

    def after_fork(self):
        """In a forked child: the holds of its parent's builds, which no
        thread of the child will release, are dropped, and the collector
        resumes where they paused it (a server's worker forked while a build
        ran kept it off for good: its cycles were never collected)."""
        self.lock = threading.Lock()
        self.dropped, self.holds = self.dropped + self.holds, 0
        if self.resume:
            self.resume = False
            gc.enable()


_gc_hold = _GcHold()


class _Builds:
    """The build thread: compiles prepared traces one at a time, off the
    calling thread, and publishes each variant in place of the entry that
    ran eagerly meanwhile. While one is in flight, a call no entry takes
    runs eagerly without tracing (jit does not queue a storm of traces)."""

    WINDOW_NS = 100_000_000  # never_idle's shortest stretch

    def __init__(self):
        self.lock = threading.Lock()
        # the _Builds in flight: one, but for calls of several threads that traced at once (each saw none)
        self.pending = []
        # build threads that may not have ended: idle is set before a thread drops what it holds (its
        # arguments, the build's tensors), which the exit waits for too (join)
        self.threads = []
        self.since = None         # _C.build_busy() when the last build began
        self.idle = threading.Event()
        self.idle.set()
        self.fork_for = None      # _watch: the _Build a call is to fork a child for; FORKING while one does
        self.forked = threading.Event()  # set when that call is done (self.fork_child: its child or None)
        self.fork_child = None

    FORKING = object()

    def busy(self):
        return not self.idle.is_set()

    def building(self, jf):
        """The spec of jf's entry whose variant is being built (it runs
        eagerly until published), or None."""
        return next((build.trace.spec for build in list(self.pending) if _jf_of(build.trace) is jf), None)

    def _window(self):
        """(ns since the last build began, ns of it some jitted call was in
        flight or had ended less than build_resume_us before: a paused
        build sleeps through such gaps); (0, 0) before any build."""
        if self.since is None:
            return 0, 0
        busy, now = _C.build_busy()
        busy0, then = self.since
        return now - then, busy - busy0

    def never_idle(self):
        """Whether jitted calls were in flight build_child_busy_pct of the
        time or more since the last build began (WINDOW_NS at least), gaps
        shorter than build_resume_us counted in (_window): a server that
        leaves a build thread no gap to run in, or a generate() loop whose
        steps leave it 0.3 ms gaps it sleeps through (build_worker=auto).
        Since it began, not ended: sizes that vary on every call miss again
        at the call after a build is published."""
        span, busy = self._window()
        return span >= self.WINDOW_NS and busy * 100 >= config.build_child_busy_pct * span

    def submit(self, build):
        with self.lock:
            self.idle.clear()
            self.pending.append(build)
        _gc_hold.hold()  # released when the build ends
        threads = torch.get_num_threads()  # the calling thread's: its calls run on them
        t0 = time.perf_counter()
        never_idle = self.never_idle()
        self.since = _C.build_busy()  # never_idle's window: from this build's start
        # auto, where the calls before left gaps (or there were none): the calls of the next WINDOW_NS decide
        watch = not never_idle and config.build_worker == "auto" and _BuildChild.possible(build.trace)
        try:
            # forked here, on the thread whose call traced, between its PyTorch ops: no thread of ours is inside
            # MKL, whose allocator's lock a child forked from the build thread found taken (by a call's OpenMP
            # thread in a GEMM) and spun on for good
            child = None if watch else _BuildChild.start(build, threads, never_idle)
        except BaseException:
            _gc_hold.release()
            self._done(build)
            raise
        build.location = _log.user_location()  # its warnings' (the build thread has no line of the user's)
        build.thread = threading.Thread(target=self._run, args=(build, threads, child, t0, watch),
                                        name="torchneuron_jit build", daemon=True)
        build.thread.start()
        with self.lock:
            self.threads = [t for t in self.threads if t.is_alive()] + [build.thread]

    def join(self, timeout):
        """Waits, timeout seconds at most in all, for the build threads to
        end; True when none is left."""
        deadline = time.monotonic() + timeout
        for thread in list(self.threads):
            thread.join(max(deadline - time.monotonic(), 0))
        return not any(t.is_alive() for t in self.threads)

    def _done(self, build):
        """build is no longer in flight; idle when none is (wait returns)."""
        with self.lock:
            self.pending.remove(build)
            if not self.pending:
                self.idle.set()

    def _watch(self, build):
        """build_worker=auto where the calls before this build left gaps
        (or there were none: a process's first build): the calls of its
        first WINDOW_NS decide. Calls in flight back to back (never_idle)
        get it a child, forked at the start of the next outermost jitted
        call, on that call's thread (tracer.fork_build, _C.build_fork_wanted:
        the build thread's own fork can catch MKL's allocator lock held);
        calls with gaps leave it to this thread. The child, or None."""
        gaps_max = (100 - config.build_child_busy_pct) * self.WINDOW_NS // 100
        while True:
            span, busy = self._window()
            if span - busy > gaps_max:  # gaps enough that the window cannot be never_idle: decided at once
                return None
            if span >= self.WINDOW_NS:
                break
            time.sleep(min(self.WINDOW_NS - span, self.WINDOW_NS // 20) / 1e9 + 0.001)
        if not self.never_idle():
            return None
        with self.lock:
            self.fork_for, self.fork_child = build, None
            self.forked.clear()
        _C.build_fork_wanted(True)
        if not self.forked.wait(0.5):  # no call started: this thread builds
            with self.lock:
                if self.fork_for is not self.FORKING:
                    self.fork_for = None
                    _C.build_fork_wanted(False)
                    return None
            self.forked.wait()  # a call is forking it now
        with self.lock:
            child, self.fork_child = self.fork_child, None
        if child is not None:
            _log.event("compile", f"{_where(build.trace.fn)}: calls were in flight back to back as its build began; "
                                  f"a child process builds it")
        return child

    def fork_here(self):
        """tracer.fork_build: the child _watch asked for, forked on the
        thread of an outermost jitted call that is about to start."""
        with self.lock:
            build = self.fork_for
            if build is None or build is self.FORKING:
                return
            self.fork_for = self.FORKING
        child = None
        try:
            child = _BuildChild.start(build, torch.get_num_threads(), True, wait=False)
        finally:
            with self.lock:
                self.fork_for, self.fork_child = None, child
                self.forked.set()

    def _run(self, build, threads, child, t0, watch):
        _log.locate(build.location)
        try:
            _fxgate.gate_dynamo()
            if watch:
                child = self._watch(build)
            # pauses while jitted calls are in flight, and a little after
            _C.build_yield()  # as the tunables say: build_pause_ms, build_resume_us
            # its own ops on one OpenMP thread, its GEMM measurements on the calls' (gemm.measured_with)
            gemm.own_threads(1)
            entry = child.result() if child is not None else _BuildChild.NONE
            if entry is _BuildChild.NONE:
                with gemm.measured_with(threads):
                    entry = build.finish()
            trace = build.trace
            jf = _jf_of(trace)
            if jf is None:
                return
            jf.publish(trace.spec, entry)  # None: dropped, the next call traces again
            _log.event("compile", f"{_where(trace.fn)}: variant published after "
                                  f"{(time.perf_counter() - t0) * 1e3:.0f} ms in the background"
                                  + (" (built by a child process)" if child is not None and child.used else ""))
        except Exception as exc:  # ours: the entry that runs eagerly stays
            if not _BuildChild.exiting:  # at exit, its child killed (ChildProcessError): nothing the user can do
                _log.warn_once(f"building a variant of {_where(build.trace.fn)} in the background failed "
                               f"({type(exc).__name__}: {exc}); it runs eagerly")
        except _BuildStopped:  # at exit (_at_exit): the process ends without it
            pass
        finally:
            if _gc_hold.release():
                # what the trace and the build allocated, young (the paused collector promoted none of it), is
                # collected now, between calls, not inside some later one. Not the whole heap: that took 152 ms
                # of the GIL with transformers loaded, and a call served meanwhile waited for all of it
                gc.collect(1)
            _C.build_yield(0)
            self._done(build)

    def wait(self, timeout=None):
        """Waits for the build in flight (if any); True when none is left."""
        return self.idle.wait(timeout)

    def stop(self):
        """At exit: raises _BuildStopped in each build thread still going,
        at its next Python instruction."""
        for build in list(self.pending):
            thread = getattr(build, "thread", None)
            if thread is not None and thread.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                           ctypes.py_object(_BuildStopped))


class _BuildStopped(BaseException):
    """Raised in a build thread the process's exit stops (a BaseException:
    no handler of the code it runs, ours or PyTorch's, takes it)."""


class _BuildChild:
    """A background build made by a forked child process (build_worker):
    the symbolic trace, the lowering and the kernels, stored as a trace
    record, which the build thread then loads. A build on the thread is
    ~1 s of Python that needs the GIL, and a server calling back to back
    never lets go of it long enough (build_pause_ms); the child needs none
    of the parent's, and builds in the idle scheduling class, on a core the
    calls leave free, or, where they leave none, one they lend it, or, where
    it starves even so, at our priority, stopped while calls are in flight
    (_child, _C.build_wait_child). It is forked on the thread whose call traced,
    between its PyTorch ops. What the child learnt besides its record (the
    manager's decisions, counters, warnings) comes back in a file. Where
    the child cannot build the variant, the thread does."""

    NONE = object()  # result(): the child built nothing, the thread builds
    live = set()  # pids of children not waited for yet
    exiting = False  # kill_all ran: a build whose child it killed fails, and says nothing

    @classmethod
    def kill_all(cls):
        """At exit: no child outlives the process (a build still going after
        the wait for it, or one stuck)."""
        cls.exiting = True
        for pid in list(cls.live):
            for kill in (os.killpg, os.kill):  # its group: its worker too
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
        cls.live.clear()

    def __init__(self, build, threads, pid, report):
        self.build, self.threads, self.pid, self.report = build, threads, pid, report
        self.used = False

    @staticmethod
    def possible(trace):
        """Whether a child can build trace's variant: a child hands it over
        as a trace record, made under fork."""
        return (_records_on() and sys.platform == "linux" and hasattr(os, "fork")
                and not trace.state.get("CPU autocast"))

    @classmethod
    def start(cls, build, threads, never_idle, wait=True):
        """The child building build (forked from this thread), or None where
        build_worker says thread (auto: unless never_idle, _Builds.never_idle)
        or a child could not be used (wait=False: nor while another thread
        compiles)."""
        trace = build.trace
        worker = config.build_worker
        if worker == "auto":
            worker = "process" if never_idle else "thread"
        if worker != "process" or not cls.possible(trace):
            return None
        try:
            from . import backend
            backend._share_torch_threads()
        except Exception as exc:  # ours: the child is lent no thread
            _log.event("compile", f"finding how calls lend a thread to a build failed ({type(exc).__name__}: {exc})")
        try:
            # nothing else compiles (make_fx's globals, the FX code generator's) while the child is made
            if not _compile_lock.acquire(blocking=wait):
                _log.event("compile", f"{_where(trace.fn)}: no child for its build (another compile was in "
                                      f"flight); built on the thread")
                return None
            try:
                report = tempfile.TemporaryFile(prefix="tn_build_")  # the child writes, the parent reads
                global _forking_build
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads running
                    _forking_build = True  # the child is this build's: it keeps the state it is forked with
                    try:
                        pid = os.fork()
                    finally:
                        if pid != 0:
                            _forking_build = False
            finally:
                _compile_lock.release()
        except OSError as exc:
            _log.event("compile", f"{_where(trace.fn)}: no child for its build ({exc}); built on the thread")
            return None
        if pid == 0:  # never returns; where calls keep every core busy, it measures on the one they lend it
            cls._child(build, threads, 1 if never_idle else None, report.fileno())
        try:
            os.setpgid(pid, pid)  # as the child does: its group exists before either goes on
        except OSError:
            pass
        cls.live.add(pid)
        return cls(build, threads, pid, report)

    @staticmethod
    def _child(build, threads, run_on, fd):
        """The child's whole life, in a process group of its own: a worker
        forked from it builds in the idle class, on a core the calls leave
        idle or one they lend it; where the worker starves there even so
        (calls on one thread, other processes' work), the parent kills it
        (_C.build_wait_child) and this process builds in its place, at its
        own priority, stopped while calls are in flight (an unprivileged
        process cannot leave the idle class). Then it exits as the build
        did."""
        status = 1
        try:
            try:
                os.setpgid(0, 0)  # the parent stops it for calls and kills it whole
            except OSError:
                pass
            try:
                worker = os.fork()
            except OSError:
                worker = 0  # no worker: this process builds in the idle class
            if worker == 0:
                try:
                    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                except OSError:
                    os.nice(19)
                status = _BuildChild._build(build, threads, run_on, fd, False)
            else:
                _, worker_status = os.waitpid(worker, 0)
                if os.WIFSIGNALED(worker_status) and os.WTERMSIG(worker_status) == signal.SIGKILL:
                    os.ftruncate(fd, 0)  # what the worker wrote before it was killed
                    os.lseek(fd, 0, os.SEEK_SET)
                    status = _BuildChild._build(build, threads, run_on, fd, True)
                else:
                    status = os.WEXITSTATUS(worker_status) if os.WIFEXITED(worker_status) else 1
        except BaseException:  # the parent builds on its thread instead
            pass
        finally:
            os._exit(status)

    @staticmethod
    def _build(build, threads, run_on, fd, starved):
        """In the child: build (its GEMM measurements on run_on threads,
        gemm.measured_with) and report on fd; 0 when reported. starved:
        its worker in the idle class starved, and this process built it."""
        try:
            gemm.own_threads(1)
            journal = []
            decided, traced, replayed = _manager.decided, _manager.traced, threading.local()

            def note_decided(jf, words, dynamic=()):
                journal.append(("decided", words, list(dynamic)))
                replayed.on = True  # its event is the parent's, as it replays the decision
                try:
                    decided(jf, words, dynamic)
                finally:
                    replayed.on = False

            def note_traced(jf, ok, words):
                journal.append(("traced", ok, words))
                traced(jf, ok, words)

            def note_event(kind, message):
                if not getattr(replayed, "on", False):
                    journal.append(("event", kind, message))

            # its events are printed by the parent, in order with its decisions: a notebook's sys.stderr is the
            # kernel's stream, which a forked child's lines do not reach, and a decision was printed twice
            _manager.decided, _manager.traced, _log.event = note_decided, note_traced, note_event
            before = _C.stats()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with gemm.measured_with(threads, run_on):
                    entry = build.finish()
            after = _C.stats()
            jf = _jf_of(build.trace)
            site = _manager.site(jf) if jf is not None else None
            built = entry is not None and entry[2] is not None and build.record is not None
            report = {"record": build.record if built else None,
                      "why": None if built else "it stored no trace record" if entry is not None
                      else "what the trace read changed",
                      "journal": journal, "static": dict(site.static) if site is not None else {},
                      "stats": {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)},
                      "warnings": [(str(c.message), c.category) for c in caught], "starved": starved}
            data = pickle.dumps(report)
            while data:
                data = data[os.write(fd, data):]
            return 0
        except BaseException:  # the parent builds on its thread instead
            return 1

    def _wait(self):
        """The child's report (a dict), or the reason there is none."""
        try:
            status = _C.build_wait_child(self.pid, max(config.build_worker_timeout_s, 1))
            if status is None:
                return f"it took more than build_worker_timeout_s = {config.build_worker_timeout_s} s"
            if status != 0:
                return f"it ended with wait status {status}"
            self.report.seek(0)
            return pickle.loads(self.report.read())
        finally:
            self.live.discard(self.pid)
            self.report.close()

    def result(self):
        """The entry built by the child, loaded from its trace record; NONE
        when the thread must build it."""
        trace, jf = self.build.trace, _jf_of(self.build.trace)
        report = self._wait()
        if isinstance(report, dict) and report["record"] is not None and jf is not None:
            try:
                # the record's key as the trace's state and the calls' threads make it
                with torch.set_grad_enabled(trace.state["grad mode"]), gemm.measured_with(self.threads):
                    entries, _ = _tracer._load(trace.fn, trace.call_args, jf, only=report["record"], count=False)
            except Exception as exc:  # ours: the thread builds it
                report = f"loading its record failed ({type(exc).__name__}: {exc})"
            else:
                if entries:
                    if report.get("starved"):
                        _log.event("compile", f"{_where(trace.fn)}: the build's child starved in the idle class "
                                              f"(every core busy); it built at our priority, paused for calls")
                    self._replay(report, jf)
                    self.used = True
                    return entries[0]
                report = "its record did not apply"
        elif isinstance(report, dict):
            report = report["why"] or "no function to publish to"
        _log.event("compile", f"{_where(trace.fn)}: the build's child built no variant ({report}); "
                              f"building on the thread")
        return self.NONE

    @staticmethod
    def _replay(report, jf):
        """What the child learnt, here: the manager's decisions and
        counters, its events and the warnings it gave."""
        for kind, *args in report["journal"]:
            if kind == "event":
                _log.event(*args)
            else:
                (_manager.decided if kind == "decided" else _manager.traced)(jf, *args)
        _manager.site(jf).static.update(report["static"])
        for name, n in report["stats"].items():
            if n > 0:
                _C.stat_add(name, n)
        for message, category in report["warnings"]:
            if message.startswith("torchneuron_jit: "):
                _log.warn_once(message[len("torchneuron_jit: "):])
            else:
                warnings.warn(message, category, stacklevel=_log.caller_level())


# FX traces and Dynamo compiles exclude each other across threads (_fxgate): made when the package is
# imported after torch, else here, before a function of this process is traced
_fxgate.serialise_fx_tracing()
_builds = _Builds()
atexit.register(_BuildChild.kill_all)  # after the wait below (atexit runs the last registered first)


def _after_fork_in_child():
    """A forked process (a DataLoader or server worker, a build's child)
    holds none of its parent's threads: no build is in flight in it, no
    child of its parent is its own, and no lock the parent's threads held
    is held. It inherited a build in flight that no thread would finish:
    each miss ran eagerly, and its exit waited 30 s for it."""
    global _compile_lock
    if _forking_build:  # a build's own child (_BuildChild.start), which builds what it was forked for
        return
    _builds.__init__()
    _BuildChild.live = set()
    _compile_lock = threading.Lock()
    _gc_hold.after_fork()


_forking_build = False  # _BuildChild.start is forking a build's child
os.register_at_fork(after_in_child=_after_fork_in_child)


_EXIT_WAIT_S = 30  # how long the process's exit waits for a build in flight


def _at_exit():
    """A variant being built is stored for the next process: the exit waits
    for it, _EXIT_WAIT_S at most. Then it stops the build (its child, or
    the thread, at its next Python instruction), and waits for its thread
    to end: a daemon thread still in PyTorch's C++ code when the
    interpreter finalised aborted the process ("terminate called without
    an active exception", SIGABRT or SIGSEGV) after a script's last line:
    a build is done before its thread has dropped its arguments (the
    build's tensors, freed in finalisation, took the GIL back), so the exit
    joins the threads too."""
    if _builds.wait(_EXIT_WAIT_S):
        _builds.join(10)
        return
    _log.event("compile", f"exit: a variant still being built after {_EXIT_WAIT_S} s is given up")
    _BuildChild.kill_all()
    _builds.stop()
    _builds.wait(10)
    _builds.join(10)


atexit.register(_at_exit)


def wait(timeout=None):
    """Waits until no variant is being built in the background (each miss
    answers eagerly and builds its variant off the calling thread; tests and
    benchmarks wait for it). True when none is left within timeout seconds."""
    return _builds.wait(timeout)


def _under_transform():
    """Whether a torch.func transform (vmap, grad, jacrev) is running: its
    tensors are wrappers without memory of their own, which a guard cannot
    describe and a kernel cannot read; such calls run eagerly, and count
    as no failed trace (per-sample gradients made the model eager for
    good, its plain no_grad calls too)."""
    return torch._C._functorch.peek_interpreter_stack() is not None


_NOTE_SHARE = 0.05  # of the time, at most, that untraced misses spend noting their sizes (_Tracer._note_sizes)
_NOTE_BURST = 0.005  # s of it that calls after a quiet stretch may spend at once


class _NoteBudget:
    """A token bucket for _Tracer._note_sizes: it fills at _NOTE_SHARE of
    the time that passes, up to _NOTE_BURST, and each note takes what it
    took. Calls that run eagerly while a variant is built (every step of
    generate() until its variants are out) then pay ~5% for their sizes,
    not 30%; the sizes of the calls left out go unnoted, those of the
    next trace's call are noted as it traces."""

    def __init__(self):
        self.lock = threading.Lock()
        self.tokens = _NOTE_BURST
        self.at = time.perf_counter()

    def take(self):
        """Whether a note may be made now."""
        with self.lock:
            now = time.perf_counter()
            self.tokens = min(_NOTE_BURST, self.tokens + (now - self.at) * _NOTE_SHARE)
            self.at = now
            return self.tokens > 0

    def spend(self, seconds):
        with self.lock:
            self.tokens -= seconds


_note_budget = _NoteBudget()


class _Tracer:
    """The Python side of csrc/tracer (tracer.h lists the protocol)."""

    def begin(self, fn, args, codes, reason, jf=None):
        if _builds.busy():
            _C.stat_add("calls_while_building")
            if jf is not None:
                _manager.site(jf).while_building += 1
            _log.event("recompiles", f"{_where(fn)}: runs eagerly while a variant is built"
                       + (f" ({reason})" if reason else ""))
            self._note_sizes(fn, args, jf)
            return None
        if jf is not None and not _manager.may_trace(jf):
            self._note_sizes(fn, args, jf)
            return None
        if _under_transform():  # no trace, no failed one: the function's calls outside the transform compile
            _log.event("recompiles", f"{_where(fn)}: runs eagerly inside a torch.func transform")
            return None
        if reason is not None:
            _log.event("recompiles", f"{_where(fn)}: {reason}")
        # released by end or abort. Before the arguments' guards: noting the state of a module argument
        # allocates as the trace does (HF BERT's set off a collection of the whole heap there, 217-239 ms)
        _gc_hold.hold()
        try:
            trace = _Trace(fn, args, codes, jf)
            # the arguments as the call got them (the frame may fill its own **kwargs dict, the code may set
            # an argument object's attributes): what a symbolic trace calls fn with, and what a background
            # build checks its guards on
            try:
                trace.call_args = _dynamic.state_copy(args, memo=trace.arg_copies)
            except Exception as exc:  # an object of an abstract class, say: the call runs eagerly
                trace.problems.append(f"copying its arguments as they were failed ({type(exc).__name__}: {exc})")
        except BaseException:
            _gc_hold.release()
            raise
        try:
            trace.guard_arguments()
            trace.watch()
        except Exception as exc:  # ours: the call still runs eagerly, and later ones too
            trace.problems.append(f"guarding the arguments failed ({type(exc).__name__}: {exc})")
        trace.prev_profile = sys.getprofile()
        sys.setprofile(trace.profile)
        trace.recorder.__enter__()
        return trace

    @staticmethod
    def _note_sizes(fn, args, jf):
        """The sizes of an untraced miss's tensor arguments, noted as a
        trace's are (_dynamic.observe): the next trace knows every
        dimension that changed, not only those of the calls it traced.
        Within _NOTE_SHARE of the time (_note_budget): a T5 decoder step's
        sizes took 0.45 ms of Python, and its call 1.6 ms."""
        if not _note_budget.take():
            return
        start = time.perf_counter()
        try:
            trace = _Trace(fn, args, [], jf)
            trace.sizes_only = True  # a module's parameters keep their sizes (~1 ms for BERT's)
            trace.guard_arguments()
            _dynamic.observe(trace)
        except Exception as exc:  # ours: the sizes go unnoted
            _log.event("recompiles", f"{_where(fn)}: noting the sizes of a call failed ({type(exc).__name__}: {exc})")
        finally:
            _note_budget.spend(time.perf_counter() - start)

    def abort(self, trace):
        trace.recorder.__exit__(None, None, None)
        sys.setprofile(trace.prev_profile)
        trace.unwatch()
        _gc_hold.release()

    def end(self, trace, result):
        trace.recorder.__exit__(None, None, None)
        sys.setprofile(trace.prev_profile)
        trace.unwatch()
        # the hook noted (code, globals) at each frame: HF BERT's call made 11,000 of 300 distinct ones,
        # and each reader went through all (library_code 22,000 times: 9 of the traced call's 19 ms)
        trace.codes = list({(id(c), id(g)): (c, g) for c, g in trace.codes}.values())
        try:
            return self._end(trace, result)
        finally:
            _gc_hold.release()  # a background build took a hold of its own

    def _end(self, trace, result):
        if trace.recorder.raised is not None:
            # the code caught an op's exception (torch.linalg.cholesky of a matrix that is not positive
            # definite): the graph would take the except clause's path on every call. No entry: the next call
            # traces again, and a compiled variant that raises runs its call again eagerly (jit_frame)
            words = f"{trace.recorder.raised}, which the code caught; no variant is made of this call"
            _log.event("recompiles", f"{_where(trace.fn)}: {words}")
            if _jf_of(trace) is not None:
                _manager.traced(_jf_of(trace), False, words)
            return None
        try:
            trace.check_writes()
        except Exception as exc:  # ours: this variant runs eagerly
            trace.problems.append(f"checking what the call wrote failed ({type(exc).__name__}: {exc})")
        try:
            trace.relax_module_dicts()  # an eager entry's guards too: a call they pass runs eagerly again
        except Exception as exc:  # ours: the attributes stay guarded by value
            _log.event("recompiles", f"{_where(trace.fn)}: relaxing module attribute guards failed "
                                     f"({type(exc).__name__}: {exc})")
        for (filename, line), what in trace.side_effects.items():
            _warn_skipped_call(trace.fn, filename, line, what)
        if not trace.problems:
            _note_own_write(trace)
        spec = trace.spec
        if trace.unguardable is not None and trace.problems[0] is trace.unguardable[0]:
            # its eager entry takes every call with a value of that type there, whatever the other arguments
            # (a generation loop's DynamicCache: its lengths would be a trace, a miss and a backoff per step)
            spec = _path_spec(trace.spec, *trace.unguardable[1:])
        elif trace.recorder.nested and not trace.problems:
            # whatever the sizes (a padding mask of each length would be a trace and a failed compile each)
            trace.problems.append(trace.recorder.nested)
            spec = _types_spec(trace)
        elif trace.writes and trace.problems[0] is trace.writes[0] and _wrote_before(trace):
            # a second trace that writes it: its eager entry takes every call with these argument types (a
            # guard on the state it writes would miss on the next call, and trace again, on every call). The
            # first one's guards what the trace read: a write made once (a library's set-up on a first call:
            # transformers installs its output hooks in the first call with output_hidden_states) lets the
            # next call trace again, and compile
            spec = _types_spec(trace, hooks=True)
        elif trace.writes and trace.problems == trace.writes[:1] and _dead_after(trace):
            # the first trace that writes it, and its own guards fail on what the call left (a library's set-up
            # on a first call): its eager entry would take no call, and its warning would say the function runs
            # eagerly. No entry and no warning: the next call traces again (a write on every call is the second
            # trace's, above)
            words = f"{trace.problems[0]}; the call changed what its guards check, so no variant is made of it"
            _log.event("recompiles", f"{_where(trace.fn)}: {words}")
            if _jf_of(trace) is not None:
                _manager.decided(_jf_of(trace), words)
            return None
        for name, value in trace.state.items():
            spec.add(("call", _records.state_reader(name), value), name)
        try:
            with _compile_lock:
                build = self._prepare(trace, result)
        except _NotCompilable as exc:
            return _eager_entry(trace, spec, str(exc))
        except Exception as exc:  # any failure of ours: this variant runs eagerly
            return _eager_entry(trace, spec, f"compiling the trace failed ({type(exc).__name__}: {exc})")
        if config.compile_blocking or _jf_of(trace) is None or trace.state.get("CPU autocast"):
            return build.finish()  # None: no entry (the next call traces again)
        # the call's own result is eager's; the variant runs eagerly until its build is published
        _builds.submit(build)
        return (spec, (), None)

    def _prepare(self, trace, result):
        """What must be read of the trace while the state it saw stands:
        its graph, the guards on what it read, its inputs' slots. Returns
        the _Build that compiles it (raises _NotCompilable)."""
        if trace.problems:
            raise _NotCompilable(trace.problems[0])
        if trace.recorder.problem:
            raise _NotCompilable(trace.recorder.problem)
        trace.inference_inside = bool(trace.recorder.inside) and not trace.recorder.inference
        disabled = sorted({code.co_qualname for code, _ in trace.codes if _C.jit_disabled(code)})
        if disabled:
            raise _NotCompilable(f"it calls {', '.join(disabled)}, marked by torchneuron_jit.disable")
        graph, inputs, constants, out_plan, checks, sets = _graph_of(trace, result)
        if sets.sets:
            trace.guard_distinct()
            if _jf_of(trace) is not None:
                _manager.sets(_jf_of(trace), [f"{trace.objects[k][3]}.{attr}" for k, attr, _ in sets.sets])
        for t in trace.tensors:
            trace.guard_grad(f"{trace.spec.names[trace.tensor_slot[id(t)]]}.grad", trace.grads.get(id(t)), constants)
        for t in constants.values():  # a parameter a list, a dict or an object holds (for p in params: p.grad)
            trace.guard_grad("the .grad of a tensor that a container, an object or a closure holds", _grad_of(t),
                             constants)
        trace.guard_globals(constants)
        trace.guard_tensor_methods()
        trace.guard_tensor_attributes(list(trace.tensors) + list(constants.values()))
        trace.guard_hashed()
        trace.guard_closure()
        trace.guard_named_held()
        trace.guard_library_held()
        trace.check_lenient()
        if trace.problems:
            raise _NotCompilable(trace.problems[0])
        trace.relax_module_dicts()  # and those of the modules globals, closures and the guards above reach
        # tensors torch.tensor(...) made in the traced code: the same values on every call
        fresh = {id(args[0]) for func, args, _, _ in trace.recorder.ops if func is torch.ops.aten.lift_fresh.default}
        slots = []
        for t in inputs:
            slot = trace.tensor_slot.get(id(t))
            if slot is None:
                words = "a tensor the traced code captured"
                slot = trace.spec.add(("const", t), words, ("value", t) if id(t) in fresh else None)
                if id(t) not in fresh:  # one a container or an object holds: requires_grad_() changes it in place
                    trace.tensor_guard(slot, t, words)
            slots.append(slot)
        trace.recorder.ops = []  # the graph holds what the build needs
        return _Build(self, trace, graph, inputs, slots, out_plan, checks, sets)

    @staticmethod
    def _symbolic(trace, inputs, checks, out_plan, dims, sets):
        """The trace made again with the dimensions (and int and float
        arguments) that keep changing symbolic (_dynamic), or None when there
        are none or it cannot be (then the variant is specialised to this
        call's sizes, and the reason is a recompiles event). dims: the
        dimensions that keep changing (_dynamic.observe). When a symbolic
        trace with such arguments fails (an op that needs them concrete), the
        dimensions are tried without them; a number found static stays so.
        sets: what the call set on argument objects (_Sets)."""
        jf = _jf_of(trace)
        site = _manager.site(jf) if jf is not None else None
        names = trace.spec.names
        if site is not None:  # a number, changing strides or a pinned dimension found static stays so (a symbolic
            # trace each call, each pinned to its sizes)
            dims = {slot: kept for slot, ds in dims.items() if (kept := {
                d for d in ds if not ((d in (None, _dynamic.STRIDES_PLACE) or (names[slot], d) in site.pinned)
                                      and (names[slot], d) in site.static)})}
        if not dims:
            return None
        if trace.side_effects:
            failed = [(dims, "it calls print or logging (a second run would repeat them)")]
        elif any(isinstance(value, torch.Tensor) for _, value in checks):
            failed = [(dims, "it reads a tensor's values in Python (tolist(), str()), which its variant checks")]
        elif trace.recorder.fast_half:
            failed = [(dims, f"it runs PyTorch's fused fast path ({trace.recorder.fast_half}), which a layer takes "
                             "for plain tensors only: a symbolic trace would run the layer's own ops, which round "
                             "otherwise")]
        elif not all(p[0] in ("out", "obj", "in") or (p[0] == "object" and all(e[0] == "out" for _, e in p[2])) or
                     (p[0] == "const" and (p[1] is None or type(p[1]) in (int, torch.Size))) for p in out_plan[1]):
            # an int or a Size (x.shape): the symbolic trace's, a size of the call or a constant (_with_numbers);
            # None (an update step in place returns nothing)
            failed = [(dims, "its result holds an argument, a view of one or a value that is not a computed tensor")]
        elif not all(_settable(e) for _, _, p in sets.sets for e in _set_entries(p)):
            failed = [(dims, "it sets an argument object's attribute to an argument, a view of one or a value that "
                             "is not a computed tensor")]
        else:
            from .backend import decompositions
            tensors = {slot: ds for slot, ds in dims.items() if None not in ds}
            outputs = sum(len(p[2]) if p[0] == "object" else p[0] == "out" for p in out_plan[1])
            outputs += sum(e[0] == "out" for _, _, p in sets.sets for e in _set_entries(p))
            failed = []
            attempts = [dims] + ([tensors] if tensors and tensors != dims else [])
            while attempts:
                want = attempts.pop(0)
                words = _dims_words(names, want)
                try:
                    sym = _dynamic.retrace(trace, want, [value for _, value in checks], outputs, sets,
                                           lambda gm, xs: _functional(gm, xs, "real"), _C.run_untraced,
                                           decompositions())
                except _dynamic.Pinned as exc:  # that dimension stays static, the others may not
                    failed.append(({exc.slot: {exc.dim}}, str(exc)))
                    if site is not None:
                        site.pinned.add((names[exc.slot], exc.dim))
                    rest = {slot: kept for slot, ds in want.items()
                            if (kept := ds - {exc.dim} if slot == exc.slot else ds)}
                    attempts = [rest] if rest else []
                    continue
                except _dynamic.Static as exc:
                    failed.append((want, str(exc)))
                    continue
                except Exception as exc:  # ours: the variant is specialised to this call's sizes
                    reason = f"making it symbolic failed ({type(exc).__name__}: {exc})"
                    _log.warn_once(f"{_where(trace.fn)}: {reason}; its sizes stay static")
                    failed.append((want, reason))
                    break
                _manager.decided(jf, f"{words} took {config.dynamic_after} or more values; dynamic now",
                                 [(names[slot], d) for slot, ds in want.items() for d in ds])
                _Tracer._stay_static(trace, site, failed)
                return sym
        _Tracer._stay_static(trace, site, failed)
        return None

    @staticmethod
    def _stay_static(trace, site, failed):
        """Notes why the dimensions of each failed attempt ([(dims, reason)])
        stay static: a recompiles event, and the manager's words."""
        names = trace.spec.names
        if failed:
            _log.event("recompiles", f"{_where(trace.fn)}: its sizes stay static in this variant: {failed[0][1]}")
        for dims, reason in failed:
            for slot, ds in dims.items():
                for d in ds:
                    if site is not None and (names[slot], d) not in site.dynamic:
                        site.static[(names[slot], d)] = reason

    @staticmethod
    def _store(trace, fgm, slots, checks, writebacks, out_plan, compiled, sets=(), objects=0, spec=None, dense=(),
               random=True, inference=False):
        """Stores the entry's trace record, when it can be described without
        identities, with its compiled plan when that can be too; returns the
        record's id, or None. spec: the entry's guards when they are not
        trace.spec (a dynamic variant's, whose record needs its plan: its
        graph over symbolic sizes is stored to run eagerly, not to compile)."""
        try:
            pspec = _records.portable_spec(trace, spec=spec)
            key = _records.trace_key(trace.fn, trace, pspec)
            record = _records.variant(trace, pspec, fgm, slots, checks, writebacks, out_plan, sets, objects,
                                      None if spec is None else spec.names, dense, random, inference,
                                      _library_bindings(trace.codes))
            try:  # without its plan, a warm process compiles the record's graph instead
                record["compiled"] = _planform.encode(compiled)
            except _records.Unportable as exc:
                if spec is not None:
                    raise
                _log.event("cache", f"{_where(trace.fn)}: the trace record keeps no plan: {exc}")
            except Exception as exc:  # ours: the record is still worth storing
                _log.warn_once(f"storing the compiled plan of {_where(trace.fn)} failed, its record keeps "
                               f"the graph only ({type(exc).__name__}: {exc})")
            record["id"] = _records.record_id(record)
        except _records.Unportable as exc:
            _log.event("cache", f"{_where(trace.fn)}: no trace record stored: {exc}")
            return
        except Exception as exc:  # ours: the entry stands, a later process traces again
            _log.warn_once(f"storing the trace record of {_where(trace.fn)} failed ({type(exc).__name__}: {exc})")
            return
        if _records.store(trace.fn, key, record, config.jit_cache_limit):
            _log.event("cache", f"{_where(trace.fn)}: trace record stored under {key.hex()}")
        return record["id"]

    def load(self, fn, args, jf):
        """Entries for this call made from the trace records of the persistent
        cache: each record whose guards and code hold for args and that
        JitFunction jf does not hold already, compiled from its stored graph
        (the lowered artifacts come from the cache too)."""
        if not _records_on() or _builds.busy() or _under_transform():
            # rebuilding a record takes the compile lock the build in flight holds (and pauses it): the
            # call runs eagerly, a miss after the build loads them (the build's own were looked up already)
            return []
        # the record key describes the arguments' guards (HF BERT's: 10-14 ms, in every miss's call); a
        # miss of arguments of a kind whose key held no record when looked up finds none (records this
        # process stores since are jf's own, held already)
        empty = jf.__dict__.setdefault("_tn_records_empty", set())
        kind = _records_kind(args)
        if kind is not None and kind in empty:
            return []
        if not _records.has_records(fn):  # a cache that holds none of fn's: no key to describe
            if kind is not None:
                empty.add(kind)
            return []
        _gc_hold.hold()  # describing the guards allocates as a trace does
        try:
            entries, found = self._load(fn, args, jf)
        finally:
            _gc_hold.release()
        if kind is not None and not found:
            empty.add(kind)
        return entries

    def _load(self, fn, args, jf, only=None, count=True):
        """(entries, whether the key held any record). only: the id of the
        one record to load (a build's child stored it); count: whether the
        entries count as loaded (traces_loaded)."""
        held = {getattr(runner, "record", None) for _, runner in jf.entries()}
        trace = _Trace(fn, args, [])
        trace.guard_arguments()
        try:
            key = _records.trace_key(fn, trace)
        except _records.Unportable:
            return [], False
        if trace.problems:
            return [], False
        entries = []
        variants = _records.read(key)
        for v in variants:
            if v.get("id") in held or only is not None and v.get("id") != only:
                continue
            try:
                spec, live = _records.applies(v, fn, args)
                runner = self._rebuild(v, [live[s] for s in v["slots"][:len(v["slots"]) - v["objects"]]])
            except _records.Mismatch as exc:
                _log.event("cache", f"{_where(fn)}: trace record {key.hex()} does not apply: {exc}")
                continue
            except Exception as exc:  # ours (a record this version cannot read, say): the call traces instead
                _log.warn_once(f"rebuilding a trace record of {_where(fn)} failed, tracing instead "
                               f"({type(exc).__name__}: {exc})")
                continue
            runner.record = v["id"]
            entries.append((spec, tuple(v["slots"]), runner.direct()))
            for filename, line, what in _records.effects(v, fn):
                _warn_skipped_call(fn, filename, line, what)
        # another thread may have added the same records while these compiled
        held = {getattr(runner, "record", None) for _, runner in jf.entries()}
        entries = [e for e in entries if e[2].record not in held]
        if entries and count:
            _C.stat_add("traces_loaded", len(entries))
            _log.event("cache", f"{_where(fn)}: {len(entries)} traced variants from record {key.hex()}")
        return entries, bool(variants)

    @staticmethod
    def _rebuild(v, inputs):
        """The runner of a stored variant: its stored plan, or else its
        graph compiled on inputs."""
        from . import backend
        eager = _records.EagerGraph(v["graph"])  # decoded only if a step of the plan fails
        compiled = None
        with _compile_lock, torch.no_grad(), torch.autocast("cpu", enabled=False):  # the graph holds its casts
            if v.get("compiled") is not None:
                try:
                    compiled = _planform.load(v["compiled"], eager)
                except Exception as exc:  # ours (a plan this build cannot make): its graph compiles instead
                    _log.warn_once(f"a stored compiled plan could not be loaded, compiling its graph "
                                   f"({type(exc).__name__}: {exc})")
            if compiled is None and any(item[-1] == ["X"] for item in v["graph"]):
                raise _records.Mismatch("its stored plan did not load, and its graph over symbolic sizes cannot "
                                        "be compiled again")
            if compiled is None:  # the decoded graph is the back end's to rewrite
                compiled = backend.compile_inference(_records.decode_graph(v["graph"]), inputs, eager=eager)
        out_plan = (_records.decode_treespec(v["treespec"]), _records.decode_plan(v["plan"]))
        return _Runner(compiled, [tuple(c) for c in v["checks"]], [tuple(w) for w in v["writebacks"]], out_plan,
                       [(k, attr, _records.set_entry(p)) for k, attr, p in v["sets"]], v["objects"],
                       _records.dense_inputs(v), v.get("random", True),
                       torch.is_grad_enabled(),  # the record's grad mode and autocast: its key holds them
                       v.get("inference", False), torch.is_autocast_enabled("cpu"))

    def explain(self, fn, args, fails, jf=None):
        """The nearest entry's first failing guard, in words: the entry that
        got furthest, and among those the one whose tensor differs least.
        The recompilation manager counts the miss by it."""
        try:
            if any(index < 0 for _, index in fails):
                now = getattr(_side_exit, "value", None)
                _side_exit.value = None
                if now is _SHARED:
                    words = ("tensor arguments share memory (views of one another), and the variant writes into "
                             "an argument (eager's order of reads and writes decides the result)")
                else:
                    words = (f"{_manager.VALUE_READ} (item(), bool(), tolist(), str()) differs from every traced "
                             f"variant's" + ("" if now is None else f" (now {now!r})"))
            else:
                spec, index = max(fails, key=lambda f: (f[1], -tensor_distance(f[0], args, f[1])))
                words = explain(spec, args, index)
        except Exception as exc:  # never let the words break the call
            return f"a guard failed ({type(exc).__name__}: {exc})"
        if jf is not None:
            try:
                _manager.miss(jf, words, building=_builds.busy())
            except Exception as exc:  # ours: the call goes on, uncounted
                _log.warn_once(f"counting a miss of {_where(fn)} failed ({type(exc).__name__}: {exc})")
        return words

    def rebind(self, jf, module):
        """A copy of a jitted module called through the original's forward
        (copy.deepcopy keeps bound methods' functions): the copy gets its
        own JitFunction, so the two never share variants or the limit."""
        bound = module.__dict__.get("forward") if isinstance(module, torch.nn.Module) else None
        if not (isinstance(bound, types.MethodType) and getattr(bound.__func__, "_tn_jit", None) is jf and
                bound.__self__ is module):
            return jf
        return _jit_forward(module, jf.fn, jf.limit)

    def fork_build(self):
        _builds.fork_here()

    def give_up(self, fn, reason, jf):
        limit = f"jit(cache_limit={jf.limit})" if jf.limit else f"config.jit_cache_limit = {config.jit_cache_limit}"
        _log.warn_once(f"{_where(fn)} has reached its limit of traced variants ({limit}): "
                       f"its variants keep serving the calls they take, the others run eagerly unless a variant "
                       f"goes unused long enough to be evicted for them (config.jit_evict_after)" +
                       (f"; the last reason was: {reason}" if reason is not None else ""))

    @staticmethod
    def may_evict(jf, reason):
        """Whether a miss at jf's limit, for reason, may evict a variant (_manager.may_evict)."""
        return _manager.may_evict(jf, reason)

    @staticmethod
    def evicted(jf, unused, hits):
        """A variant of jf at its limit was evicted for a call none took."""
        _manager.decided(jf, f"evicted a variant that took {hits} calls and none in the last {unused}: room for "
                             "a call no variant takes (config.jit_evict_after)")


def _warn_skipped_call(fn, filename, line, what):
    _log.warn_once(f"the {what} call at {filename}:{line} runs only while {_where(fn)} is traced: compiled calls "
                   "skip it (move it out of the jitted code, or torchneuron_jit.disable the function that makes "
                   "it)")


def _records_kind(args):
    """What of a call's arguments (and of the process state, the settings
    and the cache in use) its trace record key can depend on, cheaply: each
    tensor's dtype, rank, layout, device and requires_grad, each module by
    identity, other values by type and (small immutable ones) by value;
    None when it cannot be told. Two calls of one kind have the same key
    while the modules' structure stays as it is (the key holds every size's
    records: which of them apply depends on the sizes), and which tensors
    are one."""
    from . import backend, cache
    try:
        leaves = pytree.tree_leaves(args)
    except Exception:  # ours: look the records up
        return None
    kind = [tuple(read() for read in _records.STATE.values()), backend._key_context(), cache.directory()]
    first = {}  # id -> place of the first leaf that is that tensor: one passed twice is another key ("same")
    for leaf in leaves:
        if _dynamic.plain_object(leaf):  # by what it holds (a cache before its first step, and after)
            held = list(_dynamic.held_values(leaf))
            kind.append((type(leaf), tuple(path for path, _ in held)))
            leaves.extend(v for _, v in held)
        elif isinstance(leaf, torch.Tensor):
            kind.append(("tensor", leaf.dtype, leaf.dim(), leaf.layout, leaf.device, leaf.requires_grad,
                         first.setdefault(id(leaf), len(kind))))
        elif isinstance(leaf, torch.nn.Module):
            kind.append(("module", id(leaf)))
        elif leaf is None or type(leaf) in (bool, int, float, str, torch.device, torch.dtype):
            kind.append((type(leaf), leaf))
        else:
            kind.append((type(leaf), id(leaf)))
    return tuple(kind)


def _records_on():
    return bool(config.cache and config.jit_trace_records)


_tracer = _Tracer()
_compile_lock = threading.Lock()  # make_fx and FX code generation keep global state


_where = _manager.where


# -- the API ---------------------------------------------------------------------

def _check_version():
    if sys.version_info[:2] not in SUPPORTED_PYTHON or not _C.JIT_SUPPORTED:
        versions = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_PYTHON)
        raise RuntimeError(f"torchneuron_jit.jit supports CPython {versions}; this is "
                           f"{sys.implementation.name} {sys.version.split()[0]} "
                           "(torch.compile(backend='neuron') works on any version torch supports)")


def jit(fn=None, *, cache_limit=None):
    """Compiles fn (a function, or an nn.Module's forward) through our frame
    hook; usable as ``@jit`` or ``@jit(cache_limit=4)``.

    On a module, returns the same module with its ``forward`` replaced by
    the jitted one: attributes, ``state_dict``, ``train()``/``eval()`` and
    submodules are the module's own; its own hooks run as in eager, and
    hooks on submodules are traced with the call (what they hold guarded). A
    deep copy gets its own variants on its first call; ``torch.save``
    saves the plain module (jit it again after loading). A shallow
    ``copy.copy`` shares the original's bound forward, and so computes
    with the original.
    cache_limit: traced variants kept per function (default
    config.jit_cache_limit).
    """
    if cache_limit is not None and (not isinstance(cache_limit, int) or cache_limit < 1):
        raise ValueError(f"jit: cache_limit must be a positive int, not {cache_limit!r}")
    if fn is None:
        return functools.partial(jit, cache_limit=cache_limit)
    _check_version()
    from . import backend  # noqa: F401  (imports functorch and TorchDynamo now, as torch.compile does: a
    #                        second or more that would otherwise land in the first call)
    limit = cache_limit or 0
    if isinstance(fn, torch.nn.Module):
        bound = fn.__dict__.get("forward")
        if isinstance(bound, types.MethodType) and (hasattr(bound.__func__, "_tn_jit") or
                                                    isinstance(bound.__func__, _C.JitFunction)):
            return fn  # jitted already
        if isinstance(bound, _C.JitFunction) or isinstance(getattr(bound, "_tn_jit", None), _C.JitFunction):
            return fn  # jit(partial) made it
        if bound is not None:  # a forward the instance holds (model.forward = MethodType(patched, model), as
            # accelerate's hooks install): eager calls that one
            if not (isinstance(bound, (types.MethodType, types.FunctionType)) or type(bound) is functools.partial):
                raise TypeError(f"jit: the forward {type(fn).__name__} holds is a {type(bound).__name__}, not a "
                                "Python function")
            fn.forward = jit(bound, cache_limit=cache_limit)
            return fn
        forward = type(fn).forward
        if not isinstance(forward, types.FunctionType):
            raise TypeError(f"jit: {type(fn).__name__}.forward is not a Python function")
        _jit_forward(fn, forward, limit)
        return fn
    if isinstance(fn, _C.JitFunction):
        return fn
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        # its name and signature the function's (generate() reads inspect.signature(model.forward))
        return types.MethodType(_named_as(_C.JitFunction(fn.__func__, _tracer, limit), fn.__func__), fn.__self__)
    if type(fn) is functools.partial:
        # the function jitted; the partial's bound arguments read at each call, as its own call reads them (a
        # partial of the jitted function would hold a copy of its keywords: p.keywords["a"] = 5.0 went unseen)
        inner = jit(fn.func, cache_limit=cache_limit)

        def jitted_partial(*args, **kwargs):
            return inner(*fn.args, *args, **{**fn.keywords, **kwargs})

        jitted_partial.__wrapped__ = fn  # inspect.signature: the partial's
        jitted_partial._tn_jit = _jit_function_of(inner)
        return jitted_partial
    if isinstance(fn, types.BuiltinFunctionType):  # torch.sin, torch.add, x.add (its tensor held)
        return _jit_builtin(fn, cache_limit)
    if not isinstance(fn, types.FunctionType) and callable(fn) and isinstance(
            getattr(fn, "__call__", None), types.MethodType):  # an object with a Python __call__: its method
        return jit(fn.__call__, cache_limit=cache_limit)
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"jit: expected a Python function or an nn.Module, not {type(fn).__name__}")
    return _named_as(_C.JitFunction(fn, _tracer, limit), fn)


def _jit_builtin(builtin, cache_limit):
    """jit of a builtin (torch.sin, torch.add in functools.partial(torch.add,
    other=1.0)), as torch.compile takes one: a Python function of its own
    that calls it, jitted (it holds nothing but the builtin)."""
    def call_builtin(*args, **kwargs):
        return builtin(*args, **kwargs)

    call_builtin.__name__ = call_builtin.__qualname__ = getattr(builtin, "__name__", "builtin")
    call_builtin.__doc__ = getattr(builtin, "__doc__", None)
    return jit(call_builtin, cache_limit=cache_limit)


def _named_as(wrapped, fn):
    """JitFunction wrapped, given function fn's name, doc and __wrapped__
    (inspect.signature follows it), and, where a call of fn makes a
    coroutine or a generator, fn's code, defaults and keyword defaults:
    inspect.iscoroutinefunction, isgeneratorfunction and isasyncgenfunction
    (and asyncio's, so frameworks that await what they are given) read a
    function-like object's code flags."""
    functools.update_wrapper(wrapped, fn)
    if fn.__code__.co_flags & _SUSPENDS:
        wrapped.__code__, wrapped.__defaults__, wrapped.__kwdefaults__ = fn.__code__, fn.__defaults__, \
            fn.__kwdefaults__
        kind = "a coroutine" if fn.__code__.co_flags & (inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE) \
            else "an async generator" if fn.__code__.co_flags & inspect.CO_ASYNC_GENERATOR else "a generator"
        _log.warn_once(f"{_where(fn)} is {kind} function, whose frames jit does not trace: it runs eagerly (jit the "
                       "functions or the model it calls)")
    return wrapped


# the code flags of a function whose call makes a coroutine or a generator
_SUSPENDS = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def _jit_forward(module, forward, limit):
    """Installs a JitFunction of forward (the class's) as module's own
    bound forward, through a Python function that carries forward's name
    (so pickling the module saves the plain method), signature and
    __wrapped__ (inspect follows it), and that TorchDynamo can trace: under
    torch.compile it is the class's forward. A forward the class gets later
    (Model.forward = ...) replaces it at the next call, as eager would call
    that one. Returns the JitFunction."""
    jf = _C.JitFunction(forward, _tracer, limit)
    functools.update_wrapper(jf, forward)
    jf.owner = module
    compiling = torch.compiler.is_compiling

    def jitted_forward(self, *args, **kwargs):
        now = type(self).forward
        if compiling():  # TorchDynamo is tracing this call: the plain forward, traced by it
            return now(self, *args, **kwargs)
        if now is not forward:  # the class's forward replaced since: eager calls the new one, so jit it instead
            raw = next(k.__dict__["forward"] for k in type(self).__mro__ if "forward" in k.__dict__)
            if isinstance(raw, types.FunctionType):
                _jit_forward(self, raw, limit)
                return self.forward(*args, **kwargs)
            get = getattr(type(raw), "__get__", None)  # a staticmethod, a builtin: bound as attribute lookup binds
            return (get(raw, self, type(self)) if get else raw)(*args, **kwargs)
        return jf(self, *args, **kwargs)

    functools.update_wrapper(jitted_forward, forward)
    jitted_forward._tn_jit = jf
    module.forward = types.MethodType(jitted_forward, module)
    return jf


def disable(fn):
    """Marks fn never to be compiled: a jitted call of it runs eagerly, and a
    jitted function that calls it runs eagerly too (with one warning)."""
    target = fn.fn if isinstance(fn, _C.JitFunction) else getattr(fn, "__func__", fn)
    if isinstance(target, torch.nn.Module):
        target = type(target).forward
        target = target.fn if isinstance(target, _C.JitFunction) else target
    if not isinstance(target, types.FunctionType):
        raise TypeError(f"disable: expected a Python function, not {type(fn).__name__}")
    _C.jit_disable(target)
    return fn


def entries(fn):
    """How many traced variants jitted fn (or jitted module) holds now."""
    return len(_jit_function_of(fn).entries())


def reset(fn):
    """Drops the traced variants of jitted fn (or module), and its
    reached-the-limit mark (its next miss looks the trace records up again)."""
    jf = _jit_function_of(fn)
    jf.reset()
    jf.__dict__.pop("_tn_records_empty", None)


def _jit_function_of(fn):
    given = fn
    if type(fn) is functools.partial:  # what jit made of a partial
        fn = fn.func
    if isinstance(fn, torch.nn.Module):
        fn = fn.__dict__.get("forward")
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    fn = getattr(fn, "_tn_jit", fn)
    if not isinstance(fn, _C.JitFunction):
        raise TypeError(f"not a jitted function or module: {given!r}")
    return fn
