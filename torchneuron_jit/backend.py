"""The "neuron" back end of ``torch.compile``.

``torch.compile(model, backend="neuron")`` finds this module through the
``torch_dynamo_backends`` entry point (no import needed); importing
torchneuron_jit registers it too. TorchDynamo captures FX graphs;
aot_autograd, with our decomposition table, turns them into ATen graphs;
``compile_inference`` imports each into the graph IR and builds the compiled
callable.

Every internal failure degrades to eager execution of that graph with one
warning naming the cause (``stats()["eager_fallbacks"]`` counts them).
Graphs that need gradients run eagerly for now (``training_graphs``).
"""
import time
import warnings

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from . import _C, _log
from .graph import from_fx

aten = torch.ops.aten

# Ops the lowering takes whole (one fused kernel each), so they must not be
# decomposed before they reach it.
LOWERED_WHOLE = (aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.gelu,
                 aten.addmm, aten.baddbmm, aten.silu, aten.logsumexp, aten.var, aten.clamp_min,
                 aten.clamp_max, aten.masked_fill, aten.t)

# Test hook: when set to a string, the next graph's compilation fails with
# that reason (tests of the degrade-to-eager path).
fail_next_compile = None

_warned = set()


def decompositions():
    """Core ATen decompositions, minus the ops in LOWERED_WHOLE."""
    table = dict(core_aten_decompositions())
    for packet in LOWERED_WHOLE:
        for overload in packet.overloads():
            table.pop(getattr(packet, overload), None)
    return table


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"torchneuron_jit: {message}", RuntimeWarning, stacklevel=2)


def _build(gm, example_inputs):
    """The compiled callable for an inference graph (raises on any failure)."""
    global fail_next_compile
    if fail_next_compile is not None:
        reason, fail_next_compile = fail_next_compile, None
        raise RuntimeError(reason)
    imported = from_fx(gm)
    _C.stat_add("graphs_compiled")
    fallback = len(imported.fallback_ops) + imported.lowered_nodes
    _C.stat_add("fallback_nodes", fallback)
    for name in imported.fallback_ops:
        _log.event("fallback", f"{name}: no lowering")
    return gm


def compile_inference(gm, example_inputs):
    """aot_autograd's compiler for graphs that need no gradients."""
    t0 = time.perf_counter()
    try:
        compiled = _build(gm, example_inputs)
    except Exception as exc:  # any failure of ours: this graph runs eagerly
        _C.stat_add("eager_fallbacks")
        reason = f"{type(exc).__name__}: {exc}"
        _warn_once(f"could not compile a graph, running it eagerly ({reason})")
        _log.event("compile", f"failed after {(time.perf_counter() - t0) * 1e3:.2f} ms: {reason}")
        return make_boxed_func(gm)
    _log.event("compile", f"graph of {sum(1 for n in gm.graph.nodes if n.op == 'call_function')} "
                          f"ops in {(time.perf_counter() - t0) * 1e3:.2f} ms")
    return make_boxed_func(compiled)


def _training(gm, example_inputs):
    """Forward and backward graphs of training run eagerly for now."""
    _C.stat_add("training_graphs")
    _log.event("compile", "graph needs gradients: running it eagerly")
    return make_boxed_func(gm)


neuron = aot_autograd(fw_compiler=_training, bw_compiler=_training,
                      inference_compiler=compile_inference, decompositions=decompositions())


def register():
    """Makes "neuron" known to TorchDynamo.

    When this package is installed, Dynamo loads it from our
    ``torch_dynamo_backends`` entry point on first use, and registering here
    too would collide with that; otherwise (a bare source tree on sys.path)
    it is registered here.
    """
    from importlib.metadata import entry_points

    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
    if "neuron" in _COMPILER_FNS:
        return
    for ep in entry_points(group="torch_dynamo_backends"):
        if ep.name == "neuron" and ep.value == "torchneuron_jit.backend:neuron":
            return
    register_backend(neuron, name="neuron")
