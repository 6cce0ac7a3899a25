"""Shared fixtures of the torchneuron_jit Python tests.

Every test runs hermetically: config.cache_dir points at a fresh directory
under the test's tmp_path (created lazily by the library, so tests can check
how it is created), XDG_CACHE_HOME points into tmp_path too, TORCHNEURON_*
variables of the calling environment are removed, and every tunable is put
back afterwards. Nothing here (or in any test) touches ~/.cache.
"""
import collections
import faulthandler
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torchneuron_jit  # noqa: E402
from torchneuron_jit import _C, _dynamic, _log, cache, config  # noqa: E402


# Tier 2 of generated kernels in the tests: off by default (a C compile per kernel would slow every test and
# make timings and counters depend on a background thread); TN_TEST_TIER2=sync runs the tests with every
# kernel at tier 2 from its first launch (`make test` runs a subset so), =background as users get it.
TIER2 = os.environ.get("TN_TEST_TIER2", "off")
config.compile_tier2 = TIER2
config.tier2_after_calls = 1 if TIER2 == "sync" else config.tier2_after_calls
# jit's builds in the tests: on the calling thread (a test's second call takes the variant its first one
# traced); the tests of background builds turn it off themselves.
config.compile_blocking = True


def _reset_cache_module_state():
    """Closes the process-wide store and forgets per-process warning state
    and counters, so a warning, a refused directory or a count of one test
    cannot hide or fail another's (test_backend's deliberate eager fallbacks
    failed test_jit's "eager_fallbacks == 0" where one worker ran both)."""
    cache.close()
    torchneuron_jit.reset_stats()
    _log._warned.clear()
    cache._disabled = None
    _dynamic._seen.clear()  # the sizes jit has seen per jitted function: one test's cannot make another's dynamic


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """The (not yet existing) cache directory of this test."""
    saved = {name: _C.config_get(name) for name in config.names()}
    for var in list(os.environ):
        if var.startswith("TORCHNEURON_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    _reset_cache_module_state()
    directory = tmp_path / "tn_cache"
    config.cache_dir = str(directory)
    try:
        yield directory
    finally:
        from torchneuron_jit import _jit
        _jit.wait(120)  # a variant a test left building in the background: done before the next test
        _reset_cache_module_state()
        for name, value in saved.items():
            _C.config_set(name, value)


def subprocess_env(cache_directory, **extra):
    """Environment for a child interpreter: this repository importable, no
    inherited TORCHNEURON_* settings, the cache in cache_directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEURON_")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TORCHNEURON_CACHE_DIR"] = str(cache_directory)
    env["TORCHNEURON_COMPILE_TIER2"] = TIER2
    env["TORCHNEURON_COMPILE_BLOCKING"] = "1"
    if TIER2 == "sync":
        env["TORCHNEURON_TIER2_AFTER_CALLS"] = "1"
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


class _Zygote:
    """A zygote.py process: forks a fresh interpreter's equivalent per run
    without its imports (torch, Dynamo, transformers: 3-8 s a child here)."""

    def __init__(self, env):
        self.env = env
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py"))], env=env,
                                     cwd=str(REPO), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.buffer = b""

    def _answer(self, deadline):
        import select
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError("the zygote ended")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, args, env, cwd, timeout, out, err):
        """CompletedProcess of args run in a child, as subprocess.run would
        return it (TimeoutExpired after timeout seconds, the child killed);
        the child's output goes through the files out and err."""
        self.proc.stdin.write((json.dumps({"argv": list(args), "env": env, "cwd": cwd, "out": str(out),
                                           "err": str(err)}) + "\n").encode())
        self.proc.stdin.flush()
        pid = self._answer(None)["pid"]
        done = self._answer(time.monotonic() + timeout)
        if done is None:
            os.kill(pid, signal.SIGKILL)
            self._answer(None)
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess([sys.executable, *args], done["rc"], out.read_text(), err.read_text())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


# What a child's environment may set apart from its zygote's: anything but what torch, its thread
# libraries, transformers or the interpreter read as they are imported (those need an interpreter of their own).
_READ_AT_IMPORT = ("TORCH", "PYTORCH", "ATEN_", "ONEDNN", "DNNL", "OMP_", "KMP_", "GOMP", "MKL", "PYTHON", "LD_",
                   "HF_", "TRANSFORMERS", "TOKENIZERS", "CUDA", "MALLOC")


@pytest.fixture(scope="session")
def _zygotes(tmp_path_factory):
    """Two zygotes, started at the first fresh process a test runs and used
    in turn: one test's consecutive processes then differ in hash seed and
    address layout, as two interpreters do."""
    pool = {"next": 0, "zygotes": [], "runs": 0, "dir": tmp_path_factory.mktemp("zygote")}
    yield pool
    for z in pool["zygotes"]:
        z.close()


@pytest.fixture
def run_python(cache_dir, tmp_path, _zygotes):
    """run_python(*args, env=None, timeout=60, real=False) -> CompletedProcess
    of sys.executable with args (a script, -c code or -m module, then its
    arguments), run in tmp_path with subprocess_env(cache_dir, **env): a
    fresh process, forked by a zygote (zygote.py) unless interpreter
    options (-W) or the environment (_READ_AT_IMPORT) need a real
    interpreter, or real=True asks for one (a test of how it ends: a
    zygote's child skips the module teardown)."""

    def run(*args, env=None, timeout=60, real=False):
        full = subprocess_env(cache_dir, **(env or {}))
        if not real and args and (args[0] in ("-c", "-m") or not args[0].startswith("-")):
            if not _zygotes["zygotes"]:
                _zygotes["zygotes"] = [_Zygote(subprocess_env(cache_dir)) for _ in range(2)]
            z = _zygotes["zygotes"][_zygotes["next"]]
            differ = {k for k in set(full) | set(z.env) if full.get(k) != z.env.get(k)}
            if not any(k.startswith(_READ_AT_IMPORT) and not k.startswith("TORCHNEURON_") for k in differ) \
                    and z.proc.poll() is None:
                _zygotes["next"] ^= 1
                _zygotes["runs"] += 1
                out = _zygotes["dir"] / f"{_zygotes['runs']}"
                try:
                    return z.run(args, full, str(tmp_path), timeout, out.with_suffix(".out"), out.with_suffix(".err"))
                except RuntimeError:  # the zygote ended (its imports failed, or it was killed): a real interpreter
                    pass
        return subprocess.run([sys.executable, *args], cwd=str(tmp_path), env=full,
                              capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def fresh_backend():
    """Dynamo's caches, our counters and once-only warnings reset around a test."""
    import torch

    import torchneuron_jit
    from torchneuron_jit import _log, backend
    torch._dynamo.reset()
    torchneuron_jit.reset_stats()
    _log._warned.clear()
    yield
    torch._dynamo.reset()
    backend.fail_next_compile = None


# -- what a batch of torch.compile calls lowered ---------------------------------

_FUSED = re.compile(r"\[torchneuron_jit compile\] fused \d+ ops into one kernel: (.*)")


class Compiled:
    """What one batch of torch.compile calls lowered, from the compile log
    (config.log must include "compile"), backend.fallback_ops and stats()."""

    def __init__(self, capsys):
        self.capsys = capsys
        self.mark()

    def mark(self):
        from torchneuron_jit import backend  # imports torch: only where used
        self.capsys.readouterr()
        self.fallback0 = collections.Counter(backend.fallback_ops)
        self.kernels0 = torchneuron_jit.stats()["kernels_compiled"]

    def groups(self):
        """The fused groups since mark(), each a list of ATen op names
        (reading the log consumes it: call once per mark)."""
        err = self.capsys.readouterr().err
        return [m.group(1).split(", ") for m in _FUSED.finditer(err)]

    def fallbacks(self):
        from torchneuron_jit import backend
        return backend.fallback_ops - self.fallback0

    def assert_lowered(self, *ops, groups=None):
        """Every op in ops ran inside a generated kernel, none through PyTorch,
        and no graph fell back to eager. Returns the fused groups."""
        groups = self.groups() if groups is None else groups
        st = torchneuron_jit.stats()
        assert st["kernels_compiled"] > self.kernels0, (st, groups)
        assert st["eager_fallbacks"] == 0, st
        fused = {op for g in groups for op in g}
        for op in ops:
            assert op in fused, f"{op} not fused: groups {groups}, eager ops {dict(self.fallbacks())}"
            assert self.fallbacks()[op] == 0, f"{op} also ran through PyTorch: {dict(self.fallbacks())}"
        return groups


@pytest.fixture
def compiled(capsys):
    return Compiled(capsys)


@pytest.fixture
def in_threads():
    """in_threads(body, n=4): runs body(i) for i in range(n) on n threads at
    once; the test fails, naming the thread and its error, if any body
    raised, or if a thread still runs after timeout seconds."""
    def run(body, n=4, timeout=60):
        errors = []

        def guarded(i):
            try:
                body(i)
            except BaseException as exc:  # reported below, with the thread's number
                errors.append((i, repr(exc)))

        threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in threads), "a thread is still running"
        assert errors == []
    return run


@pytest.fixture
def in_child():
    """in_child(body, timeout=60): forks; the child runs body() and exits 0
    if it returns true, 1 if it returns false or raises (it never returns
    into pytest). The test fails if the child fails, or is still running
    after timeout seconds (then it is killed; its threads' Python stacks
    are printed first)."""
    def run(body, timeout=60):
        pid = os.fork()
        if pid == 0:
            ok = False
            faulthandler.dump_traceback_later(max(1, timeout - 2))  # where it hangs, in the captured stderr
            try:
                ok = bool(body())
            except BaseException:
                ok = False
            finally:
                os._exit(0 if ok else 1)
        deadline = time.monotonic() + timeout
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child still ran after {timeout} s")
        assert os.waitstatus_to_exitcode(done[1]) == 0, "the forked child failed"
    return run


# -- eager along each of its CPU kernel paths ------------------------------------

def eager_paths():
    """Context managers, each running eager PyTorch along one of the CPU
    kernel paths this process can reach: as torch dispatches (oneDNN takes
    some ops: exact GELU of a contiguous float tensor of more than one
    element), and with oneDNN off (ATen's own kernels). Their special values
    differ: exact GELU of +inf is +inf through ATen's kernels and oneDNN's
    AVX2 one, NaN through oneDNN's AVX-512 one; which oneDNN kernel runs
    depends on the CPU (ONEDNN_MAX_CPU_ISA narrows it). Where eager is not
    consistent with itself, a test accepts any of its answers."""
    import contextlib
    import warnings

    import torch

    @contextlib.contextmanager
    def without_onednn():
        with warnings.catch_warnings():  # flags() also sets oneDNN's TF32 switch, which warns on CPU builds
            warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
            with torch.backends.mkldnn.flags(enabled=False):
                yield

    return [contextlib.nullcontext, without_onednn]


def eager_answers(f, *args):
    """f(*args) under each of eager_paths(), without grad."""
    import torch
    answers = []
    for path in eager_paths():
        with path(), torch.no_grad():
            answers.append(f(*args))
    return answers


# torch.testing.assert_close's default (rtol, atol) by dtype
_TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
               "float64": (1e-7, 1e-7)}


