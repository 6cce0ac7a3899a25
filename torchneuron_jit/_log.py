"""Event lines on stderr, selected by ``config.log`` (TORCHNEURON_LOG).

``TORCHNEURON_LOG=fallback,cache,compile`` (or ``all``) prints one line per
event of those kinds as it happens: ``[torchneuron_jit compile] ...``.
"""
import os
import sys
import warnings

from . import config

KINDS = ("cache", "compile", "fallback", "recompiles")


def enabled(kind):
    """Whether events of kind are printed now (a kind config.log names that
    is none of KINDS gives one warning)."""
    selected = {k.strip() for k in config.log.split(",") if k.strip()}
    unknown = selected - set(KINDS) - {"all"}
    if unknown:
        warn_once(f"config.log (TORCHNEURON_LOG) names no event kind {', '.join(sorted(unknown))}; the kinds are "
                  f"{', '.join(KINDS)} and all")
    return kind in selected or "all" in selected


def event(kind, message):
    """Prints one event line if its kind is selected."""
    if enabled(kind):
        print(f"[torchneuron_jit {kind}] {message}", file=sys.stderr, flush=True)


_warned = set()


_OWN_DIR = os.path.dirname(__file__) + os.sep


def caller_level():
    """warnings.warn's stacklevel, from its caller, of the first frame that is
    neither ours nor torch's: the user's line that called the jitted
    function or module, or the compiled function (a warning at our own
    line, or at nn.Module's __call__, tells the user nothing)."""
    torch_dir = os.path.dirname(sys.modules["torch"].__file__) + os.sep if "torch" in sys.modules else None
    frame, level = sys._getframe(2), 2
    while frame is not None and (frame.f_code.co_filename.startswith(_OWN_DIR) or
                                 (torch_dir and frame.f_code.co_filename.startswith(torch_dir))):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def warn_once(message):
    """One RuntimeWarning per distinct message for the life of the process,
    at the user's line that led to it."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"torchneuron_jit: {message}", RuntimeWarning, stacklevel=caller_level())
