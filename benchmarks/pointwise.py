"""Fused pointwise chains: eager vs torch.compile(backend="neuron"), same run.

    python benchmarks/pointwise.py [--iters N] [--shapes 256x1024,1024x1024] [--dtype float64|int32|...] [--no-inductor]

For each chain and shape: median latency of eager, of
torch.compile(backend="neuron") and of torch.compile(backend="inductor"),
measured interleaved (eager, neuron, inductor, eager, ...) so machine drift
hits all of them, and the ratios eager/neuron and inductor/neuron. Results differ from eager by at most
torch's default tolerances (checked before timing). With an integer
dtype, inputs are random integers and chains that eager refuses for it
(gelu of an integer) are skipped.
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
    "mask_select": lambda x, y: torch.where((x > 0) & (y < 1), x * y, 0.0),
    "masked_fill": lambda x, y: (x - y).masked_fill(y > x, float("-inf")).clamp_min(-1e4),
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


def columns(no_inductor):
    """The back ends timed: eager, neuron and (unless no_inductor) Inductor."""
    return ["eager", "neuron"] + ([] if no_inductor else ["inductor"])


def header(first, cols):
    """The table's header line: first (a padded label), then the columns."""
    print(first + " " + " ".join(f"{c + ' us':>12s}" for c in cols) + f" {'eager/neuron':>13s}"
          + (f" {'inductor/neuron':>16s}" if "inductor" in cols else ""))


def compare(label, f, args, cols, iters, check=torch.testing.assert_close):
    """Compiles f with each back end of cols after eager (Dynamo's caches
    reset first), checks each result against eager's with check(got, want),
    then times them all interleaved and prints the row."""
    torch._dynamo.reset()
    fns = {"eager": f}
    with torch.no_grad():
        want = f(*args)
        for backend in cols[1:]:
            fns[backend] = torch.compile(f, backend=backend)
            check(fns[backend](*args), want)
    print(format_row(label, measure(fns, args, iters), cols), flush=True)


def format_row(label, med, cols):
    """label, then each column's median in us, then eager/neuron (and
    inductor/neuron when Inductor ran)."""
    row = label + " " + " ".join(f"{med[c] * 1e6:12.1f}" for c in cols)
    row += f" {med['eager'] / med['neuron']:13.2f}"
    if "inductor" in cols:
        row += f" {med['inductor'] / med['neuron']:16.2f}"
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--shapes", default="64x256,256x1024,1024x1024")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16", "int64", "int32"])
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (it compiles slowly)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    cols = columns(args.no_inductor)
    header(f"{'chain':14s} {'shape':>10s}", cols)
    for shape_text in args.shapes.split(","):
        shape = tuple(int(s) for s in shape_text.split("x"))
        if dtype.is_floating_point:
            x, y = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
        else:
            x, y = torch.randint(-8, 8, shape, dtype=dtype), torch.randint(-8, 8, shape, dtype=dtype)
        for name, f in CHAINS.items():
            try:
                f(x, y)
            except RuntimeError:
                continue
            compare(f"{name:14s} {shape_text:>10s}", f, (x, y), cols, args.iters)


if __name__ == "__main__":
    main()
