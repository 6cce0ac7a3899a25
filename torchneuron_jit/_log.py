"""Event lines on stderr, selected by ``config.log`` (TORCHNEURON_LOG).

``TORCHNEURON_LOG=fallback,cache,compile`` (or ``all``) prints one line per
event of those kinds as it happens: ``[torchneuron_jit compile] ...``.
"""
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


def warn_once(message, stacklevel=3):
    """One RuntimeWarning per distinct message for the life of the process."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"torchneuron_jit: {message}", RuntimeWarning, stacklevel=stacklevel)
