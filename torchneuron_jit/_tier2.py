"""Tier 2 of generated kernels: when, where and cached how.

Each kernel whose group tier 2 can write carries a second source
(``Kernel.tier2_source``, csrc/neuron_backend/codegen.h): its fused loops
for an optimising compiler. After ``config.tier2_after_calls`` launches the
kernel calls :func:`request` (through ``_C.set_tier2_hook``), which

- loads the shared object from the persistent cache when it is there: the
  key is the source, the compiler's version line, the flags (``-march``
  names the ISA, so a cache copied to a machine of other CPU features
  misses) and this format's number;
- else compiles it with the system C compiler (``config.tier2_cc``) on a
  worker thread (``compile_tier2=background``: the thread waits for the
  compiler without holding the GIL, calls go on at tier 1 meanwhile) or
  before the launch goes on (``sync``), stores it, and loads it.

A kernel at tier 2 tries its ``tn_kernel2`` first on every launch; a layout
tier 2 does not take (a strided operand) runs tier 1, so a swap never
changes what a call may be given. Any failure here leaves the kernel at
tier 1 with one warning; no compiler on the machine is said once under
``TORCHNEURON_LOG=compile``.
"""
import concurrent.futures
import functools
import os
import platform
import shutil
import threading
import time

from . import _C, _log, cache, config

FORMAT = 1  # of the objects' cache key; bump when what a key names changes meaning

_lock = threading.Lock()
_pool = None
_compilers = {}    # config.tier2_cc -> (path, version line), or None: there is none
_failed_once = False
_pending = {}      # future of a background request not yet finished -> its kernel
_waiting = {}      # key -> kernels waiting for the compile of that key's source
_objects = {}      # key -> shared object made or loaded by this process (insertion order: oldest first)
_MAX_OBJECTS = 512


def compiler():
    """The tier-2 compiler config.tier2_cc names: (path, its version line),
    or None when there is none (said once under log=compile)."""
    name = config.tier2_cc or "cc"
    with _lock:
        if name not in _compilers:
            path = shutil.which(name)
            version = None
            if path:
                try:  # spawned without the GIL: subprocess would fork this whole process holding it
                    version = _C.tier2_version(path).strip() or None
                except RuntimeError:
                    version = None
            _compilers[name] = (path, version) if version else None
            if not version:
                _log.event("compile", f"no C compiler for tier 2 (tier2_cc={name!r}"
                                      f"{' does not run' if path else ' not found'}): kernels stay at tier 1")
        return _compilers[name]


def reset():
    """Forgets what this process compiled, loaded and looked up (tests):
    after the background compiles asked for have finished."""
    global _failed_once
    wait()
    with _lock:
        _objects.clear()
        _compilers.clear()
        _failed_once = False


def available():
    """Whether kernels go to tier 2 here: compile_tier2 is not off and
    there is a compiler (fusion settings of auto follow this)."""
    return config.compile_tier2 != "off" and compiler() is not None


@functools.lru_cache(maxsize=1)
def cpu_flags():
    """The CPU's feature flags as /proc/cpuinfo names them (empty where it
    does not exist)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_V4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_V3 = {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}


def target():
    """The -march tier-2 code is built for: the ISA the runtime uses
    (``_C.cpu_isa()``, narrowed by config.cpu_isa), where this CPU has all
    of that level's features; None off x86-64."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    isa, flags = _C.cpu_isa(), cpu_flags()
    if isa == "avx512" and _V4 <= flags:
        return "x86-64-v4"
    if isa in ("avx512", "avx2") and _V3 <= flags:
        return "x86-64-v3"
    return "x86-64"


def flags():
    """The compiler's options for a tier-2 unit."""
    march = target()
    return ((["-march=" + march] if march else [])
            + ["-O3", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off",
               "-fno-semantic-interposition", "-fno-thread-jumps", "-w"])


def key(source, cc=None):
    """The cache key of source's object, built by cc (compiler())."""
    cc = cc or compiler()
    text = (f"tier2 {FORMAT}; machine {platform.machine()}; cc {cc[1] if cc else None}; "
            f"flags {' '.join(flags())}\n{source}")
    return _C.content_key(text.encode())


