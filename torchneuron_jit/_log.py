"""Event lines on stderr, selected by ``config.log`` (TORCHNEURON_LOG).

``TORCHNEURON_LOG=fallback,cache,compile`` (or ``all``) prints one line per
event of those kinds as it happens: ``[torchneuron_jit compile] ...``.
"""
import os
import sys
import threading
import warnings

from . import config

KINDS = ("cache", "compile", "fallback", "recompiles")

# Why a call or graph that needs gradients runs eagerly, and what to do (both doors' words).
NO_TRAINING = ("compiled training is not built yet; for inference, call it under torch.no_grad() or "
               "torch.inference_mode()")


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


def _user_frame(frame):
    """(the first frame from frame out that is neither ours nor torch's,
    how many frames it is out), the frame None where there is none."""
    torch_dir = os.path.dirname(sys.modules["torch"].__file__) + os.sep if "torch" in sys.modules else None
    level = 0
    while frame is not None and (frame.f_code.co_filename.startswith(_OWN_DIR) or
                                 (torch_dir and frame.f_code.co_filename.startswith(torch_dir))):
        frame, level = frame.f_back, level + 1
    return frame, level


def caller_level():
    """warnings.warn's stacklevel, from its caller, of the first frame that is
    neither ours nor torch's: the user's line that called the jitted
    function or module, or the compiled function (a warning at our own
    line, or at nn.Module's __call__, tells the user nothing)."""
    frame, level = _user_frame(sys._getframe(2))
    return level + 2 if frame is not None else 2


def user_location():
    """(file, line) of the user's line that led here (caller_level's
    frame), or None."""
    frame, _ = _user_frame(sys._getframe(1))
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None


_located = threading.local()


def locate(location):
    """The (file, line) this thread's warnings point at (a build thread,
    whose stack holds no line of the user's: the call that traced), or None."""
    _located.at = location


def warn_once(message):
    """One RuntimeWarning per distinct message for the life of the process,
    at the user's line that led to it. Called while a Warning is handled
    (a warnings filter made one raise inside what failed), it raises that
    Warning instead: under -W error the call raises the warning itself, not
    ours wrapped around it."""
    handled = sys.exc_info()[1]
    if isinstance(handled, Warning):
        raise handled
    if message not in _warned:
        _warned.add(message)
        at = getattr(_located, "at", None)
        if at is not None:
            warnings.warn_explicit(f"torchneuron_jit: {message}", RuntimeWarning, at[0], at[1])
        else:
            warnings.warn(f"torchneuron_jit: {message}", RuntimeWarning, stacklevel=caller_level())
