"""Parity with eager on machines with narrower vector ISAs than this one.

Eager's special values (infinities, NaN, signed zeros, saturation) depend on
the kernel PyTorch dispatches to, which depends on the CPU: ATen picks
default / AVX2 / AVX-512 kernels (ATEN_CPU_CAPABILITY forces one), oneDNN
JITs its own (ONEDNN_MAX_CPU_ISA caps it), and our runtime picks libmvec's
AVX-512 or AVX2 math or the scalar library (config.cpu_isa caps it). Each
setting is read once per process, so the isa_parity tests (the pointwise,
half-precision and special-value ones) run again here in a child
interpreter per profile (conftest.isa_profiles), as a machine with only
that ISA would run them; a developer on an AVX-512 machine sees what an
AVX2 machine computes (make test: under the next narrower profile; make
test-long: under each)."""
import os
import subprocess
import sys

import pytest

from conftest import ISA_CHILD_VAR, LONG, REPO, isa_profiles, subprocess_env

IN_CHILD = os.environ.get(ISA_CHILD_VAR)


def _own_profile():
    """The profile this run computes under already (ATen's widest kernels,
    nothing capped): its child run would repeat this run's isa_parity
    tests, so it is left out."""
    import torch
    if any(os.environ.get(v) for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "TORCHNEURON_CPU_ISA")):
        return None
    return torch.backends.cpu.get_cpu_capability().lower()


OWN = _own_profile()
ORDER = ["default", "avx2", "avx512"]  # narrowest first


def _profiles():
    """The profiles to rerun under: make test (CI's 15 minutes) the one
    next narrower than this run's own, the other machine a user most
    likely has (an AVX-512 machine's AVX2 one: a child run takes a core
    for 70-90 s); make test-long every other one the CPU can give."""
    others = {isa: s for isa, s in isa_profiles().items() if isa != OWN}
    if LONG or OWN not in ORDER:
        return others
    narrower = [isa for isa in ORDER[:ORDER.index(OWN)] if isa in others]
    return {isa: others[isa] for isa in narrower[-1:]}


PROFILES = _profiles()


# the files that hold isa_parity tests: a child collects those only (collecting every file took ~10 s of a core)
_PARITY_FILES = sorted(str(f) for f in (REPO / "tests" / "python").glob("test_*.py") if "isa_parity" in f.read_text())


@pytest.fixture(scope="module")
def child_runs(tmp_path_factory):
    """Every profile's child run, started at once (they take a core each
    and mostly wait on it): isa -> (Popen, its output file)."""
    runs = {}
    for isa, settings in PROFILES.items():
        base = tmp_path_factory.mktemp(f"isa-{isa}")
        env = subprocess_env(base / "cache", **settings, **{ISA_CHILD_VAR: isa})
        out = open(base / "out.txt", "w+")
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                 "-m", "isa_parity and not isa_independent",
                                 "--basetemp", str(base / "tmp"), *_PARITY_FILES],
                                cwd=str(REPO), env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        runs[isa] = (proc, out)
    yield runs
    for proc, out in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()


@pytest.mark.skipif(bool(IN_CHILD), reason="a child run under one ISA profile runs no others")
@pytest.mark.parametrize("isa", ["default", "avx2", "avx512"])
def test_parity_tests_pass_under(isa, child_runs):
    if isa == OWN:
        pytest.skip(f"this run is the {isa} profile: its isa_parity tests ran here")
    if isa not in isa_profiles():
        pytest.skip(f"this CPU has no {isa}")
    if isa not in PROFILES:
        pytest.skip(f"make test reruns under {', '.join(PROFILES)} only: make test-long (TN_TEST_LONG=1) under {isa}")
    proc, out = child_runs[isa]
    try:
        proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out.seek(0)
    text = out.read()
    assert proc.returncode == 0, f"isa_parity tests under {isa} ({PROFILES[isa]}):\n{text[-6000:]}"
    assert " passed" in text, text[-2000:]


@pytest.mark.isa_parity
@pytest.mark.skipif(not IN_CHILD, reason="checks a child run's profile")
def test_isa_profile_is_in_effect():
    """The profile's settings reached torch and our runtime."""
    import torch

    from torchneuron_jit import config
    assert torch.backends.cpu.get_cpu_capability() == {"default": "DEFAULT", "avx2": "AVX2",
                                                       "avx512": "AVX512"}[IN_CHILD]
    assert config.cpu_isa == IN_CHILD
