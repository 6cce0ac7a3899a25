"""The stored form of a compiled-graph plan: what a jit trace record keeps
so that a warm process runs its graph at once, with nothing decoded,
rewritten, imported, fused, measured or compiled again.

A form is a JSON-able dict:

- "format": FORMAT;
- "plan": the plan's binary form (``_C.Plan.encode()``, plan.h: steps,
  operands, outputs), base64;
- "consts": its constant table, one entry per constant: scalars,
  containers, dtypes and devices as the trace records encode graph
  arguments, and tagged ``{"op": name}`` (an ATen op, or an operator
  function), ``{"fn": [module, qualname]}`` (a function of ours or torch's),
  ``{"kernel": spec, "object": code}`` (a generated kernel by
  backend.make_kernel's arguments and its object code, base64: libtcc
  loads and relocates it, compiling nothing), ``{"packed": [attr,
  algorithm, rows]}`` (oneDNN's packed linear), ``{"switched": [attr,
  algorithm, rows, bias_added]}`` (oneDNN from that many rows up, a unit of
  dynamic rows), ``{"tensor": [dtype, sizes, bytes]}`` (a small constant
  the back end folded);
- "report": what compiling the graph counted (backend.count_fallbacks), so
  a warm process's stats() and fallback log say what the cold one's did.

A plan whose constants cannot all be described raises the trace records'
Unportable: the record is stored without it and a warm process compiles
its graph. (The trace records are imported when a form is made or read:
importing the back end does not load them.)
"""
import base64
import types

import torch

from . import _C

FORMAT = 1


class KernelSpec(tuple):
    """What a generated kernel constant is: backend.make_kernel's spec."""


def _ref(obj):
    """[module, qualname] naming function obj, checked to find obj again."""
    from . import _records
    try:
        return _records._name_ref(obj)
    except _records.Unportable:
        if getattr(torch, getattr(obj, "__name__", ""), None) is obj:  # torch.empty: its qualname is a C class's
            return ["torch", obj.__name__]
        raise


def _const(value, what):
    """The stored form of constant value, what says what it is."""
    from . import _records, gemm
    if isinstance(what, KernelSpec):
        return {"kernel": _records._encode_arg(tuple(what), {}),
                "object": base64.b64encode(value.object_code()).decode()}
    if isinstance(what, gemm.PackedLinear):
        return {"packed": [what.attr, what.algorithm, what.rows]}
    if isinstance(what, gemm.SwitchedLinear):
        return {"switched": [what.attr, what.algorithm, what.rows, what.bias_added]}
    if isinstance(what, torch.Tensor):
        if type(what) is not torch.Tensor or what.device.type != "cpu" or what.requires_grad or \
                not what.is_contiguous() or what.storage_offset() or what.dtype.is_complex:
            raise _records.Unportable("the plan holds a tensor constant that is not a plain contiguous CPU tensor")
        data = what.detach().reshape(-1).view(torch.uint8) if what.numel() else torch.empty(0, dtype=torch.uint8)
        return {"tensor": [_records._torch_name(what.dtype), list(what.shape),
                           base64.b64encode(data.numpy().tobytes()).decode()]}
    if isinstance(what, torch._ops.OpOverload):
        return {"op": _records._target_name(what)}
    if isinstance(what, (types.FunctionType, types.BuiltinFunctionType)):
        try:  # an operator function, as graph targets are named
            return {"op": _records._target_name(what)}
        except _records.Unportable:
            return {"fn": _ref(what)}
    return _records._encode_arg(what, {})


def encode(plan):
    """The stored form of plan (a _C.Plan that backend.plan_of built and
    _build reported on), or Unportable."""
    from . import _records
    form = getattr(plan, "form", None)
    if not isinstance(plan, _C.Plan) or not isinstance(form, dict) or "report" not in form:
        raise _records.Unportable("the graph is not a compiled plan (it runs eagerly)")
    return {"format": FORMAT, "plan": base64.b64encode(plan.encode()).decode(),
            "consts": [_const(value, what) for value, what in zip(plan.constants, form["consts"])],
            "report": form["report"]}


def _value(c):
    from . import _records, backend
    if isinstance(c, dict) and "kernel" in c:
        return backend.make_kernel(_records._decode_arg(c["kernel"], []), base64.b64decode(c["object"]))
    if isinstance(c, dict) and len(c) == 1:
        (tag, v), = c.items()
        if tag == "op":
            return backend._op_callable(_records._target(v))
        if tag == "fn":
            obj = _records._find(*v)
            if obj is None:
                raise ValueError(f"{v[0]}.{v[1]} is not there")
            return obj
        if tag == "packed":
            from .gemm import PackedLinear
            return PackedLinear(*v)
        if tag == "switched":
            from .gemm import SwitchedLinear
            return SwitchedLinear(*v)
        if tag == "tensor":
            dtype, sizes, data = v
            raw = bytearray(base64.b64decode(data))
            flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            return flat.view(getattr(torch, dtype)).reshape(sizes).clone()
    return _records._decode_arg(c, [])


def load(form, eager):
    """The plan of stored form (encode's), eager its graph's eager original;
    counts the graph's report. Raises ValueError (or what a constant's
    making raises) when the form cannot be read: the caller compiles the
    graph instead."""
    from . import backend
    if not isinstance(form, dict) or form.get("format") != FORMAT:
        got = form.get("format") if isinstance(form, dict) else form
        raise ValueError(f"a stored plan of another format ({got!r})")
    backend.set_threads()
    consts = tuple(_value(c) for c in form["consts"])
    plan = _C.Plan.from_bytes(base64.b64decode(form["plan"]), consts, backend.eager_callable(eager), backend._warn_once)
    _C.stat_add("plans_loaded")
    backend.count_fallbacks(form["report"])
    return plan
