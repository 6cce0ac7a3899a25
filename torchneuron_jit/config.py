"""Tunables of torchneuron_jit.

Every knob lives in one table in C (csrc/tn_config.h: name, type, default,
doc). Read and write them as attributes of this module::

    import torchneuron_jit
    torchneuron_jit.config.cache_max_bytes = "2G"
    print(torchneuron_jit.config.describe())

or set ``TORCHNEURON_<NAME>`` in the environment before import (for example
``TORCHNEURON_CACHE_DIR=/srv/cache``). A variable that does not parse keeps
the default and gives one warning naming it.
"""
import contextlib
import difflib
import os
import sys
import types
import warnings
from typing import NamedTuple

from . import _C


class Setting(NamedTuple):
    name: str
    type: str
    default: str
    doc: str
    value: object


def names():
    """Names of all settings, in table order."""
    return [row[0] for row in _C.config_table()]


def table():
    """Every setting as a :class:`Setting` with its current value."""
    return [Setting(n, t, d, doc, _C.config_get(n)) for n, t, d, doc in _C.config_table()]


# TORCHNEURON_* variables that are no setting: setup.py's
_BUILD_VARIABLES = ("TORCHNEURON_TCC_DIR",)


def reset():
    """Back to the defaults, then the TORCHNEURON_* variables (warns about
    bad ones, and about variables that name no setting)."""
    for problem in _C.config_reset():
        warnings.warn(f"torchneuron_jit: {problem}", RuntimeWarning, stacklevel=2)
    known = {f"TORCHNEURON_{name.upper()}" for name in names()} | set(_BUILD_VARIABLES)
    for var in sorted(v for v in os.environ if v.startswith("TORCHNEURON_") and v not in known):
        near = difflib.get_close_matches(var, sorted(known), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        warnings.warn(f"torchneuron_jit: {var} names no setting and is ignored{hint}; the settings are listed by "
                      "torchneuron_jit.config.describe()", RuntimeWarning, stacklevel=2)


@contextlib.contextmanager
def patch(**values):
    """Temporarily set settings: ``with config.patch(cache=False): ...``."""
    old = {name: _C.config_get(name) for name in values}
    try:
        for name, value in values.items():
            _C.config_set(name, value)
        yield
    finally:
        for name, value in old.items():
            _C.config_set(name, value)


def describe():
    """The table as text: name, current value, default and doc."""
    lines = []
    for s in table():
        lines.append(f"{s.name} = {s.value!r}  ({s.type}, default {s.default!r}, "
                     f"env TORCHNEURON_{s.name.upper()})\n    {s.doc}")
    return "\n".join(lines)


class _ConfigModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _C.config_get(name)

    def __setattr__(self, name, value):
        if name.startswith("_") or name in self.__dict__:
            super().__setattr__(name, value)
        else:
            _C.config_set(name, value)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(names()))


sys.modules[__name__].__class__ = _ConfigModule
reset()
