"""Fused pointwise chains: eager vs torch.compile(backend="neuron"), same run.

    python benchmarks/pointwise.py [--iters N] [--shapes 256x1024,1024x1024] [--dtype float64|int32|...] [--no-inductor]

For each chain and shape: median latency of eager, of
torch.compile(backend="neuron") with its kernels at tier 1 only (neuron-t1)
and at tier 2 (neuron), and of torch.compile(backend="inductor"), measured
interleaved (eager, neuron-t1, neuron, inductor, eager, ...) so machine
drift hits all of them; the ratios eager/ours and inductor/neuron; and
each tier's bandwidth as a share of a triad's measured in the same run. Results differ from eager by at most
torch's default tolerances (checked before timing). With an integer
dtype, inputs are random integers and chains that eager refuses for it
(gelu of an integer) are skipped.
"""
import argparse
import os
import statistics
import sys
import time

import torch

import torchneuron_jit  # noqa: F401  (registers the back end when not installed)

CHAINS = {
    "arith": lambda x, y: ((x * 2 + y) * 0.5 - x).clamp_min(0) + x * y,
    "sigmoid_tanh": lambda x, y: torch.sigmoid(x * 1.702) * x + torch.tanh(y),
    "gelu_residual": lambda x, y: torch.nn.functional.gelu(x + y) * 0.5 + x,
    "mask_select": lambda x, y: torch.where((x > 0) & (y < 1), x * y, 0.0),
    "masked_fill": lambda x, y: (x - y).masked_fill(y > x, float("-inf")).clamp_min(-1e4),
    # one input (tier 2 vectorised no select of one until -fno-thread-jumps: relu ran at 0.21x eager)
    "relu_1in": lambda x, y: torch.relu(x * 2.0) - 1.0,
    # GPT-2's gelu_new (transformers NewGELUActivation): pow(x, 3.0) is eager's x*x*x
    "gelu_new": lambda x, y: 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0)))),
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


# our back end per tier: neuron at tier 2 (compiled before the first call goes on), neuron-t1 at tier 1 only
TIERS = {"neuron": "sync", "neuron-t1": "off"}


def columns(no_inductor):
    """The back ends timed: eager, neuron at tier 1 and tier 2 and (unless
    no_inductor) Inductor."""
    return ["eager", "neuron-t1", "neuron"] + ([] if no_inductor else ["inductor"])


def door(f, backend):
    """(f as backend runs it, the function for its first call). A kernel's
    tier is settled at its first launch (config.tier2_after_calls = 1, set
    by main), so neuron-t1's first call runs with tier 2 off and its kernels
    stay at tier 1; neuron's compiles its tier 2 before going on."""
    if backend not in TIERS:
        c = torch.compile(f, backend=backend)
        return c, c
    if backend == "neuron":
        c = torch.compile(f, backend="neuron")
    else:  # a back end of its own, or Dynamo would reuse the other door's graph (one cache per code and back end)
        from torch._dynamo.backends.registry import lookup_backend
        neuron = lookup_backend("neuron")
        c = torch.compile(f, backend=lambda gm, example: neuron(gm, example))

    def first(*args):
        with torchneuron_jit.config.patch(compile_tier2=TIERS[backend]):
            return c(*args)
    return c, first


def setup_tiers():
    """Every kernel at its tier from its first launch (see door)."""
    torchneuron_jit.config.tier2_after_calls = 1
    torchneuron_jit.config.compile_tier2 = "sync"


def header(first, cols):
    """The table's header line: first (a padded label), then the columns."""
    print(first + " " + " ".join(f"{c + ' us':>12s}" for c in cols)
          + "".join(f" {'eager/' + c:>16s}" for c in cols[1:] if c != "inductor")
          + (f" {'inductor/neuron':>16s}" if "inductor" in cols else ""))


def compare(label, f, args, cols, iters, check=torch.testing.assert_close, extra=""):
    """Compiles f with each back end of cols after eager (Dynamo's caches
    reset first), checks each result against eager's with check(got, want),
    then times them all interleaved and prints the row (and extra(med))."""
    torch._dynamo.reset()
    fns = {"eager": f}
    with torch.no_grad():
        want = f(*args)
        for backend in cols[1:]:
            fns[backend], first = door(f, backend)
            check(first(*args), want)
    med = measure(fns, args, iters)
    print(format_row(label, med, cols) + (extra(med) if extra else ""), flush=True)
    return med


def format_row(label, med, cols):
    """label, then each column's median in us, then eager/each of ours (and
    inductor/neuron when Inductor ran)."""
    row = label + " " + " ".join(f"{med[c] * 1e6:12.1f}" for c in cols)
    row += "".join(f" {med['eager'] / med[c]:16.2f}" for c in cols[1:] if c != "inductor")
    if "inductor" in cols:
        row += f" {med['inductor'] / med['neuron']:16.2f}"
    return row


def triad():
    """This machine's memory bandwidth, GB/s (the suite's measure of it: a
    triad through torch, best of 5)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.suite import limits
    return limits()["triad_gb_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--shapes", default="64x256,256x1024,1024x1024")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16", "int64", "int32"])
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (it compiles slowly)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    setup_tiers()
    bw = triad()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}; triad {bw:.1f} GB/s (same run)")
    cols = columns(args.no_inductor)
    header(f"{'chain':14s} {'shape':>10s}", cols)
    print(" " * 26 + "(then each tier's bandwidth as a share of the triad's: two inputs and one output moved)")
    for shape_text in args.shapes.split(","):
        shape = tuple(int(s) for s in shape_text.split("x"))
        if dtype.is_floating_point:
            x, y = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
        else:
            x, y = torch.randint(-8, 8, shape, dtype=dtype), torch.randint(-8, 8, shape, dtype=dtype)
        moved = 3 * x.numel() * x.element_size() / 1e9

        def share(med):
            return "".join(f"  {c} {moved / med[c] / bw * 100:3.0f}%" for c in ("neuron-t1", "neuron"))
        for name, f in CHAINS.items():
            try:
                f(x, y)
            except RuntimeError:
                continue
            compare(f"{name:14s} {shape_text:>10s}", f, (x, y), cols, args.iters, extra=share)

if __name__ == "__main__":
    main()
