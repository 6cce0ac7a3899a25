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
  the dict's version tag stands);
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
import dis
import functools
import operator
import sys
import threading
import types
import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import _C, _log, _records, config

SUPPORTED_PYTHON = ((3, 11),)
_PRIMITIVES = (bool, int, float, str, type(None))
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_CONTAINERS = (tuple, list, dict, set, frozenset)
# held by identity: what a record finds again by name
_NAMED = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType, _C.JitFunction)
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


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


def _logging_codes():
    import logging
    names = ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log")
    codes = {getattr(logging.Logger, n).__code__ for n in names}
    codes |= {getattr(logging, n).__code__ for n in names if hasattr(getattr(logging, n), "__code__")}
    return frozenset(codes)


_LOGGING_CODES = _logging_codes()
_PRINT = print


class _NotCompilable(Exception):
    """The trace is correct Python but no graph of ours can replace it."""


# -- the recorder --------------------------------------------------------------

class _Recorder(TorchDispatchMode):
    """Records each ATen op run under it, with its real arguments and results."""

    def __init__(self):
        super().__init__()
        self.ops = []
        self.problem = None

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # item() and friends become value guards; other data-dependent ops cannot be replayed
        tags = getattr(func, "tags", ())
        if self.problem is None and func is not torch.ops.aten._local_scalar_dense.default and \
                (torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags):
            self.problem = f"{func} has a data-dependent result"
        self.ops.append((func, args, kwargs, out))
        return out