def close_elementwise(got, want):
    """Where got is want, elementwise: assert_close's tolerances for the
    dtype, NaN where want is NaN, integers and bool exactly."""
    if not got.dtype.is_floating_point:
        return got == want
    rtol, atol = _TOLERANCES[str(got.dtype).replace("torch.", "")]
    g, w = got.double(), want.double()
    return (g.isnan() & w.isnan()) | (g == w) | ((g - w).abs() <= atol + rtol * w.abs())


def assert_matches_an_eager_path(got, answers):
    """got (a tensor or a structure of them) matches eager: each element is
    close to one of eager's answers (eager_answers) at that element. Where
    those agree, this is assert_close with equal_nan."""
    import torch
    from torch.utils._pytree import tree_leaves
    outs = tree_leaves(got)
    wants = [tree_leaves(a) for a in answers]
    assert all(len(w) == len(outs) for w in wants), (len(outs), [len(w) for w in wants])
    for i, g in enumerate(outs):
        first = wants[0][i]
        assert g.dtype == first.dtype and g.shape == first.shape, (i, g.dtype, g.shape, first.dtype, first.shape)
        ok = torch.zeros(g.shape, dtype=torch.bool)
        for w in wants:
            ok |= close_elementwise(g, w[i])
        if not bool(ok.all()):
            at = (~ok).nonzero()[:5].tolist()
            shown = "; ".join(f"at {tuple(p)}: ours {g[tuple(p)].item()}, eager "
                              + " / ".join(str(w[i][tuple(p)].item()) for w in wants) for p in at)
            pytest.fail(f"output {i}: {int((~ok).sum())} of {g.numel()} elements match no eager path: {shown}")


