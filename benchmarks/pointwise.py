"""Fused pointwise chains: eager vs torch.compile(backend="neuron"), same run.

    python benchmarks/pointwise.py [--iters N] [--shapes 256x1024,1024x1024]

For each chain and shape: median latency of eager and of the compiled
function, measured interleaved (eager, compiled, eager, ...) so machine
drift hits both, and their ratio. Results differ from eager by at most
torch's default tolerances (checked before timing).
"""
import argparse
import statistics
import time

import torch

import torchneuron_jit  # noqa: F401  (registers the back end when not installed)

CHAINS = {
    "arith": lambda x, y: ((x * 2 + y) * 0.5 - x).clamp_min(0) + x * y,
    "sigmoid_tanh": lambda x, y: torch.sigmoid(x * 1.702) * x + torch.tanh(y),
    "gelu_residual": lambda x, y: torch.nn.functional.gelu(x + y) * 0.5 + x,
}


def measure(fns, args, iters):
    samples = {name: [] for name in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn(*args)
        for _ in range(iters):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn(*args)
                samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--shapes", default="64x256,256x1024,1024x1024")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'chain':14s} {'shape':>10s} {'eager us':>10s} {'neuron us':>10s} {'eager/neuron':>13s}")
    for shape_text in args.shapes.split(","):
        shape = tuple(int(s) for s in shape_text.split("x"))
        x, y = torch.randn(shape), torch.randn(shape)
        for name, f in CHAINS.items():
            torch._dynamo.reset()
            compiled = torch.compile(f, backend="neuron")
            with torch.no_grad():
                torch.testing.assert_close(compiled(x, y), f(x, y))
            med = measure({"eager": f, "neuron": compiled}, (x, y), args.iters)
            print(f"{name:14s} {shape_text:>10s} {med['eager'] * 1e6:10.1f} {med['neuron'] * 1e6:10.1f} "
                  f"{med['eager'] / med['neuron']:13.2f}")


if __name__ == "__main__":
    main()