class _Trace:
    """One traced call: built by begin, finished by end."""

    def __init__(self, fn, args, codes):
        self.fn = fn
        self.args = args
        self.codes = codes
        self.spec = Spec()
        self.tensor_slot = {}   # id(tensor) -> slot that loads it
        self.tensors = []       # keeps them alive (ids stay unique)
        self.problems = []
        self.state = _records.read_state()  # name -> value, each guarded
        self.recorder = _Recorder()
        self.modules_seen = set()  # ids of the modules guard_module has guarded
        self.classes_seen = set()  # the classes guard_class has guarded
        self.module_paths = {}  # id(module) -> (slot of the module it was reached from, path below that)
        self.argument_guards = 0  # instructions guard_arguments wrote (the record key's part)
        self.opaque = []  # what the guards leave out and a record cannot describe, in words
        self.side_effects = {}  # (file, line) -> "print" or "logging": calls a compiled call skips
        self.prev_profile = None

    # -- calls that only tracing runs ---------------------------------------------

    def profile(self, frame, event, arg):
        """sys.setprofile hook while the frame runs: notes print and logging calls."""
        if event == "c_call" and arg is _PRINT:
            caller = frame
        elif event == "call" and frame.f_code in _LOGGING_CODES and frame.f_back is not None:
            caller = frame.f_back
        else:
            return
        filename = caller.f_code.co_filename
        if caller.f_code not in _LOGGING_CODES and not _records.library_code(filename):
            self.side_effects.setdefault((filename, caller.f_lineno), "print" if caller is frame else "logging")

    # -- guards on arguments ---------------------------------------------------

    def guard_value(self, slot, value, name):
        spec = self.spec
        t = type(value)
        if t in _TENSOR_TYPES:
            if not value.is_cpu or value.layout != torch.strided or value.is_quantized:
                self.problems.append(f"{name} is a {value.device} {value.layout} tensor; only dense CPU tensors "
                                     "are compiled")
            spec.add(("type", slot, t), name)
            spec.add(("tensor", slot, value.dtype, tuple(value.shape), tuple(value.stride()),
                      bool(value.requires_grad)), name)
            self.tensor_slot.setdefault(id(value), slot)
            self.tensors.append(value)
        elif t is bool or value is None:
            spec.add(("is", slot, value), name)
        elif t in _PRIMITIVES or isinstance(value, (torch.dtype, torch.device)):
            spec.add(("eq", slot, value), name)
        elif t in (list, tuple, torch.Size):
            spec.add(("type", slot, t), name)
            spec.add(("len", slot, len(value)), name)
            for k, item in enumerate(value):
                self.guard_value(spec.add(("item", slot, k), f"{name}[{k}]"), item, f"{name}[{k}]")
        elif t is dict:
            spec.add(("type", slot, t), name)
            spec.add(("len", slot, len(value)), name)
            for k, item in value.items():
                if type(k) not in (str, int):
                    self.problems.append(f"{name} has a key of type {type(k).__name__}")
                    continue
                self.guard_value(spec.add(("key", slot, k), f"{name}[{k!r}]"), item, f"{name}[{k!r}]")
        elif isinstance(value, torch.nn.Module):
            # weakly: a jitted function does not keep the modules passed to it alive
            spec.add(("isweak", slot, weakref.ref(value)), name)
            self.guard_module(value, name, slot)
        elif isinstance(value, _NAMED):
            spec.add(("is", slot, value), name)
        else:
            spec.add(("type", slot, t), name)
            self.problems.append(f"{name} is a {t.__qualname__}: jit guards tensors, numbers, strings, None, "
                                 "lists, tuples and dicts of them, and modules")

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
            self.guard_dict(attrs, qual, ("module", slot, sub_name, "__dict__"))
            for attr in ("_parameters", "_buffers", "_modules"):
                self.guard_dict(attrs[attr], f"{qual}.{attr}", ("module", slot, sub_name, attr))
            for attr in _HOOK_DICTS:
                d = attrs.get(attr)
                if isinstance(d, dict):
                    self.guard_dict(d, f"{qual}.{attr}", ("module", slot, sub_name, attr))
                    if d and sub is not module:
                        self.problems.append(f"{qual} has {attr[1:].replace('_', ' ')}")
            for attr in ("_parameters", "_buffers", "__dict__"):
                d = attrs if attr == "__dict__" else attrs[attr]
                for key, t in d.items():
                    if type(t) in _TENSOR_TYPES:
                        self.param_slot(d, key, t, f"{qual}.{key}", ("module", slot, sub_name, attr))

    def guard_classes(self, cls):
        """Snapshots of the dicts of cls and its bases (but object): a method
        or class attribute replaced after the trace is a miss. A tool that
        patches a class for a while (make_fx patches nn.Module) costs one
        full comparison once it has put the attribute back."""
        for c in cls.__mro__[:-1]:
            if c not in self.classes_seen and not _records.library_code(_defined_in(c)):
                self.classes_seen.add(c)
                self.guard_dict(_C.class_dict(c), f"class {c.__qualname__}", ("classdict", c))

    def guard_dict(self, d, name, path=None):
        """A snapshot of dict d (found by path in another process): every
        key, its value by identity (or, for primitives, by value)."""
        keys = tuple(d.keys())
        slot = self.spec.add(("const", d), name, path)
        self.spec.add(("dict", slot, keys, tuple(d[k] for k in keys), True), name)
        return slot

    def param_slot(self, d, key, tensor, name, path):
        """A slot loading tensor from dict d (a module's parameters, buffers or
        attributes), for the graph to take it as an input."""
        if id(tensor) in self.tensor_slot:
            return
        slot = self.spec.add(("key", self.spec.add(("const", d), name, path), key), name)
        self.tensor_slot[id(tensor)] = slot
        self.tensors.append(tensor)

    def guard_arguments(self):
        code = self.fn.__code__
        names = code.co_varnames[:len(self.args)]
        for i, (name, value) in enumerate(zip(names, self.args)):
            self.guard_value(self.spec.add(("arg", i), name), value, name)
        for k, cell in enumerate(self.fn.__closure__ or ()):
            name = code.co_freevars[k]
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if isinstance(value, _PRIMITIVES + _NAMED + (torch.nn.Module,)) or type(value) in _TENSOR_TYPES:
                c = self.spec.add(("const", cell), name, ("closure", k))
                self.guard_value(self.spec.add(("cell", c), name), value, name)
            else:
                self.opaque.append(f"closure variable {name} holds a {type(value).__qualname__}")
        self.argument_guards = len(self.spec)

    def guard_globals(self, used_constants):
        """The globals the traced (user) code loads, one snapshot per module:
        primitives by value; functions, classes, Python modules and
        containers by identity (a record describes them by name, code hash or
        content); tensors the graph took as constants by identity, and
        loaded from there. Other objects are not guarded, and keep the
        trace out of the persistent cache."""
        guarded, seen = {}, set()  # id(globals) -> (globals, {name: value})
        for code, globs in self.codes:
            if _records.library_code(code.co_filename) or _records.namedtuple_code(code, globs):
                continue
            names = guarded.setdefault(id(globs), (globs, {}))[1]
            for name in _global_loads(code):
                if (id(globs), name) in seen or name not in globs:
                    continue
                seen.add((id(globs), name))
                value = globs[name]
                t = type(value)
                if t in _TENSOR_TYPES:
                    if id(value) in used_constants:
                        names[name] = value
                elif t in _PRIMITIVES or t in _CONTAINERS or isinstance(value, _NAMED):
                    names[name] = value
                else:
                    self.opaque.append(f"global {name} holds a {t.__qualname__}")
        for globs, names in guarded.values():
            if names:
                d = self.spec.add(("const", globs), "globals", ("globals", globs.get("__name__")))
                self.spec.add(("dict", d, tuple(names), tuple(names.values()), False), "globals")
                for name, value in names.items():
                    if type(value) in _TENSOR_TYPES:
                        self.tensor_slot.setdefault(id(value), self.spec.add(("key", d, name), f"global {name}"))


