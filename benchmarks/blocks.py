"""The model blocks of the back end's tests: eager vs
torch.compile(backend="neuron") (and Inductor), same run.

    python benchmarks/blocks.py [--iters N] [--no-inductor]

MLP, LayerNorm + GELU + residual, hand-written softmax attention,
nn.TransformerEncoderLayer (fast path off) and a GPT-2-style decoder block
(token and position embeddings, causal mask from arange, tanh GELU, tied
output projection, greedy argmax), LLaMA-style attention with rotary
embeddings (rotate_half's cat), eval mode, no grad. Medians of
interleaved runs; results checked against eager (GEMMs sum in another
order: float32 tolerance) before timing.
"""
import argparse

import torch

import torchneuron_jit  # noqa: F401  (registers the back end when not installed)
from models import MLP, Attention, GPTBlock, LNGelu, RotaryAttention
from pointwise import columns, compare, header


def _close(got, want):
    """The first result (the logits of a model that returns two) within
    float32 GEMM tolerance of eager's."""
    first = (lambda r: r[0] if isinstance(r, tuple) else r)
    torch.testing.assert_close(first(got), first(want), rtol=1e-4, atol=1e-4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (it compiles slowly)")
    args = parser.parse_args()
    torch.backends.mha.set_fastpath_enabled(False)
    torch.manual_seed(0)
    x = torch.randn(4, 64, 256)
    cases = [("MLP 4x64x256", MLP(), x), ("MLP 1x8x256", MLP(), torch.randn(1, 8, 256)),
             ("LN+GELU+residual 4x64", LNGelu(), x), ("attention 4x64", Attention(), x),
             ("TransformerEncoderLayer 4x64", torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), x),
             ("rotary attention 4x64", RotaryAttention(), x),
             ("rotary attention 8x128", RotaryAttention(), torch.randn(8, 128, 256)),
             ("GPT block 1x32", GPTBlock(), torch.randint(0, 1000, (1, 32))),
             ("GPT block 8x128", GPTBlock(), torch.randint(0, 1000, (8, 128)))]
    cols = columns(args.no_inductor)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    header(f"{'model':30s}", cols)
    for name, model, inp in cases:
        compare(f"{name:30s}", model.eval(), (inp,), cols, args.iters, check=_close)

if __name__ == "__main__":
    main()
