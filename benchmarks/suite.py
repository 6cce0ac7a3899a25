"""Eager vs Inductor vs neuron (torch.compile) vs jit, same run: latency (p50/p99), speedup,
error against eager, cold and warm start, peak RSS, cost per call.

    python -m benchmarks [--quick] [--only mlp,bert] [--backends eager,neuron,jit]
                         [--zoo bert,minilm | all | none] [--out DIR]
                         [--price-per-hour USD] [--iters N]

Models (benchmarks/models.py), random weights, eval mode, no grad, built
offline (HF_HUB_OFFLINE=1), PyTorch's MHA fast path off (so eager runs the
same ATen ops the compilers see). Per model x shape x back end:

- steady state: `--iters` calls (50 by default) after warm-up, back ends
  interleaved in a rotating order so drift hits all of them; median and p99;
  speedup = eager median / back end median (p99 likewise);
- error: max |out - eager| and that over max |eager| (first output);
- cost per million calls: median x 1e6 / 3600 x --price-per-hour.

Per model x back end, at the model's first shape, each in a fresh process
(benchmarks/startup.py): cold start (empty caches: first call minus eager's
first call) and warm start (the caches an earlier process filled; Inductor's
own FX graph and AOT caches), and the process's peak RSS. The machine's
limits, measured in the same run: memory bandwidth (a triad through torch)
and sgemm GFLOP/s (torch.mm).

Then the Hugging Face zoo (benchmarks/zoo.py; --zoo picks its rows) through
the same back ends, into DIR/zoo.json and DIR/zoo.md.

Writes DIR/results.json (every raw sample), DIR/results.md and, when
matplotlib is installed, DIR/speedup.png, DIR/latency.png, DIR/startup.png.
--quick: one shape per model, 20 iterations, start-up processes for neuron
only (Inductor's cold compiles dominate a full run), the zoo with sdpa at
batch 1 (`--zoo none` skips it); a few minutes on 2 cores.
"""
import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import torchneuron_jit
from benchmarks.models import SUITE

BACKENDS = ("eager", "inductor", "neuron", "jit", "neuron-t1", "jit-t1")
# our doors with their kernels at tier 1 only (neuron and jit: at tier 2, compiled before the call that asks goes on)
TIER1 = {"neuron-t1": "neuron", "jit-t1": "jit"}
OURS = ("neuron", "jit") + tuple(TIER1)
SCHEMA = 2


class _AtTier1:
    """A door whose first calls (those that trace, compile and launch each
    kernel config.tier2_after_calls times) run with compile_tier2 off: its
    kernels stay at tier 1 for good (and row_fusion's auto is off, as where
    tier 2 cannot run); later calls go straight through."""

    FIRST = 6

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        if self.calls >= self.FIRST:
            return self.fn(*args, **kwargs)
        self.calls += 1
        with torchneuron_jit.config.patch(compile_tier2="off"):
            return self.fn(*args, **kwargs)


def setup_tiers():
    """Tier 2 as benchmarks take it: compiled before the call that asks goes
    on, from a kernel's first launch, so warm-up ends at tier 2; and jit's
    variants built on the call that traced (compile_blocking), so warm-up
    ends at the compiled variant (benchmarks/dynamic_serving.py measures
    the background builds)."""
    torchneuron_jit.config.compile_tier2 = "sync"
    torchneuron_jit.config.tier2_after_calls = 1
    torchneuron_jit.config.compile_blocking = True


def compiled(model, backend):
    """model as back end `backend` runs it ("jit": torchneuron_jit.jit, our
    own front door; it takes the model itself, so give it a fresh one;
    "neuron-t1", "jit-t1": those doors at tier 1 only)."""
    if backend == "eager":
        return model
    if backend in TIER1:
        inner = TIER1[backend]
        if inner == "neuron":  # a back end of its own, or Dynamo would reuse the neuron door's graph (one cache
            from torch._dynamo.backends.registry import lookup_backend  # per code object and back end)
            neuron = lookup_backend("neuron")
            return _AtTier1(torch.compile(model, backend=lambda gm, example: neuron(gm, example)))
        return _AtTier1(compiled(model, inner))
    if backend == "jit":
        return torchneuron_jit.jit(model)
    return torch.compile(model, backend=backend)


