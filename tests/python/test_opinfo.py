"""The OpInfo parity sweep (torchneuron_jit.testing.opinfo) on its CI subset:
every OpInfo that reaches a lowered ATen op, in float32 and one of its
other dtypes in turn (sweep.quick_dtypes; every dtype under make
test-long), each sample plain and fused into a kernel, compiled with
backend="neuron" against eager; a test per OpInfo, so a failure names the
op. Known failures are in opinfo.KNOWN_FAILURES (an unexpected pass fails
too). `python -m torchneuron_jit.testing.opinfo --all` runs every sample."""
import contextlib
import logging
import os
import types
from pathlib import Path

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

import torchneuron_jit
from torchneuron_jit import _C, backend
from torchneuron_jit.testing import opinfo as sweep

REPO = Path(__file__).resolve().parents[2]
MATCH = sweep.match()
# make test runs each OpInfo in float32 and one other dtype (sweep.quick_dtypes);
# make test-long sets TN_TEST_LONG and runs every dtype
LONG = bool(os.environ.get("TN_TEST_LONG"))
COVERED_ELSEWHERE = sweep.COVERED_ELSEWHERE
_RESULTS = {}  # OpInfo name -> its Result in this session


@contextlib.contextmanager
def _no_structured_trace():
    """pytest's log capture handlers reach torch's structured trace logger
    (torch.__trace), and torch then formats a trace of every compilation
    for them: twice a case's time. None while the sweep runs."""
    log = logging.getLogger("torch.__trace")
    saved = log.handlers
    log.handlers = []
    try:
        yield
    finally:
        log.handlers = saved


def _run(name, full=False):
    with _no_structured_trace():
        return sweep.run_opinfo(name, full=full, dtypes=None if full or LONG else sweep.quick_dtypes(name))


def _result(name):
    if name not in _RESULTS:
        _RESULTS[name] = _run(name)
    return _RESULTS[name]


@pytest.mark.parametrize("name", list(MATCH.opinfos))
def test_opinfo(name):
    result = _result(name)
    assert result.cases, f"{name}: no sample ran ({result.skipped})"
    problems = result.problems()
    assert not problems, "\n".join(problems)


def test_every_lowered_op_has_a_sample():
    """Each lowered op ran in our code (a kernel, read through or dropped,
    not through PyTorch) in a passing case whose graph did not fall back
    to eager (an op of DECOMPOSED: what it becomes, in a case of its
    OpInfos), or is in COVERED_ELSEWHERE. Uses the cases test_opinfo ran
    (run alone, it runs the OpInfos it needs); an op the CI subset misses
    gets every sample of its OpInfos."""
    tested = set(sweep.tested_ops(_RESULTS.values()))
    for full in (False, True):
        for op in MATCH.ops:
            for name in MATCH.of_op[op]:
                if op in tested or op in COVERED_ELSEWHERE:
                    break
                result = _run(name, full=True) if full else _result(name)
                tested |= set(sweep.tested_ops([result]))
    missing = [f"{op} (OpInfos {', '.join(MATCH.of_op[op]) or 'none'})" for op in MATCH.ops
               if op not in tested and op not in COVERED_ELSEWHERE]
    assert not missing, "lowered ops no passing case ran in our code:\n" + "\n".join(missing)
    both = [op for op in COVERED_ELSEWHERE if op in tested]
    assert not both, f"in COVERED_ELSEWHERE but tested here: {both}"


@pytest.mark.parametrize("op", sorted(COVERED_ELSEWHERE))
def test_covered_elsewhere_names_a_test_that_covers_it(op):
    path, why = COVERED_ELSEWHERE[op]
    assert op in MATCH.ops, f"{op} is not lowered"
    assert why.strip()
    text = (REPO / path).read_text()
    spelled = [op.replace("::", "."), sweep.base_name(op)]
    assert any(s in text for s in spelled), f"{path} does not mention {op}"


def test_decomposed_ops_are_in_the_decomposition_table():
    table = {sweep.overload_name(k) for k in backend.decompositions()}
    for op, into in sweep.DECOMPOSED.items():
        assert op in MATCH.ops and into in MATCH.ops, (op, into)
        assert op in table, f"{op} is not decomposed by the back end: test it as itself"
        assert into not in table


def test_tables_name_what_exists():
    db = sweep.op_db()
    for base, names in sweep.ALIASES.items():
        assert any(sweep.base_name(op) == base for op in MATCH.ops), f"ALIASES: {base} is not lowered"
        for n in names:
            assert n in db, f"ALIASES: no OpInfo {n}"
    for op, names in sweep.REACHED_THROUGH.items():
        assert op in MATCH.ops, f"REACHED_THROUGH: {op} is not lowered"
        for n in names:
            assert n in db, f"REACHED_THROUGH: no OpInfo {n}"
    for op in MATCH.no_opinfo:
        assert MATCH.of_op[op] or op in COVERED_ELSEWHERE, f"{op}: no OpInfo, no alias, not covered elsewhere"
    for op in MATCH.ops:
        assert MATCH.of_op[op] or op in COVERED_ELSEWHERE, f"{op} is tested nowhere"
    for (name, dtype), reason in sweep.KNOWN_FAILURES.items():
        assert name in MATCH.opinfos, f"KNOWN_FAILURES: {name} is not a matched OpInfo"
        assert dtype is None or dtype in sweep.dtypes_of(name), f"KNOWN_FAILURES: {name} has no {dtype}"
        assert reason.strip(), f"KNOWN_FAILURES: ({name}, {dtype}) without a reason"


# -- the harness itself -------------------------------------------------------------

def _fake_opinfo(op):
    return types.SimpleNamespace(name="planted", variant_test_name="", op=op)


