"""Token embedding lookups fused with what follows: eager vs
torch.compile(backend="neuron") (and Inductor), same run.

    python benchmarks/embedding.py [--iters N] [--no-inductor]

The model is a transformer's input layer, emb(ids) * sqrt(d) + position
rows, at a few sizes; and, for comparison, batch norm + relu of a CNN layer
(eval), which we leave to eager's native kernels. Eager runs without
Dynamo, the compiled columns with it (about 12-15 us a call here). Medians
of interleaved runs (eager, neuron, inductor, eager, ...); results are
checked against eager before timing.
"""
import argparse

import torch

import torchneuron_jit  # noqa: F401  (registers the back end when not installed)
from pointwise import columns, compare, header


class Embed(torch.nn.Module):
    def __init__(self, vocab, d, positions):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(positions, d))
        self.scale = d ** 0.5

    def forward(self, ids):
        return self.tok(ids) * self.scale + self.pos[: ids.shape[1]]


def bn_relu(channels):
    m = torch.nn.Sequential(torch.nn.BatchNorm2d(channels), torch.nn.ReLU()).eval()
    with torch.no_grad():
        m[0].running_mean.uniform_(-1, 1)
        m[0].running_var.uniform_(0.5, 2)
    return m


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (it compiles slowly)")
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = [
        ("embed 1x32 d256", Embed(30000, 256, 512).eval(), torch.randint(0, 30000, (1, 32))),
        ("embed 8x128 d256", Embed(30000, 256, 512).eval(), torch.randint(0, 30000, (8, 128))),
        ("embed 8x128 d768", Embed(30000, 768, 512).eval(), torch.randint(0, 30000, (8, 128))),
        ("bn+relu 1x16x32x32", bn_relu(16), torch.randn(1, 16, 32, 32)),
        ("bn+relu 8x64x56x56", bn_relu(64), torch.randn(8, 64, 56, 56)),
    ]
    cols = columns(args.no_inductor)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    header(f"{'case':20s}", cols)
    for name, model, x in cases:
        compare(f"{name:20s}", model, (x,), cols, args.iters)

if __name__ == "__main__":
    main()