def _defined_in(cls):
    """The file of the module that defined cls ("" when it has none)."""
    return getattr(sys.modules.get(cls.__module__), "__file__", None) or ""


_global_names = weakref.WeakKeyDictionary()


def _global_loads(code):
    """The names code loads as globals (LOAD_GLOBAL, LOAD_NAME)."""
    names = _global_names.get(code)
    if names is None:
        names = tuple(dict.fromkeys(i.argval for i in dis.get_instructions(code)
                                    if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")))
        _global_names[code] = names
    return names


# -- building the graph --------------------------------------------------------

def _graph_of(trace, result):
    """The recorded ops as an FX graph over the trace's external tensors.
    Returns (GraphModule, its inputs (the external tensors, in placeholder
    order), the captured ones among them (id -> tensor), the output plan
    (treespec, per leaf how to make it), the value checks)."""
    graph = torch.fx.Graph()
    env = {}           # id(tensor) -> fx node
    inputs = []        # the external tensors, one placeholder each
    constants = {}     # id(tensor) -> tensor, tensors no guard loads (captured)
    checks = []        # (graph output index, expected scalar)
    scalar_sources = []

    def external(t):
        node = graph.placeholder(f"in{len(inputs)}")
        node.meta["val"] = t
        inputs.append(t)
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
        return a

    leaves, treespec = pytree.tree_flatten(result)
    for leaf in leaves:  # arguments returned as they are, used by no op
        if isinstance(leaf, torch.Tensor) and id(leaf) in trace.tensor_slot and id(leaf) not in env:
            external(leaf)
    for func, args, kwargs, out in trace.recorder.ops:
        fargs, fkwargs = arg(args), {k: arg(v) for k, v in kwargs.items()}
        if func is torch.ops.aten._local_scalar_dense.default:
            scalar_sources.append((fargs[0], out))
            continue
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
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if id(leaf) in input_ids and id(leaf) not in constants:
                plan.append(("in", input_ids[id(leaf)]))
            elif id(leaf) in env:
                base = _alias_of(leaf, inputs)
                if base is not None:
                    plan.append(("view", base, tuple(leaf.shape), tuple(leaf.stride()), leaf.storage_offset()))
                else:
                    plan.append(("out", len(outputs)))
                    outputs.append(env[id(leaf)])
            else:
                raise _NotCompilable("the result holds a tensor the traced code did not compute or receive")
        else:
            plan.append(("const", leaf))
    for node, value in scalar_sources:
        checks.append((len(outputs), value))
        outputs.append(node)
    graph.output(tuple(outputs))
    gm = torch.fx.GraphModule({}, graph)
    return gm, inputs, constants, (treespec, plan), checks


def _alias_of(t, inputs):
    """The index of the input whose memory t views, or None."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except RuntimeError:
        return None
    for k, x in enumerate(inputs):
        if x.untyped_storage().data_ptr() == ptr and ptr != 0:
            return k
    return None


def _functional(gm, inputs):
    """gm as a functional, decomposed ATen graph (make_fx over functionalize)
    whose mutations of inputs are returned, not applied: (graph module,
    [(input index, output index)])."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from .backend import decompositions

    fgm = make_fx(torch.func.functionalize(gm, remove="mutations"), decomposition_table=decompositions(),
                  tracing_mode="fake")(*inputs)
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


class _Runner:
    """An entry's compiled call: the graph, its value checks, write-backs,
    and the result rebuilt in the shape eager returned."""

    __slots__ = ("compiled", "checks", "writebacks", "treespec", "plan", "single", "record")

    def __init__(self, compiled, checks, writebacks, out_plan):
        self.record = None  # the id of its trace record, when it has one
        self.compiled = compiled  # boxed: backend.compile_inference's result
        self.checks = checks
        self.writebacks = writebacks
        self.treespec, self.plan = out_plan
        # a result that is one computed tensor skips the rebuild
        self.single = self.plan[0][1] if self.treespec.is_leaf() and self.plan[0][0] == "out" else None

    def direct(self):
        """The entry's runner: a _C.DirectRunner calling the compiled graph
        module itself when this runner would only pick one of its outputs
        (no value checks, no write-backs, one computed tensor returned);
        else this one."""
        from .backend import _Guarded
        graph = self.compiled.compiled if isinstance(self.compiled, _Guarded) else None
        if self.checks or self.writebacks or self.single is None or not isinstance(graph, torch.fx.GraphModule):
            return self
        return _C.DirectRunner(graph.forward, self.single, self)

    def __call__(self, *inputs):
        outs = self.compiled(list(inputs))
        for k, want in self.checks:
            got = outs[k].item()
            if got != want and not (got != got and want != want):
                return _C.SIDE_EXIT
        if self.writebacks:
            # inputs that share memory (views of one another): eager's order of reads and writes matters
            storages = [x.untyped_storage().data_ptr() for x in inputs]
            if len(set(storages)) != len(storages):
                return _C.SIDE_EXIT
            with torch.no_grad():
                for i, k in self.writebacks:
                    inputs[i].copy_(outs[k])
        if self.single is not None:
            return outs[self.single]
        leaves = []
        for p in self.plan:
            kind = p[0]
            if kind == "out":
                leaves.append(outs[p[1]])
            elif kind == "in":
                leaves.append(inputs[p[1]])
            elif kind == "view":
                leaves.append(inputs[p[1]].as_strided(p[2], p[3], p[4]))
            else:
                leaves.append(p[1])
        return pytree.tree_unflatten(leaves, self.treespec)


# -- the tracer the frame hook calls ----------------------------------------------

class _Tracer:
    """The Python side of csrc/tracer (tracer.h lists the protocol)."""

    def begin(self, fn, args, codes, reason):
        if reason is not None:
            _log.event("recompiles", f"{_where(fn)}: {reason}")
        trace = _Trace(fn, args, codes)
        try:
            trace.guard_arguments()
        except Exception as exc:  # ours: the call still runs eagerly, and later ones too
            trace.problems.append(f"guarding the arguments failed ({type(exc).__name__}: {exc})")
        trace.prev_profile = sys.getprofile()
        sys.setprofile(trace.profile)
        trace.recorder.__enter__()
        return trace

    def abort(self, trace):
        trace.recorder.__exit__(None, None, None)
        sys.setprofile(trace.prev_profile)

    def end(self, trace, result):
        trace.recorder.__exit__(None, None, None)
        sys.setprofile(trace.prev_profile)
        for (filename, line), what in trace.side_effects.items():
            _warn_skipped_call(trace.fn, filename, line, what)
        spec = trace.spec
        for name, value in trace.state.items():
            spec.add(("call", _records.STATE[name], value), name)
        try:
            with _compile_lock:
                return self._entry(trace, result)
        except _NotCompilable as exc:
            reason = str(exc)
        except Exception as exc:  # any failure of ours: this variant runs eagerly
            reason = f"compiling the trace failed ({type(exc).__name__}: {exc})"
        _log.warn_once(f"{_where(trace.fn)} runs eagerly: {reason}", stacklevel=2)
        return (spec, (), None)

    def _entry(self, trace, result):
        if trace.problems:
            raise _NotCompilable(trace.problems[0])
        if trace.recorder.problem:
            raise _NotCompilable(trace.recorder.problem)
        disabled = sorted({code.co_qualname for code, _ in trace.codes if _C.jit_disabled(code)})
        if disabled:
            raise _NotCompilable(f"it calls {', '.join(disabled)}, marked by torchneuron_jit.disable")
        gm, inputs, constants, out_plan, checks = _graph_of(trace, result)
        trace.guard_globals(constants)
        if trace.state["grad mode"] and any(t.requires_grad for t in inputs):
            raise _NotCompilable("grad mode is on and tensors it uses require grad (training goes through "
                                 "torch.compile for now; wrap inference in torch.no_grad() or "
                                 "torch.inference_mode())")
        # tensors torch.tensor(...) made in the traced code: the same values on every call
        fresh = {id(args[0]) for func, args, _, _ in trace.recorder.ops if func is torch.ops.aten.lift_fresh.default}
        slots = []
        for t in inputs:
            slot = trace.tensor_slot.get(id(t))
            if slot is None:
                slot = trace.spec.add(("const", t), "a tensor the traced code captured",
                                      ("value", t) if id(t) in fresh else None)
            slots.append(slot)
        with torch.no_grad():
            fgm, writebacks = _functional(gm, inputs)
        from . import backend
        with torch.no_grad():
            compiled = backend.compile_inference(fgm, inputs)
        runner = _Runner(compiled, checks, writebacks, out_plan)
        if _records_on():
            runner.record = self._store(trace, fgm, slots, checks, writebacks, out_plan)
        return (trace.spec, tuple(slots), runner.direct())

    @staticmethod
    def _store(trace, fgm, slots, checks, writebacks, out_plan):
        """Stores the entry's trace record, when it can be described without
        identities; returns the record's id, or None."""
        try:
            pspec = _records.portable_spec(trace)
            key = _records.trace_key(trace.fn, trace, pspec)
            record = _records.variant(trace, pspec, fgm, slots, checks, writebacks, out_plan)
        except _records.Unportable as exc:
            _log.event("cache", f"{_where(trace.fn)}: no trace record stored: {exc}")
            return
        except Exception as exc:  # ours: the entry stands, a later process traces again
            _log.warn_once(f"storing the trace record of {_where(trace.fn)} failed ({type(exc).__name__}: {exc})",
                           stacklevel=4)
            return
        if _records.store(key, record, config.jit_cache_limit):
            _log.event("cache", f"{_where(trace.fn)}: trace record stored under {key.hex()}")
        return record["id"]

    def load(self, fn, args, jf):
        """Entries for this call made from the trace records of the persistent
        cache: each record whose guards and code hold for args and that
        JitFunction jf does not hold already, compiled from its stored graph
        (the lowered artifacts come from the cache too)."""
        if not _records_on():
            return []
        held = {getattr(runner, "record", None) for _, runner in jf.entries()}
        trace = _Trace(fn, args, [])
        trace.guard_arguments()
        try:
            key = _records.trace_key(fn, trace)
        except _records.Unportable:
            return []
        if trace.problems:
            return []
        entries = []
        for v in _records.read(key):
            if v.get("id") in held:
                continue
            try:
                spec, live = _records.applies(v, fn, args)
                runner = self._rebuild(v, [live[s] for s in v["slots"]])
            except _records.Mismatch as exc:
                _log.event("cache", f"{_where(fn)}: trace record {key.hex()} does not apply: {exc}")
                continue
            except Exception as exc:  # ours (a record this version cannot read, say): the call traces instead
                _log.warn_once(f"rebuilding a trace record of {_where(fn)} failed, tracing instead "
                               f"({type(exc).__name__}: {exc})", stacklevel=2)
                continue
            runner.record = v["id"]
            entries.append((spec, tuple(v["slots"]), runner.direct()))
            for filename, line, what in v["effects"]:
                _warn_skipped_call(fn, filename, line, what)
        # another thread may have added the same records while these compiled
        held = {getattr(runner, "record", None) for _, runner in jf.entries()}
        entries = [e for e in entries if e[2].record not in held]
        if entries:
            _C.stat_add("traces_loaded", len(entries))
            _log.event("cache", f"{_where(fn)}: {len(entries)} traced variants from record {key.hex()}")
        return entries

    @staticmethod
    def _rebuild(v, inputs):
        """The runner of a stored variant: its graph compiled on inputs."""
        from . import backend
        with _compile_lock, torch.no_grad():
            fgm = _records.decode_graph(v["graph"])
            compiled = backend.compile_inference(fgm, inputs)
        out_plan = (_records.decode_treespec(v["treespec"]), [tuple(p) for p in v["plan"]])
        return _Runner(compiled, [tuple(c) for c in v["checks"]], [tuple(w) for w in v["writebacks"]], out_plan)

    def explain(self, fn, args, fails):
        """The nearest entry's first failing guard, in words: the entry that
        got furthest, and among those the one whose tensor differs least."""
        try:
            if any(index < 0 for _, index in fails):
                return "a value read from a tensor (item(), bool()) differs from every traced variant's"
            spec, index = max(fails, key=lambda f: (f[1], -_tensor_distance(f[0], args, f[1])))
            return _explain(spec, args, index)
        except Exception as exc:  # never let the words break the call
            return f"a guard failed ({type(exc).__name__}: {exc})"

    def rebind(self, jf, module):
        """A copy of a jitted module called through the original's forward
        (copy.deepcopy keeps bound methods' functions): the copy gets its
        own JitFunction, so the two never share variants or the limit."""
        bound = module.__dict__.get("forward") if isinstance(module, torch.nn.Module) else None
        if not (isinstance(bound, types.MethodType) and bound.__func__ is jf and bound.__self__ is module):
            return jf
        return _jit_forward(module, jf.fn, jf.limit)

    def give_up(self, fn, reason):
        limit = config.jit_cache_limit
        _log.warn_once(f"{_where(fn)} has reached its limit of traced variants (config.jit_cache_limit = {limit}) "
                       f"and runs eagerly from now on; the last reason was: {reason}", stacklevel=2)


def _warn_skipped_call(fn, filename, line, what):
    _log.warn_once(f"the {what} call at {filename}:{line} runs only while {_where(fn)} is traced: compiled calls "
                   "skip it (move it out of the jitted code, or torchneuron_jit.disable the function that makes "
                   "it)", stacklevel=3)


def _records_on():
    return bool(config.cache and config.jit_trace_records)


_tracer = _Tracer()
_compile_lock = threading.Lock()  # make_fx and FX code generation keep global state


def _where(fn):
    code = fn.__code__
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


def _load(spec, args, slot):
    inst = spec[slot]
    kind = inst[0]
    if kind == "arg":
        return args[inst[1]]
    if kind == "const":
        return inst[1]
    if kind == "cell":
        return _load(spec, args, inst[1]).cell_contents
    parent = _load(spec, args, inst[1])
    return parent[inst[2]]


def _tensor_distance(spec, args, index):
    """How many of dtype, requires_grad, rank, sizes and strides differ at a
    failing tensor guard (0 for other guards)."""
    inst = spec[index]
    if inst[0] != "tensor":
        return 0
    value = _load(spec, args, inst[1])
    _, _, dtype, sizes, strides, rg = inst
    if not isinstance(value, torch.Tensor):
        return 5
    return ((value.dtype != dtype) + (value.requires_grad != rg) + (value.dim() != len(sizes))
            + sum(a != b for a, b in zip(sizes, value.shape)) + (tuple(value.stride()) != strides))


def _explain(spec, args, index):
    inst, name = spec[index], spec.names[index]
    kind = inst[0]
    if kind in ("item", "key"):
        return f"{name}: missing"
    if kind == "call":
        def word(v):
            return ("on" if v else "off") if isinstance(v, bool) else str(v).removeprefix("torch.")
        return f"{name}: {word(inst[2])} → {word(inst[1]())}"
    value = _load(spec, args, inst[1])
    if kind == "type":
        return f"{name}: type {inst[2].__name__} → {type(value).__name__}"
    if kind == "is":
        return f"{name}: {_short(inst[2])} → {_short(value)}"
    if kind == "isweak":
        was = inst[2]()
        return f"{name}: {_short(was) if was is not None else 'a module no longer alive'} → {_short(value)}"
    if kind == "eq":
        return f"{name}: {inst[2]!r} → {value!r}"
    if kind == "len":
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
            if a != b:
                return f"{name}: size[{d}] {a} → {b}"
        return f"{name}: strides {strides} → {tuple(value.stride())} ({_layout(sizes, strides)} → " \
               f"{_layout(tuple(value.shape), tuple(value.stride()))})"
    if kind == "dict":
        keys, values = inst[2], inst[3]
        for k, want in zip(keys, values):
            if k not in value:
                return f"{_entry_name(name, k)}: removed"
            got = value[k]
            if got is not want and not (type(got) is type(want) and type(want) in _PRIMITIVES and got == want):
                return f"{_entry_name(name, k)}: {_short(want)} → {_short(got)}"
        extra = [k for k in value if k not in keys]
        return f"{name}: new entries {extra[:3]}" if extra else f"{name}: changed"
    return f"{name}: guard {kind} failed"


def _entry_name(name, key):
    """Entry key of the dict snapshot called name, in words."""
    return f"global {key}" if name == "globals" else f"{name}.{key}"


def _short(v):
    if type(v) in _PRIMITIVES:
        return repr(v)
    if isinstance(v, torch.Tensor):
        return f"a tensor {tuple(v.shape)} {v.dtype}"
    return f"a {type(v).__name__} at {id(v):#x}"


def _layout(sizes, strides):
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
    hooks on submodules make the call run eagerly (with one warning). A
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
        if isinstance(bound, types.MethodType) and isinstance(bound.__func__, _C.JitFunction):
            return fn  # jitted already
        forward = type(fn).forward
        if not isinstance(forward, types.FunctionType):
            raise TypeError(f"jit: {type(fn).__name__}.forward is not a Python function")
        _jit_forward(fn, forward, limit)
        return fn
    if isinstance(fn, _C.JitFunction):
        return fn
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return types.MethodType(_C.JitFunction(fn.__func__, _tracer, limit), fn.__self__)
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"jit: expected a Python function or an nn.Module, not {type(fn).__name__}")
    wrapped = _C.JitFunction(fn, _tracer, limit)
    functools.update_wrapper(wrapped, fn)
    return wrapped


def _jit_forward(module, forward, limit):
    """Installs a JitFunction of forward as module's own bound forward; it
    carries forward's name (so pickling the module saves the plain method)."""
    jf = _C.JitFunction(forward, _tracer, limit)
    functools.update_wrapper(jf, forward)
    jf.owner = module
    module.forward = types.MethodType(jf, module)
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
    reached-the-limit mark."""
    _jit_function_of(fn).reset()


def _jit_function_of(fn):
    if isinstance(fn, torch.nn.Module):
        fn = fn.__dict__.get("forward")
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, _C.JitFunction):
        raise TypeError(f"not a jitted function or module: {fn!r}")
    return fn
