"""The differential fuzzer (torchneuron_jit.testing.fuzz) on a fixed budget:
deterministic programs, every one matching eager; and the fuzzer itself:
its programs are valid, reproducible, and a planted mismatch is found,
shrunk and printed as a runnable file."""
import random
import subprocess
import sys

import torch

from conftest import REPO, subprocess_env
from torchneuron_jit import backend
from torchneuron_jit.testing import fuzz


# CI's budget (make test-long runs the fuzzer for 10 minutes through each door, and 30 with tier 2)
PROGRAMS = 60


def test_fixed_budget_of_programs_matches_eager():
    ran, bad = fuzz.fuzz(programs=PROGRAMS, seed=7, log=lambda *a: None)
    assert ran == PROGRAMS
    assert not bad, "\n\n".join(f"program {i}: {why}\n{p.script(i)}" for i, why, p in bad)


def test_programs_are_deterministic_and_valid():
    a = fuzz.generate(random.Random(3))
    b = fuzz.generate(random.Random(3))
    assert a.source() == b.source() and a.inputs == b.inputs
    f = fuzz._compile(a.source())
    outs = fuzz._run(f, a.make_inputs(1))
    assert len(outs) == len(a.outputs)
    again = fuzz._run(f, a.make_inputs(1))
    for x, y in zip(outs, again):
        assert fuzz._same(x, y) is None


def test_planted_mismatch_is_found_shrunk_and_printed(monkeypatch, tmp_path, cache_dir):
    """A back end that gets exp wrong (its graphs holding an exp add 1 to
    their float32 results): the fuzzer reports it, shrinks the program to
    the statement that shows it, and prints a file that runs."""
    real = backend.plan_of

    class Wrong:
        _boxed_call = True

        def __init__(self, plan):
            self.plan = plan

        def __call__(self, args):
            out = self.plan(args)
            eager = self.plan.eager  # the graph module's forward
            if any(n.target is torch.ops.aten.exp.default for n in eager.__self__.graph.nodes):
                out = [o + 1 if isinstance(o, torch.Tensor) and o.dtype == torch.float32 else o for o in out]
            return out

    monkeypatch.setattr(backend, "plan_of", lambda gm, eager: Wrong(real(gm, eager)))
    program = fuzz.Program([(torch.float32, (4, 5), "t")],
                           [("relu", (0,), {}), ("exp", (1,), {}), ("mul_s", (2,), {"p": 2}), ("neg", (0,), {})],
                           [3, 4])
    why = fuzz.compare(program, 1)
    assert why and why.startswith("output 0"), why
    small = fuzz.shrink(program, 1, why)
    assert [op for op, _, _ in small.stmts] == ["exp"] and small.inputs[0][2] == "c", small.source()
    monkeypatch.setattr(backend, "plan_of", real)
    script = tmp_path / "repro.py"
    script.write_text(small.script(1))
    p = subprocess.run([sys.executable, str(script)], env=subprocess_env(cache_dir), capture_output=True, text=True,
                       timeout=300, cwd=REPO)
    assert p.returncode == 0 and "no mismatch" in p.stdout, p.stderr[-2000:]  # the real back end is right


def test_command_line_reports_its_run(cache_dir):
    p = subprocess.run([sys.executable, "-m", "torchneuron_jit.testing.fuzz", "--seconds", "1000", "--programs", "5",
                        "--seed", "2"], env=subprocess_env(cache_dir), capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "seed 2: 5 programs" in p.stdout and "0 mismatches" in p.stdout
