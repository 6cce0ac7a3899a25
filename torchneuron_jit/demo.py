"""``make demo``: capture a transformer encoder into the graph IR, key it,
keep it in the persistent cache, and show a fresh process finding it.

What runs: a 2-layer ``nn.TransformerEncoder`` (d_model 256, 4 heads, batch
4, sequence 64, eval mode) is traced to ATen by ``make_fx`` (parameters as
inputs), imported into the C graph IR, encoded canonically and hashed
(XXH3-128 over format version, encoding, and the versions that change an
artifact). The cache is looked up under that key; on a miss the encoding is
stored (the lowered kernels join it once the back end lands). Then the same
steps run in a new Python process, which must hit.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.func import functional_call

import torchneuron_jit
from torchneuron_jit import _C, cache
from torchneuron_jit.graph import from_fx


def build_model():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


def key_context():
    """Everything besides the graph that changes what a cache entry means."""
    return (f"torchneuron_jit {torchneuron_jit.__version__}; torch {torch.__version__}; "
            f"graph format {_C.GRAPH_FORMAT_VERSION}").encode()


def capture(model, x):
    params = dict(model.named_parameters())
    params.update(model.named_buffers())
    t0 = time.perf_counter()
    with torch.no_grad():
        gm = make_fx(lambda p, inp: functional_call(model, p, (inp,)), tracing_mode="fake")(params, x)
    trace_s = time.perf_counter() - t0
    roles = [("param", name) for name in params] + [("arg", 0, "")]
    t0 = time.perf_counter()
    imported = from_fx(gm, roles)
    import_s = time.perf_counter() - t0
    return gm, imported, trace_s, import_s


def run_once():
    model = build_model()
    x = torch.randn(4, 64, 256)
    gm, imported, trace_s, import_s = capture(model, x)
    g = imported.graph
    ctx = key_context()
    timings = []
    for _ in range(20):
        fresh = from_fx(gm, imported.inputs).graph  # nothing encoded yet inside
        t0 = time.perf_counter()
        key = fresh.key(ctx)
        timings.append(time.perf_counter() - t0)
    encoding = g.encode()
    cache.stats()  # opens the store, so the lookup below is timed alone
    t0 = time.perf_counter()
    stored = cache.get(cache.ARTIFACTS, key)
    get_s = time.perf_counter() - t0
    hit = stored is not None
    same = None
    if hit:
        same = _C.decode_graph(stored).encode() == encoding
    else:
        cache.put(cache.ARTIFACTS, key, encoding)
    st = cache.stats()
    return {
        "pid": os.getpid(),
        "aten_nodes": sum(1 for n in gm.graph.nodes if n.op == "call_function"),
        "ir_nodes": g.num_nodes,
        "ir_inputs": g.num_inputs,
        "in_op_table": imported.lowered_nodes,
        "fallback_ops": dict(collections.Counter(imported.fallback_ops)),
        "trace_ms": trace_s * 1e3,
        "import_ms": import_s * 1e3,
        "encode_and_key_ms_median": statistics.median(timings) * 1e3,
        "encoding_bytes": len(encoding),
        "key": key.hex(),
        "cache_hit": hit,
        "stored_graph_matches": same,
        "cache_get_ms": get_s * 1e3,
        "cache": {k: st[k] for k in ("path", "enabled", "entries", "bytes", "hits", "misses")},
    }


def report(title, r):
    print(f"== {title} (pid {r['pid']})")
    print(f"  traced {r['aten_nodes']} ATen nodes in {r['trace_ms']:.0f} ms (make_fx); "
          f"imported {r['ir_nodes']} IR nodes, {r['ir_inputs']} inputs in {r['import_ms']:.1f} ms")
    print(f"  in the op table: {r['in_op_table']}; fallback: "
          + (", ".join(f"{k} x{v}" for k, v in sorted(r["fallback_ops"].items())) or "none"))
    print(f"  canonical encoding {r['encoding_bytes']} bytes; encode + XXH3-128 key "
          f"{r['encode_and_key_ms_median']:.3f} ms (median of 20)")
    print(f"  key {r['key']}")
    verdict = "HIT" if r["cache_hit"] else "miss (stored)"
    extra = "" if r["stored_graph_matches"] is None else \
        f", stored graph {'identical' if r['stored_graph_matches'] else 'DIFFERENT'}"
    print(f"  cache {verdict} in {r['cache_get_ms']:.2f} ms{extra}")
    c = r["cache"]
    print(f"  cache {c['path']}: enabled={c['enabled']} entries={c['entries']} "
          f"bytes={c['bytes']} hits={c['hits']} misses={c['misses']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help="run once and print JSON")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_once()))
        return 0
    first = run_once()
    report("this process", first)
    out = subprocess.run([sys.executable, "-m", "torchneuron_jit.demo", "--child"],
                         check=True, capture_output=True, text=True)
    second = json.loads(out.stdout.strip().splitlines()[-1])
    report("a fresh process", second)
    ok = second["cache_hit"] and second["key"] == first["key"] and second["stored_graph_matches"]
    print("OK: same key in both processes and the fresh process hit the cache"
          if ok else "FAILED: the fresh process did not find the same entry")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
