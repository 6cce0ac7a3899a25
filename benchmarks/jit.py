"""torchneuron_jit.jit's own costs, same run: the per-call overhead of a
jitted one-op function, and the first call of the demo model in a fresh
process, cold (empty cache) and warm (the cache a first process filled).

    python -m benchmarks.jit [--rounds 15] [--calls 20000] [--models]

Per call (one thread, two 8-element float32 tensors, f = x + y): eager
(the op itself: the floor), the compiled graph called bare (the runner's
plan, run by the executor in C; no guards), jit (frame hook, C guards, runner,
graph), torch.compile(backend="neuron") (Dynamo's guards and wrappers),
and the same op as an nn.Module's forward, eager and jitted (jit(module)'s
forward is a Python function that TorchDynamo can trace); rounds
interleave the six, medians of per-call means. First calls: the
demo model (encoder2 at batch 4 x 64) through benchmarks/startup.py, eager
first call against jit's (cold: a trace and lowering; warm: the trace
record and the lowered artifact from the cache, no trace).
With --models, per-call medians of eager, jit and Dynamo's door on the
suite's BERT, GPT-2, encoder2 and MLP at batch 1 x 128 (7 interleaved
rounds; BERT and GPT-2 need the benchmark extras: make bench installs them).
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


class Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def per_call(rounds, calls):
    torchneuron_jit.config.compile_blocking = True  # steady state: the warm-up calls end at the compiled variant
    torch.set_num_threads(1)
    x, y = torch.randn(8), torch.randn(8)
    jitted = torchneuron_jit.jit(add)
    dynamo = torch.compile(add, backend="neuron")
    module, jitted_module = Add(), torchneuron_jit.jit(Add())
    with torch.no_grad():
        jitted(x, y)
        jitted(x, y)
        jitted_module(x, y)
        dynamo(x, y)
        runner = jitted.entries()[0][1]
        bare = runner.runner.compiled.call  # the compiled plan, called with the inputs one by one
        ways = {"eager": add, "compiled graph, bare": bare, "jit": jitted, "torch.compile neuron": dynamo,
                "eager module": module, "jit module": jitted_module}
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


def models(rounds=7):
    from benchmarks.models import SUITE
    torchneuron_jit.config.compile_blocking = True  # steady state, as in per_call
    torch.backends.mha.set_fastpath_enabled(False)
    for name in ("bert", "gpt2", "encoder2", "mlp"):
        build, make_input = SUITE[name][:2]
        torch.manual_seed(0)
        eager, x = build().eval(), make_input((1, 128))
        torch.manual_seed(0)
        jitted = torchneuron_jit.jit(build().eval())  # jit takes the module itself: a twin
        ways = {"eager": eager, "jit": jitted, "dynamo": torch.compile(eager, backend="neuron")}
        times = {k: [] for k in ways}
        with torch.no_grad():
            for f in ways.values():
                f(x)
                f(x)
            for _ in range(rounds):
                for k, f in ways.items():
                    t0 = time.perf_counter()
                    f(x)
                    times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{name:9s} eager {med['eager']:7.2f} ms  jit {med['jit']:7.2f} ms  Dynamo door {med['dynamo']:7.2f} ms"
              f"  eager/jit {med['eager'] / med['jit']:.2f}  eager/Dynamo door {med['eager'] / med['dynamo']:.2f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--models", action="store_true", help="also time the suite's models per call")
    args = ap.parse_args(argv)
    med = per_call(args.rounds, args.calls)
    print(f"per call, median of {args.rounds} rounds x {args.calls} calls (us):")
    for name, us in med.items():
        print(f"  {name:22s} {us:7.2f}   (+{us - med['eager']:.2f} over eager)")
    print(f"  jit over the bare compiled graph: {med['jit'] - med['compiled graph, bare']:.2f} us")
    for label, r in first_calls().items():
        st = r["neuron_stats"]
        print(f"first call, {label} cache: eager {r['eager_first_call_s'] * 1e3:.1f} ms, jit "
              f"{r['first_call_s'] * 1e3:.1f} ms (traces {st['traces']}, from trace records "
              f"{st['traces_loaded']}, lowered {st['graphs_lowered']}, artifact cache hits {st['cache_hits']})")
    if args.models:
        models()


if __name__ == "__main__":
    main()
