"""The persistent compile cache (LMDB, csrc/cache).

One store per process, opened on first use in ``config.cache_dir`` (default
``$XDG_CACHE_HOME/torchneuron_jit``, else ``~/.cache/torchneuron_jit``). The
cache is an accelerator, never a point of failure: a directory that cannot be
used safely, a damaged store, or any store error gives one warning naming the
cause, and the program goes on uncached (a damaged file is moved aside and a
fresh store replaces it).
"""
import os
import threading

from . import _C, _log, config

CacheError = _C.CacheError
ARTIFACTS = _C.CACHE_ARTIFACTS
TRACES = _C.CACHE_TRACES

UPDATE_ATTEMPTS = 16  # update(): reads of a key other writers keep changing
_TABLES = {ARTIFACTS: "artifact", TRACES: "trace"}

_lock = threading.RLock()
_handle = None
_handle_key = None
_disabled = None  # (key, reason) of the last failed open
def directory():
    """The cache directory in effect (absolute)."""
    configured = config.cache_dir
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchneuron_jit")


def _open():
    """The open store, or None when caching is off or impossible."""
    global _handle, _handle_key, _disabled
    if not config.cache:
        return None
    key = (directory(), config.cache_initial_map_bytes, config.cache_max_bytes, config.cache_verify)
    with _lock:
        if _handle is not None and not _handle.closed and _handle_key == key:
            return _handle
        if _handle is not None:
            _handle.close()
            _handle = None
        if _disabled is not None and _disabled[0] == key:
            return None
        try:
            handle = _C.Cache(*key)
        except CacheError as exc:
            _disabled = (key, str(exc))
            _log.warn_once(f"compile cache disabled, running uncached: {exc}")
            return None
        notice = handle.take_notice()
        if notice:
            _log.warn_once(notice)
        _handle, _handle_key, _disabled = handle, key, None
        return handle


def _failed(handle, exc):
    """A store error: warn once; a damaged store is closed (and so moved aside)."""
    global _handle
    _log.warn_once(f"compile cache error, continuing uncached for this call: {exc}")
    if getattr(exc, "code", None) in (_C.ECORRUPT, _C.EPOISONED):
        with _lock:
            handle.close()
            if _handle is handle:
                _handle = None


def get(table, key):
    """The payload stored under key (16 bytes) in table, or None.

    ValueError for a table other than ARTIFACTS or TRACES, or a key of
    another length; a store error warns once and answers None.
    """
    handle = _open()
    if handle is None:
        return None
    try:
        return handle.get(table, key)
    except CacheError as exc:
        _failed(handle, exc)
        return None


def put(table, key, value):
    """Stores value under key; returns whether it was stored (ValueError as get())."""
    handle = _open()
    if handle is None:
        return False
    try:
        handle.put(table, key, value)
        return True
    except CacheError as exc:
        _failed(handle, exc)
        return False


def update(table, key, change):
    """Stores change(payload) under key, payload being what key holds (None:
    nothing), without losing an update another thread or process stores
    in between: the store compares in its write transaction, and when key
    changed, reads it again and calls change again (at most UPDATE_ATTEMPTS
    times). Returns whether it was stored (ValueError as get())."""
    handle = _open()
    if handle is None:
        return False
    try:
        for _ in range(UPDATE_ATTEMPTS):
            old = handle.get(table, key)
            if handle.replace(table, key, old, change(old)):
                return True
        _log.event("cache", f"an update of a {_TABLES[table]} record gave up after {UPDATE_ATTEMPTS} "
                          "writers changed it in between")
        return False
    except CacheError as exc:
        _failed(handle, exc)
        return False


def stats():
    """Counters and sizes of the store.

    Keys: ``path``, ``enabled``, ``entries``, ``bytes`` (pages in use),
    ``file_bytes``, ``map_bytes``, ``max_bytes``, and this process's ``hits``,
    ``misses``, ``puts``, ``evictions``, ``corrupt_dropped``, ``map_grows``,
    ``probes`` (crash-isolated checks of the file run on open: none when the
    file is as this library last checked or wrote it); ``reason`` when
    disabled.
    """
    handle = _open()
    if handle is not None:
        try:
            return dict(handle.stats(), enabled=True)
        except CacheError as exc:
            _failed(handle, exc)
            reason = str(exc)
    elif not config.cache:
        reason = "disabled by config.cache (TORCHNEURON_CACHE=0)"
    else:
        reason = _disabled[1] if _disabled else "unavailable"
    zero = dict.fromkeys(("entries", "bytes", "file_bytes", "map_bytes", "hits", "misses", "puts",
                          "evictions", "corrupt_dropped", "map_grows", "probes"), 0)
    return dict(zero, path=os.path.join(directory(), "cache.mdb"), enabled=False,
                max_bytes=config.cache_max_bytes, reason=reason)


def clear():
    """Deletes every record; returns how many there were."""
    handle = _open()
    if handle is None:
        return 0
    try:
        n = handle.stats()["entries"]
        handle.clear()
        return n
    except CacheError as exc:
        _failed(handle, exc)
        return 0


def close():
    """Closes the store (pending last-used times are written); reopened on next use."""
    global _handle
    with _lock:
        if _handle is not None:
            _handle.close()
            _handle = None
