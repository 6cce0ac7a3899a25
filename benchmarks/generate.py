"""Text generation: transformers' generate() through each door.

    python -m benchmarks.generate [--models llama,gpt2,qwen2] [--backends jit,neuron,inductor]
                                  [--requests 16] [--new-tokens 32] [--out DIR]

A serving loop of generation requests: prompts of 16-128 tokens (one
seeded random sequence of lengths shared by every back end), each
answered greedily with --new-tokens tokens. Models are built from configs
(d 512, 4 layers, random weights; LLaMA with grouped-query attention,
GPT-2, Qwen2, and the encoder-decoder T5, whose prompt is its encoder's
input: every decoder step sees the prompt's length in its cross-attention
cache). generate() passes its DynamicCache to the model's forward
on every step: jit guards it by its attributes and sets the layers' new
keys and values after a compiled call; the Dynamo doors compile
``model.forward`` (``torch.compile(model.forward, backend=...)``, the way
transformers documents it).

Each back end starts cold (an empty cache, Dynamo reset), with its own
copy of the model; its requests alternate with eager's, each timed, and
its tokens are compared with eager's (equal, or the request counts as
different). Reported per model and back end, each against eager's requests
of the same run: the first request's seconds (the compiles it waits for),
the slowest request, the wall time of all, the median of the second half
of the requests (steady state: jit builds its variants in the background
while the first ones run) and its speed over eager's, the decode time per
new token, traces (jit) or graphs (Dynamo), and requests whose tokens
differ.
"""
import argparse
import copy
import os
import random
import statistics
import sys
import tempfile
import time

MODELS = ("llama", "gpt2", "qwen2", "t5")
BACKENDS = ("jit", "neuron", "inductor")


def build(name, d=512, layers=4):
    """A causal LM (or T5) from a config, eval mode, seeded weights."""
    import torch
    import transformers
    torch.manual_seed(0)
    common = dict(hidden_size=d, num_hidden_layers=layers, num_attention_heads=d // 64,
                  intermediate_size=d * 8 // 3, vocab_size=32000, pad_token_id=0)
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=d // 128, **common)).eval()
    if name == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=d // 128, **common)).eval()
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=d, n_layer=layers, n_head=d // 64, vocab_size=32000, pad_token_id=0)).eval()
    if name == "t5":
        return transformers.T5ForConditionalGeneration(transformers.T5Config(
            d_model=d, d_ff=d * 4, d_kv=64, num_layers=layers, num_heads=d // 64, vocab_size=32000, pad_token_id=0,
            decoder_start_token_id=0)).eval()
    raise ValueError(f"unknown model {name!r} (one of {', '.join(MODELS)})")


def prompts(requests, seed=1):
    """The seeded prompts (1 x 16-128 token ids)."""
    import torch
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 32000, (1, rng.randint(16, 128)), generator=g) for _ in range(requests)]


def through(model, backend):
    """model with its forward through backend's door."""
    import torch
    import torchneuron_jit
    if backend == "jit":
        return torchneuron_jit.jit(model)
    model.forward = torch.compile(model.forward, backend=backend)
    return model


def counts(backend):
    import torchneuron_jit
    if backend == "jit":
        return torchneuron_jit.stats()["traces"]
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def run(name, backend, requests, new_tokens):
    """One model through one door: a row of the table."""
    import torch
    import torchneuron_jit
    torch._dynamo.reset()
    torchneuron_jit.reset_stats()
    eager = build(name)
    model = through(copy.deepcopy(eager), backend)
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    ours, theirs, differ = [], [], 0
    with torch.no_grad():
        for ids in prompts(requests):
            t0 = time.perf_counter()
            want = eager.generate(ids, **settings)
            t1 = time.perf_counter()
            got = model.generate(ids, **settings)
            t2 = time.perf_counter()
            theirs.append(t1 - t0)
            ours.append(t2 - t1)
            differ += not torch.equal(got, want)
    from torchneuron_jit import _jit, _tier2
    _jit.wait()  # builds and tier-2 compiles write to this back end's cache until they are done
    _tier2.wait(120)
    # steady state: the second half of the requests (jit builds its variants in the background meanwhile)
    steady, eager_steady = ours[requests // 2:], theirs[requests // 2:]
    median, eager_median = statistics.median(steady), statistics.median(eager_steady)
    return {"model": name, "backend": backend, "first": ours[0], "eager first": theirs[0],
            "slowest": max(ours), "eager slowest": max(theirs), "wall": sum(ours), "eager wall": sum(theirs),
            "median": median, "eager median": eager_median, "speed": eager_median / median,
            "per token": median / new_tokens, "compiles": counts(backend), "differ": differ,
            "requests": requests}


def table(rows):
    head = ("| model | back end | first request s (eager) | slowest request s (eager) | wall s (eager) | "
            "steady median ms (eager) | steady speed over eager | ms per new token | traces / graphs | "
            "tokens ≠ eager |")
    out = [head, "|" + "---|" * 10]
    for r in rows:
        out.append(f"| {r['model']} | {r['backend']} | {r['first']:.2f} ({r['eager first']:.2f}) | "
                   f"{r['slowest']:.2f} ({r['eager slowest']:.2f}) | {r['wall']:.1f} ({r['eager wall']:.1f}) | "
                   f"{r['median'] * 1e3:.1f} ({r['eager median'] * 1e3:.1f}) | {r['speed']:.2f} | "
                   f"{r['per token'] * 1e3:.2f} | {r['compiles']} | {r['differ']} of {r['requests']} |")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", default=None, help="a directory to write generate.md into")
    args = parser.parse_args(argv)
    import torch
    from torchneuron_jit import cache, config
    rows = []
    for name in args.models.split(","):
        for backend in args.backends.split(","):
            with tempfile.TemporaryDirectory(prefix="tn_generate_") as tmp:  # each back end starts cold
                cache.close()
                config.cache_dir = os.path.join(tmp, "neuron")
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")  # Inductor's too
                rows.append(run(name, backend, args.requests, args.new_tokens))
                cache.close()
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    from benchmarks.suite import machine
    m = machine()
    text = (f"# generate() (python -m benchmarks.generate --requests {args.requests} --new-tokens "
            f"{args.new_tokens})\n\n{m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch threads; torch "
            f"{m['torch']}; commit {m['commit']}; {m['date']}.\n\n" + table(rows) + "\n")
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "generate.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