def doors(model, backends):
    """{back end: model as it runs it}: jit compiles the module it is given,
    so it gets a copy of its own and eager's stays eager."""
    return {b: compiled(copy.deepcopy(model) if b in ("jit", "jit-t1") else model, b) for b in backends}


def _first(out):
    """The first tensor of a model's output (logits of (logits, argmax))."""
    return out[0] if isinstance(out, (tuple, list)) else out


def _quantile(samples, q):
    s = sorted(samples)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def machine():
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def limits(reps=5):
    """Memory bandwidth of a triad a = b + 2c (3 x 128 MB moved per pass)
    and sgemm GFLOP/s (2048^3), best of reps, through torch."""
    n = 32 * 1024 * 1024
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.add(b, c, alpha=2.0, out=a)
        best = min(best, time.perf_counter() - t)
    bandwidth = 3 * n * 4 / best / 1e9
    del a, b, c
    m = 2048
    x, y = torch.rand(m, m), torch.rand(m, m)
    torch.mm(x, y)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(x, y)
        best = min(best, time.perf_counter() - t)
    return {"triad_gb_per_s": bandwidth, "sgemm_gflop_per_s": 2 * m ** 3 / best / 1e9}


def steady(name, shape, backends, iters, warmup, price):
    """Rows of results for one model and shape (one per back end)."""
    build, make_input = SUITE[name][:2]
    torch.manual_seed(0)
    model, x = build().eval(), make_input(shape)
    torch._dynamo.reset()
    fns = doors(model, backends)
    rows = {b: {"model": name, "shape": list(shape), "backend": b} for b in backends}
    with torch.no_grad():
        want = _first(model(x)).float()
        for b, fn in fns.items():
            before = torchneuron_jit.stats()
            t = time.perf_counter()
            got = _first(fn(x)).float()
            rows[b]["in_process_first_call_s"] = time.perf_counter() - t
            err = (got - want).abs().max().item() if got.numel() else 0.0
            rows[b]["max_abs_err"] = err
            rows[b]["max_rel_err"] = err / max(want.abs().max().item(), 1e-30) if got.numel() else 0.0
            for _ in range(max(warmup, 2)):  # jit: a trace, then the compile
                fn(x)
            after = torchneuron_jit.stats()
            if b in OURS:  # tier-2 compiles of the first calls and warm-up
                rows[b]["tier2_kernels"] = after["tier2_kernels"] - before["tier2_kernels"]
                rows[b]["tier2_compiled"] = after["tier2_compiled"] - before["tier2_compiled"]
                rows[b]["tier2_compile_s"] = (after["tier2_compile_ms"] - before["tier2_compile_ms"]) / 1e3
        samples = {b: [] for b in backends}
        order = list(backends)
        for i in range(iters):
            for b in order[i % len(order):] + order[:i % len(order)]:
                t = time.perf_counter()
                fns[b](x)
                samples[b].append(time.perf_counter() - t)
    eager = samples.get("eager")
    for b in backends:
        r, s = rows[b], samples[b]
        r.update(samples_s=s, median_s=statistics.median(s), p99_s=_quantile(s, 0.99),
                 cost_per_million_calls=statistics.median(s) * 1e6 / 3600 * price)
        if eager:
            r["speedup"] = statistics.median(eager) / r["median_s"]
            r["p99_speedup"] = _quantile(eager, 0.99) / r["p99_s"]
    return list(rows.values())