def test_harness_sees_a_wrong_result():
    """A graph that computes something else than eager fails the case
    (torch.compiler.is_compiling is true while Dynamo traces, jit_tracing
    while jit records: the graph replays the recording)."""
    def op(x):
        return x + 1 if torch.compiler.is_compiling() or _C.jit_tracing() else x
    for variant in sweep.VARIANTS:
        out = sweep.run_case(_fake_opinfo(op), SampleInput(torch.randn(4, 3)), variant)
        assert out.status == "fail" and "differ" in out.detail, out


def test_harness_sees_a_wrong_dtype_and_a_missing_exception():
    def cast(x):
        return x.double() if torch.compiler.is_compiling() else x
    out = sweep.run_case(_fake_opinfo(cast), SampleInput(torch.randn(3)), "plain")
    assert out.status == "fail" and "float64" in out.detail, out

    def raises(x):
        if not torch.compiler.is_compiling():
            raise ValueError("eager refuses")
        return x * 2
    out = sweep.run_case(_fake_opinfo(raises), SampleInput(torch.randn(3)), "plain")
    assert out.status == "fail" and "ValueError" in out.detail, out


def test_harness_counts_a_graph_that_fell_back_to_eager():
    backend.fail_next_compile = "planted by test_opinfo"
    try:
        out = sweep.run_case(_fake_opinfo(torch.sin), SampleInput(torch.randn(5)), "fused")
    finally:
        backend.fail_next_compile = None
    assert out.status == "pass" and out.fallback, out
    assert not sweep.tested_ops([sweep.Result("planted", [sweep.Case("planted", torch.float32, 0, "fused", out)])])


def test_harness_fails_a_case_its_own_wrapper_broke(monkeypatch):
    """When the harness's wrapper of the back end breaks (here: what the
    back end returns lacks the plan's source graph), the case fails,
    naming the harness, instead of passing as an eager fallback that tests
    nothing of ours."""
    real = backend.plan_of

    class Opaque:  # a compiled graph the harness cannot read
        _boxed_call = True

        def __init__(self, plan):
            self.plan = plan

        def __call__(self, args):
            return self.plan(args)

    monkeypatch.setattr(backend, "plan_of", lambda gm, eager: Opaque(real(gm, eager)))
    out = sweep.run_case(_fake_opinfo(torch.sin), SampleInput(torch.randn(5)), "fused")
    assert out.status == "fail" and "the harness failed" in out.detail and "source" in out.detail, out


def test_harness_compiles_every_case():
    """The same generated function twice: each is compiled anew (Dynamo is
    reset, so no recompile limit turns the sweep into eager vs eager), and
    a fused sin runs in a kernel."""
    for _ in range(2):
        before = torchneuron_jit.stats()["graphs_compiled"]
        out = sweep.run_case(_fake_opinfo(torch.sin), SampleInput(torch.randn(5)), "fused")
        assert out.status == "pass" and not out.fallback, out
        assert torchneuron_jit.stats()["graphs_compiled"] == before + 1
        assert "aten::sin" in out.kernel_ops, out


def test_float64_reference_tolerates_eager_own_error():
    """Where eager is off the exact result too, ours may be off as much."""
    want = torch.tensor([1.0, 2.0])
    ref = torch.tensor([1.0, 2.001], dtype=torch.float64)
    assert sweep.compare(torch.tensor([1.0, 2.002]), want, lambda: ref) is None
    assert sweep.compare(torch.tensor([1.0, 2.01]), want, lambda: ref) is not None
    assert sweep.compare(torch.tensor([1.0, 2.002]), want) is not None
    assert sweep.compare(torch.tensor([1, 2]), torch.tensor([1, 3])) is not None
    assert sweep.compare((torch.tensor([1.0]),), [torch.tensor([1.0])]) is None
    assert sweep.compare(torch.tensor([float("nan")]), torch.tensor([float("nan")])) is None


def test_harness_sees_a_changed_input_and_a_dynamo_refusal():
    def writes(x):
        if torch.compiler.is_compiling():
            x.add_(1)
        return x * 2
    out = sweep.run_case(_fake_opinfo(writes), SampleInput(torch.randn(3)), "plain")
    assert out.status == "fail" and "input 0" in out.detail, out

    def breaks(x):
        torch._dynamo.graph_break()
        return x * 2
    out = sweep.run_case(_fake_opinfo(breaks), SampleInput(torch.randn(3)), "plain")
    assert out.status == "dynamo", out


def test_a_known_failure_that_passes_is_an_unexpected_pass(monkeypatch):
    monkeypatch.setitem(sweep.KNOWN_FAILURES, ("neg", torch.float32), "planted")
    with _no_structured_trace():
        result = sweep.run_opinfo("neg", dtypes=[torch.float32])
    assert result.cases and not result.failures()
    assert result.unexpected_passes() == [(torch.float32, "planted")]
    assert any("UNEXPECTED PASS" in line for line in result.problems())


# Through our own front door: a spread of op families in the jit variant
# (python -m torchneuron_jit.testing.opinfo --all runs every OpInfo in it).
JIT_OPINFOS = ["add", "mul", "sigmoid", "where", "clamp", "nn.functional.gelu", "softmax", "sum", "argmax",
               "cat", "nn.functional.embedding", "gather", "masked_fill", "to"]


@pytest.mark.parametrize("name", [n for n in JIT_OPINFOS if n in MATCH.opinfos])
def test_opinfo_through_jit(name):
    with _no_structured_trace():
        result = sweep.run_opinfo(name, dtypes=[torch.float32, torch.float16, torch.int64, torch.bool],
                                  variants=["jit"])
    assert result.cases, f"{name}: no sample ran ({result.skipped})"
    problems = result.problems()
    assert not problems, "\n".join(problems)
