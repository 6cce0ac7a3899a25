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
import math

import torch

import torchneuron_jit  # noqa: F401  (registers the back end when not installed)
from pointwise import columns, compare, header

F = torch.nn.functional


class MLP(torch.nn.Module):
    def __init__(self, d=256, h=1024):
        super().__init__()
        self.a, self.b = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


class LNGelu(torch.nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.ln, self.fc = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x):
        return x + F.gelu(self.fc(self.ln(x)))


class Attention(torch.nn.Module):
    def __init__(self, d=256, h=4):
        super().__init__()
        self.qkv, self.o, self.h = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d), h

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.h), -1)
        return self.o((a @ v).transpose(1, 2).reshape(b, s, d))


class GPTBlock(torch.nn.Module):
    def __init__(self, d=256, h=4, vocab=1000, positions=128):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.wte, self.wpe, self.h = torch.nn.Embedding(vocab, d), torch.nn.Embedding(positions, d), h

    def forward(self, ids):
        b, s = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(s))
        d = x.shape[-1]
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2)
                   for t in self.attn(self.ln1(x)).split(d, dim=-1))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.h))
        causal = torch.arange(s)[:, None] >= torch.arange(s)[None, :]
        att = torch.softmax(att.masked_fill(~causal, float("-inf")), -1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        x = x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        logits = x @ self.wte.weight.t()
        return logits, logits.argmax(-1)


class RotaryAttention(torch.nn.Module):
    """LLaMA-style attention: rotary position embedding (rotate_half: a cat
    of a negated half and the other half) on q and k."""
    def __init__(self, d=256, h=4, positions=128):
        super().__init__()
        self.qkv, self.o, self.h = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d, bias=False), h
        inv = 1.0 / (10000 ** (torch.arange(0, d // h, 2).float() / (d // h)))
        angles = torch.outer(torch.arange(positions).float(), inv)
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos())
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin())

    @staticmethod
    def rotate_half(t):
        half = t.shape[-1] // 2
        return torch.cat((-t[..., half:], t[..., :half]), -1)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        cos, sin = self.cos[:s], self.sin[:s]
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, s, d))


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