# -- machines with narrower vector ISAs ---------------------------------------------

def isa_profiles():
    """ISA name -> the environment under which a child interpreter computes
    as a machine with at most that vector ISA does: ATen's kernels
    (ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA) and our runtime's
    math (TORCHNEURON_CPU_ISA). avx512 only where the CPU has it (ATen's
    AVX-512 kernels need F, BW, VL and DQ), avx2 where it has AVX2 and FMA."""
    from torchneuron_jit import _tier2
    flags = _tier2.cpu_flags()
    profiles = {"default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                            "TORCHNEURON_CPU_ISA": "default"}}
    if {"avx2", "fma"} <= flags:
        profiles["avx2"] = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "TORCHNEURON_CPU_ISA": "avx2"}
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        profiles["avx512"] = {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
                              "TORCHNEURON_CPU_ISA": "avx512"}
    return profiles


# Set in a child run of the isa_parity tests (tests/python/test_isa.py) to the
# profile it runs under; not TORCHNEURON_*, which the fixture above removes.
ISA_CHILD_VAR = "TN_TEST_ISA"


# make test-long sets TN_TEST_LONG: the tests marked long run then (and only then: `-m long` is how
# the target selects them); make test, CI's, leaves them out to stay within CI's 15 minutes.
LONG = bool(os.environ.get("TN_TEST_LONG"))


def pytest_configure(config):
    config.addinivalue_line("markers", "isa_parity: special-value and half-precision parity with eager, run again "
                            "in a child interpreter under each narrower ISA profile (tests/python/test_isa.py)")
    config.addinivalue_line("markers", "isa_independent: an isa_parity module's test that computes nothing an ISA "
                            "changes (processes, the cache, sizes); its child runs leave it out")
    config.addinivalue_line("markers", "long: more of what a CI-sized test already covers (other models, more "
                            "processes); run by make test-long (TN_TEST_LONG=1), skipped by make test")


def pytest_collection_modifyitems(config, items):
    # test_isa.py's child runs first: under make test's workers (pytest-xdist, a file to a worker) they
    # then run beside the other files instead of after them (108 s of one worker's time, last, on 2 cores)
    items.sort(key=lambda item: item.path.name != "test_isa.py")
    if LONG:
        return
    skip = pytest.mark.skip(reason="a long test: make test-long runs it (TN_TEST_LONG=1)")
    for item in items:
        if item.get_closest_marker("long") is not None:
            item.add_marker(skip)
