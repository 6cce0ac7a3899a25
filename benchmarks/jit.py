"""torchneuron_jit.jit's own costs, same run: the per-call overhead of a
jitted one-op function, and the first call of the demo model in a fresh
process, cold (empty cache) and warm (the cache a first process filled).

    python -m benchmarks.jit [--rounds 15] [--calls 20000]

Per call (one thread, two 8-element float32 tensors, f = x + y): eager
(the op itself: the floor), the compiled graph called bare (the runner's
graph module forward, no guards), jit (frame hook, C guards, runner,
graph), torch.compile(backend="neuron") (Dynamo's guards and wrappers);
rounds interleave the four, medians of per-call means. First calls: the
demo model (encoder2 at batch 4 x 64) through benchmarks/startup.py, eager
first call against jit's (a trace, and lowering when the cache is cold).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import torchneuron_jit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add(x, y):
    return x + y


def per_call(rounds, calls):
    torch.set_num_threads(1)
    x, y = torch.randn(8), torch.randn(8)
    jitted = torchneuron_jit.jit(add)
    dynamo = torch.compile(add, backend="neuron")
    with torch.no_grad():
        jitted(x, y)
        jitted(x, y)
        dynamo(x, y)
        runner = jitted.entries()[0][1]
        bare = runner.forward
        ways = {"eager": add, "compiled graph, bare": bare, "jit": jitted, "torch.compile neuron": dynamo}
        times = {k: [] for k in ways}
        for _ in range(rounds):
            for name, fn in ways.items():
                t0 = time.perf_counter_ns()
                for _ in range(calls):
                    fn(x, y)
                times[name].append((time.perf_counter_ns() - t0) / calls / 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def first_calls():
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHNEURON_CACHE_DIR=cache, PYTHONPATH=ROOT)
        for label in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-m", "benchmarks.startup", "encoder2", "4,64", "jit"],
                               capture_output=True, text=True, env=env, cwd=ROOT, check=True)
            out[label] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args(argv)
    med = per_call(args.rounds, args.calls)
    print(f"per call, median of {args.rounds} rounds x {args.calls} calls (us):")
    for name, us in med.items():
        print(f"  {name:22s} {us:7.2f}   (+{us - med['eager']:.2f} over eager)")
    print(f"  jit over the bare compiled graph: {med['jit'] - med['compiled graph, bare']:.2f} us")
    for label, r in first_calls().items():
        st = r["neuron_stats"]
        print(f"first call, {label} cache: eager {r['eager_first_call_s'] * 1e3:.1f} ms, jit "
              f"{r['first_call_s'] * 1e3:.1f} ms (traces {st['traces']}, lowered {st['graphs_lowered']}, "
              f"cache hits {st['cache_hits']})")


if __name__ == "__main__":
    main()
