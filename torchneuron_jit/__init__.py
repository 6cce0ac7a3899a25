"""torchneuron_jit: a JIT compiler for PyTorch.

The C core (torchneuron_jit._C) holds the graph IR, the persistent LMDB
compile cache and the libtcc compiler; this package is the Python surface:
``config`` (every tunable, also settable as TORCHNEURON_<NAME>), ``cache``
(the persistent compile cache), ``graph`` (building graph IR from Python).
"""
import os as _os
import warnings as _warnings

from . import _C

__version__ = "0.1.0"

GraphError = _C.GraphError
CacheError = _C.CacheError


def _init_tcc():
    libdir = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "_tcc")
    try:
        _C.tcc_init(libdir)
    except RuntimeError as exc:  # compiled code is unavailable; everything degrades to eager
        _warnings.warn(f"torchneuron_jit: libtcc is unusable, compilation disabled: {exc}",
                       RuntimeWarning, stacklevel=3)


_init_tcc()

from . import config  # noqa: E402  (reads TORCHNEURON_* and warns about bad values)
from . import cache  # noqa: E402


def _gate_fx_tracing():
    """With torch imported already (the usual order), FX's is-tracing
    questions answer per thread from now on (_fxgate): a function the user
    wraps in torch.compile before jit is first used captures that answer,
    and a background build's make_fx made its calls raise."""
    import sys
    if "torch" in sys.modules:
        from . import _fxgate
        _fxgate.serialise_fx_tracing()


_gate_fx_tracing()


def stats():
    """Process-wide counters: graphs_compiled, graphs_lowered, kernels_compiled,
    cache_hits, cache_misses, fallback_nodes, eager_fallbacks, training_graphs;
    of jit: traces, guard_failures, recompiles; and fallback_ops, the nodes
    of compiled graphs that run through PyTorch as {op: {reason: count}}
    (reasons: "no lowering", "not fused")."""
    import sys
    out = _C.stats()
    backend = sys.modules.get(__name__ + ".backend")  # not imported: nothing compiled yet
    out["fallback_ops"] = backend.fallback_report() if backend else {}
    return out


def jit(fn=None, *, cache_limit=None):
    """Compiles fn (a function, or an nn.Module) through our own front door:
    a PEP 523 frame hook with guards in C (see torchneuron_jit._jit).
    Usable as ``@jit`` or ``@jit(cache_limit=4)``."""
    from . import _jit
    return _jit.jit(fn, cache_limit=cache_limit)


def disable(fn):
    """Marks fn never to be compiled by jit (see torchneuron_jit._jit.disable)."""
    from . import _jit
    return _jit.disable(fn)


def explain(fn):
    """The variants of jitted function or module fn, each with its guards in
    words, its graph (ops lowered, ops through PyTorch) and its hits; its
    misses by reason and the recompilation manager's decisions. print() it
    for text; a notebook shows it as HTML (with a timeline when matplotlib
    is installed). fn may also be what torch.compile(..., backend="neuron")
    returned: then each of Dynamo's compiled entries for it (graph breaks
    included) is a variant, with Dynamo's guards and its recompiles."""
    from . import _jit, _manager
    if _manager.dynamo_codes(fn) is not None:
        from . import backend
        return _manager.dynamo_explanation(fn, backend.neuron)
    return _manager.jit_explanation(_jit._jit_function_of(fn))


# Ops the back end handles around its kernels rather than in generated code:
# views a kernel reads through (backend._input_view: any op whose schema
# returns a view of its first argument qualifies; these are the ones aot
# graphs hold): between a graph input, a constant or a kernel's result and a
# pointwise kernel they do not run, the kernel reads the view's layout.
_AROUND_KERNELS = ["aten::view", "aten::_unsafe_view", "aten::permute", "aten::transpose.int", "aten::t",
                "aten::expand", "aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims", "aten::unsqueeze",
                "aten::slice.Tensor", "aten::select.int", "aten::split_with_sizes",
                "aten::clone",  # a copy whose every reader is a kernel: they read what it copies
                "aten::cat"]  # kernels write their parts of it in place (csrc/lowering/fuse.c cat_slot)


def lowered_ops():
    """The ATen overloads the back end turns into generated code or reads
    through in it (views at a kernel's inputs); the linear layers oneDNN
    runs are torch's own op and not listed. Every other op runs through
    PyTorch."""
    return sorted(set(_C.lowered_ops()) | set(_AROUND_KERNELS))


def reset_stats():
    """Sets every counter of stats() to 0."""
    import sys
    _C.stats_reset()
    backend = sys.modules.get(__name__ + ".backend")
    if backend:
        backend.fallback_reasons.clear()


def _register_backend():
    """Makes backend="neuron" known to TorchDynamo.

    Installed, the package's ``torch_dynamo_backends`` entry point does it
    when Dynamo first meets the name, and importing torch here would only
    slow down every import (the command line, the cache); a bare source
    tree on sys.path registers now.
    """
    from importlib.metadata import entry_points
    for ep in entry_points(group="torch_dynamo_backends"):
        if ep.name == "neuron" and ep.value == "torchneuron_jit.backend:neuron":
            return
    from . import backend
    backend.register()


_register_backend()

__all__ = ["jit", "disable", "explain", "config", "cache", "stats", "reset_stats", "lowered_ops", "GraphError", "CacheError", "__version__"]
