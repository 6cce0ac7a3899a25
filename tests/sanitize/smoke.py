"""Smoke test of the extension built with AddressSanitizer and
UndefinedBehaviorSanitizer (make test-asan): every kind of kernel, the
cache (write, a fresh process's hit, a damaged file), GEMM and row fusion,
threads, torchneuron_jit.jit, results compared with eager. A sanitizer finding aborts the
process; so does a mismatch."""
import copy
import gc
import os
import subprocess
import sys
import tempfile
import threading

import torch

import torchneuron_jit
from torchneuron_jit import config

assert "asan-py" in torchneuron_jit.__file__, torchneuron_jit.__file__  # the instrumented build
config.cache_dir = os.environ.get("TN_SMOKE_CACHE") or tempfile.mkdtemp(prefix="tn_asan_")
config.row_fusion = True
config.gemm_fusion = True
F = torch.nn.functional


def check(fn, *args, **tol):
    torch._dynamo.reset()
    with torch.no_grad():
        got, want = torch.compile(fn, backend="neuron")(*args), fn(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, equal_nan=True, **tol)


x, y = torch.randn(64, 96), torch.randn(96)
check(lambda a, b: (torch.sigmoid(a * 2 + b) * torch.tanh(a)).relu(), x, y)
check(lambda a, b: torch.where(a > b, a, b.exp()).masked_fill(a < -1, float("nan")), x, y)
check(lambda a: (a.to(torch.float16) * 3).to(torch.bfloat16) + 1, x, atol=1e-2, rtol=1e-2)
check(lambda a: ((a * 100).to(torch.int32) * 7 - 3).to(torch.int8) > 0, x)
check(lambda a: a.t().contiguous() * 2 + a.t()[..., 1:2], x)
check(lambda a: torch.softmax(a * 0.5, -1), x)
check(lambda a, b: F.layer_norm(a + b, (96,)) * 2, x, y)
check(lambda a: (a.sum(-1, keepdim=True), a.amax(0), a.var(-1), a.logsumexp(-1)), x, atol=1e-4, rtol=1e-4)
check(lambda a: (a.argmax(-1), a.argmin()), x)
check(lambda a, w, b: torch.relu(a @ w + b) + 1, x, torch.randn(96, 48), torch.randn(48), atol=1e-4, rtol=1e-4)
check(lambda a, b: torch.bmm(a, b) * 0.5, torch.randn(4, 8, 16), torch.randn(4, 16, 8), atol=1e-4, rtol=1e-4)
table, ids = torch.randn(50, 32), torch.randint(0, 50, (4, 9))
check(lambda t, i: F.embedding(i, t) * 2 + 1, table, ids)
check(lambda a, i: torch.gather(a, 1, i) * 2, x, torch.randint(0, 96, (64, 7)))
check(lambda q: q * 2 + torch.cat((-q[..., 32:], q[..., :32]), -1), torch.randn(2, 4, 16, 64))
check(lambda a, b: torch.cat([a.exp() + 1, b.sin() * 2], 1), torch.randn(8, 5), torch.randn(8, 3))
check(lambda a: (a * 2).cumsum(0).exp() * 0.5, x)  # donor buffer after an eager op
check(lambda a: torch.arange(a.shape[-1]) * a + torch.full((96,), 2.0), x)
check(lambda a: (a[:0] * 2, torch.tensor(3.0) * a[0, 0]), x)

model = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
torch.backends.mha.set_fastpath_enabled(False)
inp = torch.randn(2, 16, 64)
check(model, inp, atol=1e-4, rtol=1e-4)

torch._dynamo.reset()
shared = torch.compile(lambda a: torch.tanh(a * 3 + 1) * a, backend="neuron")
big = torch.randn(256, 1024)
want = torch.tanh(big * 3 + 1) * big


def in_threads(check, n=4):
    """Runs check() in n threads at once; any failure fails the test."""
    errors = []

    def worker():
        try:
            with torch.no_grad():
                check()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def shared_calls():
    for _ in range(20):
        torch.testing.assert_close(shared(big), want)


in_threads(shared_calls)

# our own front door: the frame hook, C guards (hits, misses, side exits,
# write-backs), a module, threads
@torchneuron_jit.jit
def jitted(a, b, k):
    a.mul_(1.0)
    out = torch.sigmoid(a * 2 + b) * torch.tanh(a)
    return out + 1 if k.item() > 0 else out - 1


with torch.no_grad():
    for n in (64, 32, 64):
        for k in (1, -1, 1):
            a, b = torch.randn(n, 96), torch.randn(96)
            want = torch.sigmoid(a * 2 + b) * torch.tanh(a) + (1 if k > 0 else -1)
            torch.testing.assert_close(jitted(a, b, torch.tensor(k)), want)
    jmodel = torchneuron_jit.jit(copy.deepcopy(model))  # jit takes the module itself: a twin of model
    torch.testing.assert_close(jmodel(inp), model(inp), atol=1e-4, rtol=1e-4)

    # module arguments guarded weakly: the variants of modules that are gone are dropped
    @torchneuron_jit.jit(cache_limit=2)
    def through(m, x):
        return m(x) * 2

    for _ in range(4):
        lin = torch.nn.Linear(96, 8).eval()
        torch.testing.assert_close(through(lin, b[None]), lin(b[None]) * 2)
        del lin
        gc.collect()
    assert not through.gave_up


def jit_calls():
    for _ in range(10):
        torch.testing.assert_close(jmodel(inp), model(inp), atol=1e-4, rtol=1e-4)


in_threads(jit_calls)
del jmodel

# a fresh process reads what this one stored
if not os.environ.get("TN_SMOKE_CACHE"):
    env = dict(os.environ, TN_SMOKE_CACHE=config.cache_dir)
    subprocess.run([sys.executable, __file__], env=env, check=True)
    # a damaged store is moved aside, never a crash
    for name in os.listdir(config.cache_dir):
        if name.endswith(".mdb"):
            with open(os.path.join(config.cache_dir, name), "r+b") as f:
                f.seek(4096)
                f.write(os.urandom(4096))
    subprocess.run([sys.executable, __file__], env=env, check=True)
    print("sanitized smoke test passed:", torchneuron_jit.stats())
else:
    assert torchneuron_jit.stats()["cache_hits"] + torchneuron_jit.stats()["cache_misses"] > 0
