"""Smoke test of the benchmark suite (python -m benchmarks): a quick run of
one model with tiny iteration counts writes results of the documented
schema. Nothing here asserts a timing."""
import json

import torch


def test_quick_run_of_mlp_writes_the_schema(tmp_path, run_python):
    out = tmp_path / "results"
    p = run_python("-m", "benchmarks", "--quick", "--only", "mlp", "--backends", "eager,neuron,jit,neuron-t1",
                   "--iters", "3", "--warmup", "1", "--out", str(out), "--price-per-hour", "2.0", "--zoo", "distilbert",
                   timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    assert result["schema"] == 2
    assert {"cpu", "cores", "torch", "commit", "date"} <= set(result["machine"])
    assert result["limits"]["triad_gb_per_s"] > 0 and result["limits"]["sgemm_gflop_per_s"] > 0
    assert result["config"]["backends"] == ["eager", "neuron", "jit", "neuron-t1"] and result["config"]["iters"] == 3
    rows = {r["backend"]: r for r in result["results"]}
    assert set(rows) == {"eager", "neuron", "jit", "neuron-t1"}
    for door in ("neuron", "jit", "neuron-t1"):  # our doors per tier: what their first calls sent to tier 2
        assert rows[door]["tier2_kernels"] >= 0 and rows[door]["tier2_compile_s"] >= 0
    assert rows["neuron-t1"]["tier2_kernels"] == 0
    for r in rows.values():
        assert r["model"] == "mlp" and r["shape"] == [1, 32]
        assert len(r["samples_s"]) == 3 and all(s > 0 for s in r["samples_s"])
        assert min(r["samples_s"]) <= r["median_s"] <= r["p99_s"] <= max(r["samples_s"])
        assert r["cost_per_million_calls"] == r["median_s"] * 1e6 / 3600 * 2.0
        assert r["speedup"] > 0 and r["p99_speedup"] > 0
    assert rows["eager"]["max_abs_err"] == 0
    assert all(rows[d]["max_rel_err"] < 1e-4 for d in ("neuron", "jit", "neuron-t1"))
    (start,) = result["startup"]  # quick: the neuron back end's only
    assert start["backend"] == "neuron"
    cold, warm = start["cold"], start["warm"]
    assert cold["neuron_stats"]["cache_misses"] >= 1 and cold["neuron_stats"]["graphs_lowered"] >= 1
    assert warm["neuron_stats"]["cache_hits"] >= 1 and warm["neuron_stats"]["graphs_lowered"] == 0
    for phase in (cold, warm):
        assert phase["first_call_s"] > 0 and phase["peak_rss_mb"] > 0
        assert phase["compile_s"] == phase["first_call_s"] - phase["eager_first_call_s"]
    md = (out / "results.md").read_text()
    assert "| mlp | 1x32 |" in md and "Cold and warm start" in md and "## Tier 2 per model" in md
    zoo = json.loads((out / "zoo.json").read_text())  # the zoo through the same doors, quick: sdpa at batch 1
    assert [(r["model"], r["attn"], r["batch"]) for r in zoo["rows"]] == [("distilbert", "sdpa", 1)]
    assert set(zoo["rows"][0]["doors"]) == {"eager", "neuron", "jit", "neuron-t1"}
    assert "| distilbert | sdpa | 1 |" in (out / "zoo.md").read_text()


def test_unknown_model_is_refused(tmp_path, run_python):
    p = run_python("-m", "benchmarks", "--only", "resnet9000", "--out", str(tmp_path), timeout=300)
    assert p.returncode == 2 and "unknown model 'resnet9000'" in p.stderr
    p = run_python("-m", "benchmarks", "--zoo", "bert,gpt9", "--out", str(tmp_path), timeout=300)
    assert p.returncode == 2 and "unknown zoo row 'gpt9'" in p.stderr


def test_the_jit_door_gets_its_own_copy_of_the_model():
    """jit compiles the module it is given: the suite hands it a copy, so
    the eager reference of the same run stays eager."""
    from benchmarks import suite
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    fns = suite.doors(model, ["eager", "neuron", "jit"])
    assert fns["eager"] is model and getattr(model.forward, "_tn_jit", None) is None
    assert getattr(fns["jit"].forward, "_tn_jit", None) is not None
    x = torch.randn(3, 8)
    with torch.no_grad():
        for fn in fns.values():
            torch.testing.assert_close(fn(x), model(x))


def test_generate_run_writes_its_table(tmp_path, run_python):
    """python -m benchmarks.generate: each request's tokens compared with
    eager's, a row per model and door (nothing here asserts a timing)."""
    p = run_python("-m", "benchmarks.generate", "--models", "gpt2", "--backends", "jit", "--requests", "2",
                   "--new-tokens", "3", "--out", str(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line for line in (tmp_path / "generate.md").read_text().splitlines() if line.startswith("| gpt2 |")]
    assert len(rows) == 1 and rows[0].startswith("| gpt2 | jit |") and rows[0].endswith("| 0 of 2 |"), rows
