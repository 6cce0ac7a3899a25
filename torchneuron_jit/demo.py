"""``make demo``: a transformer encoder through ``torch.compile(backend="neuron")``.

A 2-layer ``nn.TransformerEncoder`` (d_model 256, 4 heads, batch 4,
sequence 64, eval mode, PyTorch's fused fast path off) is compiled with
the neuron back end. Printed: the
time our back end spent compiling (Dynamo's capture excluded), eager and
compiled median latency measured in the same run with the two interleaved,
the largest difference from eager, the ops that ran through PyTorch, and
the persistent cache's hits and misses. Then the same runs in a fresh
Python process, which finds the compiled artifacts in the cache.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import torchneuron_jit
from torchneuron_jit import backend, cache


def build_model():
    # In eval mode the stock layer calls one fused op per layer (its "fast
    # path"); switched off, the layers reach the back end as ATen ops, as a
    # user's own modules do.
    torch.backends.mha.set_fastpath_enabled(False)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


def run_once(iterations=50):
    model = build_model()
    x = torch.randn(4, 64, 256)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        t0 = time.perf_counter()
        want = model(x)
        eager_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = compiled(x)
        compiled_first = time.perf_counter() - t0
        for _ in range(3):  # warm both
            model(x)
            compiled(x)
        eager, neuron = [], []
        for _ in range(iterations):  # interleaved: drift hits both alike
            t0 = time.perf_counter()
            model(x)
            eager.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            compiled(x)
            neuron.append(time.perf_counter() - t0)
    st = torchneuron_jit.stats()
    return {
        "pid": os.getpid(),
        "backend_compile_ms": backend.compile_seconds * 1e3,
        "first_call_ms": {"eager": eager_first * 1e3, "neuron": compiled_first * 1e3},
        "median_ms": {"eager": statistics.median(eager) * 1e3, "neuron": statistics.median(neuron) * 1e3},
        "max_abs_diff": (got - want).abs().max().item(),
        "fallback_ops": dict(backend.fallback_ops.most_common()),
        "stats": st,
        "cache_path": cache.stats()["path"],
    }


def report(title, r):
    st, med = r["stats"], r["median_ms"]
    print(f"== {title} (pid {r['pid']})")
    print(f"  back end compile time (Dynamo excluded): {r['backend_compile_ms']:.1f} ms; first call "
          f"{r['first_call_ms']['neuron']:.0f} ms compiled vs {r['first_call_ms']['eager']:.0f} ms eager")
    print(f"  median latency, same run, interleaved: eager {med['eager']:.2f} ms, neuron {med['neuron']:.2f} ms "
          f"(eager/neuron = {med['eager'] / med['neuron']:.2f})")
    print(f"  max abs difference from eager: {r['max_abs_diff']:.3g}")
    print(f"  graphs compiled {st['graphs_compiled']}, lowered {st['graphs_lowered']}, kernels "
          f"{st['kernels_compiled']}, cache hits {st['cache_hits']}, misses {st['cache_misses']}, "
          f"eager fallbacks {st['eager_fallbacks']}")
    ops = ", ".join(f"{k} x{v}" for k, v in r["fallback_ops"].items()) or "none"
    print(f"  ops run through PyTorch: {ops}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help="run once and print JSON")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_once()))
        return 0
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; cache {cache.stats()['path']}")
    first = run_once()
    report("this process", first)
    out = subprocess.run([sys.executable, "-m", "torchneuron_jit.demo", "--child"],
                         check=True, capture_output=True, text=True)
    second = json.loads(out.stdout.strip().splitlines()[-1])
    report("a fresh process", second)
    ok = second["stats"]["cache_hits"] > 0 and second["stats"]["graphs_lowered"] == 0 \
        and max(first["max_abs_diff"], second["max_abs_diff"]) < 1e-3
    print("OK: results match eager and the fresh process took its kernels from the cache"
          if ok else "FAILED: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
