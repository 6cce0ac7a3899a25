"""The Python-state fuzzer (torchneuron_jit.testing.statefuzz) on a fixed
budget: random programs that read and write globals, closures, dicts,
lists, object and class attributes, with the state changed between calls,
through jit against eager, every call; and the fuzzer finds a planted hole
(content guards off)."""
import random

from torchneuron_jit import _jit
from torchneuron_jit.testing import statefuzz


def test_fixed_budget_of_state_programs_matches_eager():
    ran, calls, bad = statefuzz.fuzz(programs=80, seed=7, log=lambda *a: None)
    assert ran == 80 and calls == 480
    assert not bad, "\n\n".join(f"program {i}: {why}\n{src}\nchanges: {ch}" for i, why, src, ch in bad[:3])


def test_programs_are_deterministic():
    assert statefuzz.generate(random.Random(5)) == statefuzz.generate(random.Random(5))


def test_a_planted_hole_is_found(monkeypatch):
    """With the contents of what globals and closures hold unguarded (as
    before issue 17), reads of a changed dict, list or attribute are stale."""
    monkeypatch.setattr(_jit, "_content_guarded", lambda value: False)
    ran, _, bad = statefuzz.fuzz(programs=30, seed=7, log=lambda *a: None)
    assert bad, "no mismatch found with content guards off"