def startup(name, backend, cache_root):
    """Cold and warm start of name on backend, each in a fresh process
    (eager: one process, for its memory)."""
    shape = SUITE[name][2][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHNEURON_", "TORCHINDUCTOR_"))}
    root = Path(__file__).resolve().parent.parent
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(root) + os.pathsep + env.get("PYTHONPATH", ""),
               TORCHNEURON_CACHE_DIR=str(cache_root / "neuron"), TORCHINDUCTOR_CACHE_DIR=str(cache_root / "inductor"))
    row = {"model": name, "shape": list(shape), "backend": backend}
    for phase in ("cold",) if backend == "eager" else ("cold", "warm"):
        p = subprocess.run([sys.executable, "-m", "benchmarks.startup", name, ",".join(map(str, shape)), backend],
                           capture_output=True, text=True, env=env, cwd=root, timeout=1800)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            row[phase] = {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
            continue
        row[phase] = json.loads(lines[-1])
    return row


def _ms(s):
    return f"{s * 1e3:.2f}"


def markdown(result):
    m, lim = result["machine"], result["limits"]
    backends = result["config"]["backends"]
    out = [f"# Benchmarks: {', '.join(backends)}", "",
           f"{m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch threads; torch {m['torch']}, "
           f"Python {m['python']}; commit {m['commit']}; {m['date']}.", "",
           f"Machine limits (same run): memory bandwidth {lim['triad_gb_per_s']:.1f} GB/s (triad), "
           f"sgemm {lim['sgemm_gflop_per_s']:.1f} GFLOP/s.", "",
           f"Mode: {'quick' if result['config']['quick'] else 'full'}, {result['config']['iters']} iterations per "
           "back end, interleaved. Speedup and p99 speedup: eager's figure over the back end's (above 1: faster).", "",
           "## Steady state", ""]
    others = [b for b in backends if b != "eager"]
    head = ["model", "shape"] + [f"{b} p50 ms" for b in backends] + [f"{b} p99 ms" for b in backends]
    head += [f"{b} speedup" for b in others] + [f"{b} p99 speedup" for b in others]
    head += [f"{b} max rel err" for b in others]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {}
    for r in result["results"]:
        by.setdefault((r["model"], tuple(r["shape"])), {})[r["backend"]] = r
    for (model, shape), rs in by.items():
        cells = [model, "x".join(map(str, shape))]
        cells += [_ms(rs[b]["median_s"]) for b in backends] + [_ms(rs[b]["p99_s"]) for b in backends]
        cells += [f"{rs[b].get('speedup', float('nan')):.2f}" for b in others]
        cells += [f"{rs[b].get('p99_speedup', float('nan')):.2f}" for b in others]
        cells += [f"{rs[b]['max_rel_err']:.1e}" for b in others]
        out.append("| " + " | ".join(cells) + " |")
    t2 = [(model, shape, b, rs[b]) for (model, shape), rs in by.items() for b in backends if "tier2_kernels" in rs[b]]
    if t2:
        out += ["", "## Tier 2 per model", "",
                "Kernels swapped to tier 2 in each door's first calls and warm-up, sources the system C compiler "
                "built for them, and its seconds (compile_tier2=sync in this benchmark: the call that asked waited; "
                "by default a worker thread compiles and no call waits). -t1 doors stay at tier 1.", "",
                "| model | shape | door | tier-2 kernels | compiled | compile s |", "|---|---|---|---|---|---|"]
        for model, shape, b, r in t2:
            if b not in TIER1:
                out.append(f"| {model} | {'x'.join(map(str, shape))} | {b} | {r['tier2_kernels']} | "
                           f"{r['tier2_compiled']} | {r['tier2_compile_s']:.2f} |")
    out += ["", f"## Cost per million calls (USD, at {result['config']['price_per_hour']} per hour)", "",
            "| model | shape | " + " | ".join(backends) + " |", "|---|---|" + "---|" * len(backends)]
    for (model, shape), rs in by.items():
        out.append(f"| {model} | {'x'.join(map(str, shape))} | "
                   + " | ".join(f"{rs[b]['cost_per_million_calls']:.3f}" for b in backends) + " |")
    if result["startup"]:
        out += ["", "## Cold and warm start (fresh processes, first shape of each model)", "",
                "Compile = the back end's first call minus eager's first call in the same process. Cold: empty "
                "caches; warm: the caches a cold process filled.", "",
                "RSS: the cold process's resident set after the first call, and its highest (VmHWM; "
                "Inductor's compile worker processes not counted).", "",
                "| model | shape | backend | cold compile s | warm compile s | RSS MB | peak RSS MB |",
                "|---|---|---|---|---|---|---|"]
        for r in result["startup"]:
            def cell(phase, key, fmt):
                v = r.get(phase, {}).get(key)
                return fmt.format(v) if v is not None else r.get(phase, {}).get("error", "-")[:60]
            out.append(f"| {r['model']} | {'x'.join(map(str, r['shape']))} | {r['backend']} | "
                       f"{cell('cold', 'compile_s', '{:.2f}') if r['backend'] != 'eager' else '-'} | "
                       f"{cell('warm', 'compile_s', '{:.2f}') if r['backend'] != 'eager' else '-'} | "
                       f"{cell('cold', 'rss_after_mb', '{:.0f}')} | {cell('cold', 'peak_rss_mb', '{:.0f}')} |")
    return "\n".join(out) + "\n"


def charts(result, out_dir):
    """PNG charts, or a line saying why there are none."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no charts (make bench installs it)"
    backends = result["config"]["backends"]
    by = {}
    for r in result["results"]:
        by.setdefault((r["model"], "x".join(map(str, r["shape"]))), {})[r["backend"]] = r
    labels = [f"{m}\n{s}" for m, s in by]
    others = [b for b in backends if b != "eager"]
    if others:
        fig, ax = plt.subplots(figsize=(max(8, len(labels) * 0.6), 4.5))
        w = 0.8 / len(others)
        for i, b in enumerate(others):
            ax.bar([k + i * w for k in range(len(labels))], [rs[b].get("speedup", 0) for rs in by.values()], w, label=b)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([k + w * (len(others) - 1) / 2 for k in range(len(labels))], labels, fontsize=6, rotation=90)
        ax.set_ylabel("speedup over eager (median)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "speedup.png", dpi=120)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(max(8, len(labels) * 0.6), 4.5))
    w = 0.8 / len(backends)
    for i, b in enumerate(backends):
        xs = [k + i * w for k in range(len(labels))]
        p50 = [rs[b]["median_s"] * 1e3 for rs in by.values()]
        p99 = [rs[b]["p99_s"] * 1e3 for rs in by.values()]
        ax.bar(xs, p50, w, label=f"{b} p50")
        ax.scatter(xs, p99, marker="_", s=60, color="black")
    ax.set_yscale("log")
    ax.set_xticks([k + w * (len(backends) - 1) / 2 for k in range(len(labels))], labels, fontsize=6, rotation=90)
    ax.set_ylabel("latency ms (bars p50, marks p99; log)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "latency.png", dpi=120)
    plt.close(fig)
    rows = [r for r in result["startup"] if r["backend"] != "eager"]
    if rows:
        fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.5), 4.5))
        names = [f"{r['model']}\n{r['backend']}" for r in rows]
        for i, phase in enumerate(("cold", "warm")):
            ax.bar([k + i * 0.4 for k in range(len(rows))],
                   [max(r.get(phase, {}).get("compile_s", 0) or 0, 1e-3) for r in rows], 0.4, label=phase)
        ax.set_yscale("log")
        ax.set_xticks([k + 0.2 for k in range(len(rows))], names, fontsize=6, rotation=90)
        ax.set_ylabel("compile s (first call minus eager's; log)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "startup.png", dpi=120)
        plt.close(fig)
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one shape per model, 20 iterations")
    parser.add_argument("--only", default="", help="comma-separated models: " + ", ".join(SUITE))
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, of " + ", ".join(BACKENDS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="output directory")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per back end (50; quick 20)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per back end first (5; quick 2)")
    parser.add_argument("--price-per-hour", type=float, default=0.10, help="machine price, USD per hour")
    parser.add_argument("--no-startup", action="store_true", help="skip the cold and warm start processes")
    parser.add_argument("--zoo", default="all",
                        help="Hugging Face zoo rows to run too (benchmarks/zoo.py, written to DIR/zoo.md): "
                             "comma-separated, 'all' or 'none'; --quick runs them with sdpa at batch 1")
    args = parser.parse_args(argv)
    models = [m for m in args.only.split(",") if m] or list(SUITE)
    backends = [b for b in args.backends.split(",") if b]
    for m in models:
        if m not in SUITE:
            parser.error(f"--only: unknown model {m!r} (known: {', '.join(SUITE)})")
    for b in backends:
        if b not in BACKENDS:
            parser.error(f"--backends: unknown back end {b!r} (known: {', '.join(BACKENDS)})")
    from benchmarks import zoo
    zoo_rows = [] if args.zoo == "none" else list(zoo.MODELS) if args.zoo == "all" else args.zoo.split(",")
    for m in zoo_rows:
        if m not in zoo.MODELS:
            parser.error(f"--zoo: unknown zoo row {m!r} (known: {', '.join(zoo.MODELS)})")
    if "eager" not in backends:
        backends.insert(0, "eager")  # the reference of every ratio
    setup_tiers()
    iters = args.iters or (20 if args.quick else 50)
    warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.backends.mha.set_fastpath_enabled(False)
    t_start = time.perf_counter()
    result = {"schema": SCHEMA, "machine": machine(), "limits": limits(),
              "config": {"quick": args.quick, "models": models, "backends": backends, "iters": iters, "warmup": warmup,
                         "price_per_hour": args.price_per_hour, "torchneuron_jit": torchneuron_jit.__file__},
              "results": [], "startup": []}
    print(f"limits: {result['limits']['triad_gb_per_s']:.1f} GB/s, {result['limits']['sgemm_gflop_per_s']:.1f} "
          "GFLOP/s", flush=True)
    for name in models:
        shapes = SUITE[name][2][:1] if args.quick else SUITE[name][2]
        for shape in shapes:
            rows = steady(name, shape, backends, iters, warmup, args.price_per_hour)
            result["results"] += rows
            print(f"{name} {'x'.join(map(str, shape))}: " + ", ".join(
                f"{r['backend']} {_ms(r['median_s'])} ms" + (f" ({r['speedup']:.2f}x)" if "speedup" in r else "")
                for r in rows), flush=True)
        if not args.no_startup:
            with tempfile.TemporaryDirectory(prefix="tn_bench_") as tmp:
                for b in (b for b in backends if (not args.quick or b == "neuron") and b not in TIER1):
                    row = startup(name, b, Path(tmp) / b)
                    result["startup"].append(row)
                    print(f"{name} {b} start: " + ", ".join(
                        f"{phase} {row[phase].get('compile_s', row[phase].get('error'))}"
                        for phase in ("cold", "warm") if phase in row), flush=True)
    result["seconds"] = time.perf_counter() - t_start
    (out_dir / "results.json").write_text(json.dumps(result, indent=1))
    (out_dir / "results.md").write_text(markdown(result))
    why = charts(result, out_dir)
    if why:
        print(why)
    print(f"wrote {out_dir}/results.json and results.md in {result['seconds']:.0f} s")
    if zoo_rows:
        zoo.main(["--models", ",".join(zoo_rows), "--doors", ",".join(backends), "--out", str(out_dir)]
                 + (["--attn", "sdpa", "--batch", "1"] if args.quick else []))
