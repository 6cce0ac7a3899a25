"""The models the benchmarks run, built offline with random weights
(seeded by the caller): the back end's test blocks, transformer encoders,
Hugging Face BERT and GPT-2 from configs, and a small CNN.

``SUITE`` maps each name ``python -m benchmarks --only`` takes to a builder
of (model, example input of a shape); shapes are (batch, sequence) for the
sequence models and (batch,) for the CNN, whose images are 3x64x64.
"""
import math

import torch

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


class PointwiseBlock(torch.nn.Module):
    """Pointwise-heavy: LayerNorm, GELU, a scaled residual and a softmax
    over the features, around one small projection."""
    def __init__(self, d=256):
        super().__init__()
        self.ln1, self.ln2, self.fc = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x):
        y = F.gelu(self.ln1(x)) * 0.5 + x
        y = y + torch.softmax(self.fc(y) * 0.125, -1) * F.gelu(y, approximate="tanh")
        return self.ln2(y).sigmoid() * y


class SmallCNN(torch.nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.adaptive_avg_pool2d(F.relu(self.c2(x)), 1).flatten(1)
        return self.fc(x)


class HFModel(torch.nn.Module):
    """A transformers model returning its last hidden state (a tensor)."""
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


def _hf(kind):
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    if kind == "bert":
        cfg = transformers.BertConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                      intermediate_size=1024, max_position_embeddings=256)
        return HFModel(transformers.BertModel(cfg, add_pooling_layer=False))
    cfg = transformers.GPT2Config(vocab_size=8000, n_embd=256, n_layer=4, n_head=4, n_positions=256,
                                  bos_token_id=0, eos_token_id=0)
    return HFModel(transformers.GPT2Model(cfg))


def _encoder(layers, d, heads):
    layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def _features(d):
    return lambda shape: torch.randn(shape[0], shape[1], d)


def _ids(vocab):
    return lambda shape: torch.randint(0, vocab, shape)


# name -> (builder of the model, builder of an input of a shape, shapes, what it is)
SEQ_SHAPES = ((1, 32), (1, 128), (8, 32), (8, 128))
SUITE = {
    "mlp": (lambda: MLP(), _features(256), SEQ_SHAPES, "2 linear layers 256-1024-256 with ReLU"),
    "pointwise": (lambda: PointwiseBlock(), _features(256), SEQ_SHAPES,
                  "LayerNorm / GELU / softmax chains around one 256x256 linear"),
    "encoder2": (lambda: _encoder(2, 256, 4), _features(256), SEQ_SHAPES,
                 "nn.TransformerEncoder, 2 layers, d=256, 4 heads"),
    "encoder12": (lambda: _encoder(12, 768, 12), _features(768), SEQ_SHAPES,
                  "nn.TransformerEncoder, 12 layers, d=768, 12 heads"),
    "gpt_block": (lambda: GPTBlock(), _ids(1000), SEQ_SHAPES,
                  "GPT-2-style decoder block with embeddings, tied head and argmax (d=256)"),
    "bert": (lambda: _hf("bert"), _ids(8000), SEQ_SHAPES,
             "transformers BertModel from a config: 4 layers, d=256, 4 heads"),
    "gpt2": (lambda: _hf("gpt2"), _ids(8000), SEQ_SHAPES,
             "transformers GPT2Model from a config: 4 layers, d=256, 4 heads"),
    "cnn": (lambda: SmallCNN(), lambda shape: torch.randn(shape[0], 3, 64, 64), ((1,), (8,)),
            "2 conv layers (3-16-32), pooling, linear; images 3x64x64"),
}
