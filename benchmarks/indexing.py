"""Index-valued ops: argmax over the last dim and gather along it (with
arithmetic after), eager vs torch.compile(backend="neuron") (and Inductor),
same run.

    python benchmarks/indexing.py [--iters N] [--no-inductor]

Medians of interleaved runs (eager, neuron, inductor, eager, ...); results
are checked against eager (exactly) before timing.
"""
import argparse

import torch

import torchneuron_jit  # noqa: F401  (registers the back end when not installed)
from pointwise import columns, compare, header


def argmax(x):
    return x.argmax(-1)


def gather(x, i):
    return torch.gather(x, 1, i) * 2 + 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (it compiles slowly)")
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = [(f"argmax {r}x{c}", argmax, (torch.randn(r, c),))
             for r, c in ((64, 1000), (8, 32000), (1024, 1024), (1, 50257))]
    cases += [(f"gather {r}x{c} k {k}", gather, (torch.randn(r, c), torch.randint(0, c, (r, k))))
              for r, c, k in ((64, 1000, 32), (512, 1000, 300), (2048, 512, 512))]
    cols = columns(args.no_inductor)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    header(f"{'case':24s}", cols)
    for name, f, xs in cases:
        compare(f"{name:24s}", f, xs, cols, args.iters, check=lambda got, want: torch.testing.assert_close(
            got, want, rtol=0, atol=0))

if __name__ == "__main__":
    main()
