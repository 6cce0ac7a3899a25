"""Row kernels and GEMM epilogues: eager vs neuron vs Inductor, same run.

    python benchmarks/rows_gemm.py [--iters N] [--no-inductor]

Row kernels (config.row_fusion) and GEMM groups (config.gemm_fusion), turned
on, at tier 1 only (neuron-t1) and at tier 2 (neuron), against eager and
Inductor, interleaved as in pointwise.py, with the ratios eager/ours and
inductor/neuron. Results are checked before
timing: no farther from a float64 reference than twice eager's error.
"""
import argparse

import torch
import torch.nn.functional as F

import torchneuron_jit
from pointwise import columns, compare, header, setup_tiers

ROWS = {
    "softmax": (lambda x, w, b, y: torch.softmax(x, -1)),
    "softmax(x*s+m)": (lambda x, w, b, y: torch.softmax(x * 0.125 + w, -1)),
    "layer_norm": (lambda x, w, b, y: F.layer_norm(x, x.shape[-1:], w, b)),
    "add+layer_norm": (lambda x, w, b, y: F.layer_norm(x + y, x.shape[-1:], w, b)),
    "sum(-1)": (lambda x, w, b, y: x.sum(-1)),
}
ROW_SHAPES = ((256, 256), (1024, 64), (4096, 1024))

GEMMS = {
    "linear+relu": (lambda x, w1, b1, w2, b2: F.relu(F.linear(x, w1, b1))),
    "mlp": (lambda x, w1, b1, w2, b2: F.linear(F.relu(F.linear(x, w1, b1)), w2, b2) + x),
}
GEMM_SHAPES = ((64, 256, 1024), (256, 256, 1024))  # tokens, d_model, d_ff


def run(name, shape_text, f, args, cols, iters):
    def close(got, want):
        # sums run in another order: ours may be no farther from float64 than eager's
        ref = f(*(a.double() for a in args))
        ours, theirs = (got.double() - ref).abs().max(), (want.double() - ref).abs().max()
        assert ours <= 2 * theirs + 1e-6 * ref.abs().max(), (name, float(ours), float(theirs))
    compare(f"{name:16s} {shape_text:>14s}", f, args, cols, iters, check=close)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (it compiles slowly)")
    args = parser.parse_args()
    torchneuron_jit.config.row_fusion = True
    torchneuron_jit.config.gemm_fusion = True
    setup_tiers()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    cols = columns(args.no_inductor)
    header(f"{'graph':16s} {'shape':>14s}", cols)
    for shape in ROW_SHAPES:
        x, y = torch.randn(shape), torch.randn(shape)
        w, b = torch.randn(shape[-1]), torch.randn(shape[-1])
        for name, f in ROWS.items():
            run(name, "x".join(map(str, shape)), f, (x, w, b, y), cols, args.iters)
    for m, d, ff in GEMM_SHAPES:
        x = torch.randn(m, d)
        w1, b1, w2, b2 = torch.randn(ff, d) / d ** 0.5, torch.randn(ff), torch.randn(d, ff) / ff ** 0.5, torch.randn(d)
        for name, f in GEMMS.items():
            run(name, f"{m}x{d}x{ff}", f, (x, w1, b1, w2, b2), cols, args.iters)


if __name__ == "__main__":
    main()