def _executor():
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(config.tier2_jobs)),
                                                          thread_name_prefix="torchneuron-tier2")
        return _pool


def _fail(what, exc):
    global _failed_once
    _C.stat_add("tier2_failed")
    _log.event("compile", f"tier 2 {what} failed, the kernel stays at tier 1: {exc}")
    if not _failed_once:
        _failed_once = True
        _log.warn_once(f"a kernel's tier 2 {what} failed, it stays at tier 1 (and so may others; "
                       f"TORCHNEURON_LOG=compile names each): {exc}")


def _swap(kernel, so):
    try:
        kernel.set_tier2(so)
        return True
    except Exception as exc:
        _fail("load", exc)
        return False


def _build(source, cc, k, background):
    """Compiles source, stores its object under key k, and swaps it into
    every kernel waiting for it. In the background the compiler runs in
    the idle scheduling class: only on a core nothing else wants."""
    so = None
    try:
        t0 = time.perf_counter()
        so = _C.tier2_compile(cc[0], flags(), source, background)
        ms = (time.perf_counter() - t0) * 1e3
        _C.stat_add("tier2_compiled")
        _C.stat_add("tier2_compile_ms", int(round(ms)))
        _log.event("compile", f"tier 2 of a kernel compiled in {ms:.0f} ms ({len(so)} bytes)")
    except Exception as exc:  # the compiler's failure is ours: tier 1 stays
        _fail("compile", exc)
    if so is not None and config.cache:
        cache.put(cache.ARTIFACTS, k, so)
    with _lock:
        waiting = _waiting.pop(k, [])
        if so is not None:
            _objects[k] = so
            while len(_objects) > _MAX_OBJECTS:
                _objects.pop(next(iter(_objects)))
    for kernel in waiting:
        if so is not None:
            _swap(kernel, so)


def request(kernel):
    """The hook: kernel is due for tier 2 (see the module's doc). In the
    background everything but the check of the mode happens on a worker
    thread, the compiler's look-up and the cache's included."""
    mode = config.compile_tier2
    source = kernel.tier2_source
    if mode == "off" or source is None or kernel.tier == 2:
        return
    try:
        if mode == "sync":
            _serve(kernel, source, False)
            return
        fut = _executor().submit(_serve, kernel, source, True)
        with _lock:
            _pending[fut] = kernel
        fut.add_done_callback(_done)
    except Exception as exc:
        _fail("request", exc)


def _serve(kernel, source, background):
    """kernel's tier 2: from this process, the cache, or the compiler (in
    the background: on the worker thread)."""
    try:
        cc = compiler()
        k = key(source, cc)
        with _lock:
            so = _objects.get(k)
        if so is not None:  # another kernel of this process has the same source
            _swap(kernel, so)
            return
        so = cache.get(cache.ARTIFACTS, k) if config.cache else None
        if so is not None:
            if _swap(kernel, so):
                _C.stat_add("tier2_loaded")
                with _lock:
                    _objects[k] = so
            return
        if cc is None:
            return
        with _lock:
            if k in _waiting:  # being compiled: it gets the result too
                _waiting[k].append(kernel)
                return
            _waiting[k] = [kernel]
        _build(source, cc, k, background)
    except Exception as exc:
        _fail("request", exc)


def _done(fut):
    with _lock:
        _pending.pop(fut, None)


def _after_fork_in_child():
    """A forked process (a server's worker) holds none of its parent's
    threads: the pool's worker is gone though the pool counts it, and the
    requests and compiles in flight never end. A new pool is made when
    asked, and their kernels ask again at their next launch here (each
    request waited forever, and the worker's kernels stayed at tier 1)."""
    global _pool, _lock
    orphans = list(_pending.values()) + [kernel for kernels in _waiting.values() for kernel in kernels]
    _lock = threading.Lock()
    _pool = None
    _pending.clear()
    _waiting.clear()
    for kernel in orphans:
        kernel.tier2_asked = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def wait(timeout=None):
    """Waits until the background tier-2 compiles asked for so far have
    finished (benchmarks and tests); returns whether they all did."""
    with _lock:
        futs = list(_pending)
    done, not_done = concurrent.futures.wait(futs, timeout=timeout)
    return not not_done


_C.set_tier2_hook(request)
