"""A serving loop while tier-2 compiles run: does any call wait for them?

    python -m benchmarks.tier2_serving [--model gpt_block] [--calls 3000] [--backend neuron|jit]

One suite model (benchmarks/models.py, its first shape) through our door as
users get it (compile_tier2=background, the defaults; an empty cache), calls
alternating with eager's, each timed. The compiled door's first calls
(Dynamo's compile, jit's trace) are left out; from then on every call is
counted: those made while tier-2 compiles were still running on a worker
thread (the other core), and those after. p50 and p99 of each, against
eager's interleaved calls, and the calls that took over 5 x eager's p99 (a
call that waited for a compiler would). Then the same loop at tier 1 only
(compile_tier2=off) for the steady-state comparison.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time


def _q(s, q):
    s = sorted(s)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] if s else float("nan")


def loop(model, x, door, calls):
    """(eager samples, samples during compiles, samples after, tier-2 kernels at the end)."""
    import torch
    import torchneuron_jit
    from torchneuron_jit import _tier2
    eager, during, after = [], [], []
    with torch.no_grad():
        for _ in range(3):  # Dynamo's compile / jit's trace and compile: not serving yet
            door(x)
        for i in range(calls):
            t = time.perf_counter()
            model(x)
            eager.append(time.perf_counter() - t)
            busy = bool(_tier2._pending)
            t = time.perf_counter()
            door(x)
            dt = time.perf_counter() - t
            (during if busy or _tier2._pending else after).append(dt)
    return eager, during, after, torchneuron_jit.stats()["tier2_kernels"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt_block")
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--backend", default="neuron", choices=("neuron", "jit"))
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tn_serving_") as tmp:
        os.environ["TORCHNEURON_CACHE_DIR"] = tmp
        import torch
        import torchneuron_jit
        from benchmarks.models import SUITE
        from benchmarks.suite import compiled
        from torchneuron_jit import config
        build, make_input, shapes = SUITE[a.model][:3]
        torch.manual_seed(0)
        model, x = build().eval(), make_input(shapes[0])
        print(f"{a.model} {'x'.join(map(str, shapes[0]))} through {a.backend}, compile_tier2={config.compile_tier2}, "
              f"tier2_after_calls={config.tier2_after_calls}, {torch.get_num_threads()} torch threads")
        rows = []
        for mode in ("background", "off"):
            config.compile_tier2 = mode
            torch._dynamo.reset()
            torchneuron_jit.reset_stats()
            door = compiled(model, a.backend)
            eager, during, after, kernels = loop(model, x, door, a.calls)
            rows.append((mode, eager, during, after, kernels, torchneuron_jit.stats()["tier2_compile_ms"] / 1e3))
        print("| tier 2 | eager p50 ms | eager p99 ms | eager max ms | calls during compiles | their p50 ms | their p99 ms | "
              "max ms | calls after | p50 ms | p99 ms | calls > 5x eager p99 | tier-2 kernels | compile s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for mode, eager, during, after, kernels, secs in rows:
            limit = 5 * _q(eager, 0.99)
            slow = sum(1 for s in during + after if s > limit)
            ms = lambda v: f"{v * 1e3:.3f}"
            print(f"| {mode} | {ms(statistics.median(eager))} | {ms(_q(eager, 0.99))} | {ms(max(eager))} | {len(during)} | "
                  f"{ms(statistics.median(during)) if during else '-'} | {ms(_q(during, 0.99)) if during else '-'} | "
                  f"{ms(max(during)) if during else '-'} | {len(after)} | {ms(statistics.median(after)) if after else '-'} | "
                  f"{ms(_q(after, 0.99)) if after else '-'} | {slow} | {kernels} | {secs:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
