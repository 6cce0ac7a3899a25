"""One start of a model in a fresh process, for the suite's cold and warm
start figures (run by benchmarks/suite.py, not by hand).

    python -m benchmarks.startup MODEL SHAPE BACKEND

Builds MODEL (seeded) and its input of SHAPE ("8,128"), times eager's first
call, then BACKEND's first call, and prints one JSON line: both times, their
difference (the compile cost a user waits for), the resident set before
that first call and after it, the peak RSS of the process (not of the
compile workers Inductor starts) and, for the
neuron back end, its counters. The caller chooses the caches through the
environment (TORCHNEURON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR): empty for a
cold start, filled by an earlier process for a warm one.
"""
import json
import sys
import time


def _status_mb(field):
    """A size of /proc/self/status in MB: VmRSS (resident now) or VmHWM
    (its highest). Not getrusage's ru_maxrss: Linux carries that across
    fork and exec, so a child would report its parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return None


def main():
    name, shape, backend = sys.argv[1], tuple(int(s) for s in sys.argv[2].split(",")), sys.argv[3]
    t0 = time.perf_counter()
    import torch

    import torchneuron_jit
    from benchmarks.models import SUITE
    from benchmarks.suite import compiled
    torch.backends.mha.set_fastpath_enabled(False)
    build, make_input = SUITE[name][:2]
    torch.manual_seed(0)
    model, x = build().eval(), make_input(shape)
    imported = time.perf_counter() - t0
    with torch.no_grad():
        rss_before = _status_mb("VmRSS")
        t = time.perf_counter()
        model(x)
        eager_first = time.perf_counter() - t
        fn = compiled(model, backend)
        t = time.perf_counter()
        fn(x)
        first = time.perf_counter() - t
    out = {"model": name, "shape": list(shape), "backend": backend, "import_and_build_s": imported,
           "eager_first_call_s": eager_first, "first_call_s": first, "compile_s": first - eager_first,
           "rss_before_mb": rss_before, "rss_after_mb": _status_mb("VmRSS"), "peak_rss_mb": _status_mb("VmHWM")}
    if backend in ("neuron", "jit"):
        out["neuron_stats"] = torchneuron_jit.stats()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
