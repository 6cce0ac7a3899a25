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

__all__ = ["config", "cache", "GraphError", "CacheError", "__version__"]
