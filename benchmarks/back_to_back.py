"""A server that is never idle: when do jit's variants get built?

    python -m benchmarks.back_to_back [--calls 400] [--models encoder,bert] [--workers auto,thread]

The shapes of benchmarks.dynamic_serving (batch 1-8, sequence 8-200, one
seeded sequence), each call right after the last, through
``torchneuron_jit.jit`` with background builds (compile_blocking off), once
per ``build_worker`` setting, each in a fresh process with an empty cache.
Eager's answers and times come first, in the same process (the loop then
runs the door alone). Reported per model and worker: the call after which
no build was in flight any more (every variant published; "never" when
one still was at the end), eager fallbacks, calls whose answer differs
from eager's (rtol = atol = 1e-4), p50 and p99 of the loop against eager's,
wall time against eager's, and the ratio of the door's time to eager's in
blocks of 50 calls, with how many of those calls ran while a build was in
flight.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = ("encoder", "bert")
WORKERS = ("auto", "thread")


def _q(xs, p):
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]


def run_one(name, calls, seed):
    """The loop for one model in this process (build_worker from the
    environment): a dict of what the docstring lists."""
    import torch
    import copy
    import torchneuron_jit
    from torchneuron_jit import _jit, _tier2
    from benchmarks.dynamic_serving import build, first, shapes
    model, make = build(name)
    eager_model = copy.deepcopy(model)
    with torch.no_grad():
        inputs = [make(b, s) for b, s in shapes(calls, seed)]
        wants, eager = [], []
        for args in inputs:
            t = time.perf_counter()
            wants.append(first(eager_model(*args)))
            eager.append(time.perf_counter() - t)
        run = torchneuron_jit.jit(model)
        fallbacks0 = torchneuron_jit.stats()["eager_fallbacks"]
        ours, building, tier2, gots, mismatches = [], [], [], [], 0
        for args in inputs:  # compared after the loop: a comparison between calls would be a gap
            t = time.perf_counter()
            gots.append(first(run(*args)))
            ours.append(time.perf_counter() - t)
            building.append(_jit._builds.busy())
            tier2.append(bool(_tier2._pending))
        for got, want in zip(gots, wants):
            try:
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            except AssertionError:
                mismatches += 1
        # settled: the first 100 shapes again, each call through the door then eagerly, so both are timed in
        # the same seconds (the loop's ratios set calls against eager's minutes before: on a noisy machine the
        # blocks after the builds read 0.74-1.66x between runs of one build)
        settled, settled_eager = [], []
        for args in inputs[:100]:
            t = time.perf_counter()
            run(*args)
            settled.append(time.perf_counter() - t)
            t = time.perf_counter()
            eager_model(*args)
            settled_eager.append(time.perf_counter() - t)
        tier2_left = len(_tier2._pending)

    def after(flags):
        return "never" if flags[-1] else max((i for i, b in enumerate(flags) if b), default=-1) + 1

    return {"built_after": after(building), "tier2_after": after(tier2),
            "fallbacks": torchneuron_jit.stats()["eager_fallbacks"] - fallbacks0, "mismatches": mismatches,
            "p50": statistics.median(ours) / statistics.median(eager), "p99": _q(ours, 0.99) / _q(eager, 0.99),
            "wall": sum(ours) / sum(eager), "settled": sum(settled) / sum(settled_eager), "tier2_left": tier2_left,
            "blocks": [(round(sum(ours[i:i + 50]) / sum(eager[i:i + 50]), 2), sum(building[i:i + 50]))
                       for i in range(0, calls, 50)]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--workers", default=",".join(WORKERS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child run: model name
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(run_one(a.one, a.calls, a.seed)))
        return
    print(f"{a.calls} calls back to back, batch 1-8 x sequence 8-200 (seed {a.seed}), an empty cache each")
    print("| model | build_worker | all built after call | tier 2 done after call | eager fallbacks | calls ≠ eager | "
          "p50 / eager's | p99 / eager's | wall / eager's | per 50 calls: time / eager's (calls while building) | "
          "settled: time / eager's (tier-2 compiles left) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        for worker in a.workers.split(","):
            with tempfile.TemporaryDirectory(prefix="tn_b2b_") as tmp:
                env = dict(os.environ, TORCHNEURON_CACHE_DIR=tmp, TORCHNEURON_BUILD_WORKER=worker)
                out = subprocess.run([sys.executable, "-m", "benchmarks.back_to_back", "--one", name,
                                      "--calls", str(a.calls), "--seed", str(a.seed)],
                                     env=env, capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            blocks = " ".join(f"{x} ({n})" for x, n in r["blocks"])
            print(f"| {name} | {worker} | {r['built_after']} | {r['tier2_after']} | {r['fallbacks']} | "
                  f"{r['mismatches']} of {a.calls} | {r['p50']:.2f} | {r['p99']:.2f} | {r['wall']:.2f} | {blocks} | "
                  f"{r['settled']:.2f} ({r['tier2_left']}) |", flush=True)


if __name__ == "__main__":
    main()
