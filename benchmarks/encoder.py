"""Transformer encoder layers (the `make demo` model at several shapes):
eager vs torch.compile(backend="neuron") (and Inductor), same run.

    python benchmarks/encoder.py [--iters N] [--no-inductor] [--layers L] [--d D] [--packed]

nn.TransformerEncoder with PyTorch's fused fast path off (so the layers
reach the back ends as ATen ops, as a user's own modules do), eval mode,
no grad; batch 1, 4 and 8 at sequence 32, 64 and 128. Medians of
interleaved runs (eager, neuron, inductor, eager, ...); results are checked
against eager (GEMMs sum in another order: float32 tolerance) before timing.
"""
import argparse

import torch

import torchneuron_jit  # registers the back end when not installed
from pointwise import columns, compare, header


def encoder(layers, d):
    torch.backends.mha.set_fastpath_enabled(False)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=max(1, d // 64), dim_feedforward=4 * d,
                                             batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False).eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (it compiles slowly)")
    parser.add_argument("--packed", action="store_true",
                        help="config.onednn_packed_weights: also time linear layers on packed weights")
    args = parser.parse_args()
    torchneuron_jit.config.onednn_packed_weights = args.packed
    model = encoder(args.layers, args.d)
    cols = columns(args.no_inductor)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.layers} layers, d {args.d}")
    header(f"{'batch x seq':20s}", cols)
    for batch, seq in ((1, 32), (4, 64), (8, 128)):
        compare(f"{f'{batch} x {seq}':20s}", model, (torch.randn(batch, seq, args.d),), cols, args.iters,
                check=lambda got, want: torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4))

if __name__ == "__main__":
    main()
