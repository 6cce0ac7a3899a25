"""Differential fuzzer: random programs over the lowered op set, run
eagerly and through torch.compile(backend="neuron"), compared.

    python -m torchneuron_jit.testing.fuzz --seconds N [--seed S] [--out DIR]

A program is data (inputs with dtype, shape and layout; statements naming an
op, its operands and its parameters), so it prints as a runnable Python
file and shrinks: on a mismatch (values, dtype, shape, the state of a
mutated input, or an exception eager does not raise) statements are dropped
or bypassed, and inputs simplified, while the mismatch persists; the
minimal program is printed (and written under --out). Programs are built by
trial: each statement is run eagerly as it is drawn and redrawn when eager
refuses it, so every program is valid eager code. Seeds are deterministic:
program i of seed S is the same on every run.

Drawn: pointwise chains (arithmetic, transcendental, comparisons, where,
masked_fill, logical and bitwise ops, casts), reductions over random dims
with keepdim (sum, mean, amax, amin, var, logsumexp, argmax, argmin),
softmax / log_softmax / layer_norm, views (permute, transpose, slice,
expand, unsqueeze, reshape, select), broadcasting, matmuls, cat, gather,
in-place ops on intermediates and on inputs, results that alias inputs;
inputs float32, float16, bfloat16, float64, int64, int32, bool, contiguous,
transposed, sliced, expanded, zero-size or 0-dim.
"""
import argparse
import random
import sys
import time
import warnings
from pathlib import Path

import torch

FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DTYPES = FLOATS + (torch.int64, torch.int32, torch.bool)
SHAPES = ((5, 37), (3, 1), (1, 37), (2, 3, 4), (4, 6, 20), (3, 70, 9), (0, 5), (), (7,), (2, 1, 8))

# name -> (arity, source template: {0}, {1}.. operands, {p} the parameter)
UNARY = {
    "neg": "-{0}", "abs": "{0}.abs()", "exp": "{0}.exp()", "log": "{0}.log()", "sqrt": "{0}.sqrt()",
    "relu": "torch.relu({0})", "sigmoid": "torch.sigmoid({0})", "tanh": "torch.tanh({0})",
    "gelu": "torch.nn.functional.gelu({0})", "gelu_tanh": "torch.nn.functional.gelu({0}, approximate='tanh')",
    "silu": "torch.nn.functional.silu({0})", "sin": "{0}.sin()", "erf": "torch.erf({0})",
    "rsqrt": "{0}.rsqrt()", "floor": "{0}.floor()", "sign": "{0}.sign()", "not": "{0}.logical_not()",
    "bnot": "~{0}", "clamp": "{0}.clamp({p}, {p} + 3)", "add_s": "{0} + {p}", "mul_s": "{0} * {p}",
    "rsub_s": "{p} - {0}", "pow2": "{0} ** 2", "gt_s": "{0} > {p}", "fill": "{0}.masked_fill({0} > {p}, -1)",
    "cast": "{0}.to({d})", "isnan": "{0}.isnan()",
    # reductions and rows
    "sum": "{0}.sum({k}, keepdim={kd})", "mean": "{0}.mean({k}, keepdim={kd})", "amax": "{0}.amax({k}, keepdim={kd})",
    "amin": "{0}.amin({k}, keepdim={kd})", "var": "{0}.var({k}, keepdim={kd})",
    "logsumexp": "{0}.logsumexp({k}, keepdim={kd})", "argmax": "{0}.argmax(-1, keepdim={kd})",
    "argmin": "{0}.argmin()", "softmax": "{0}.softmax(-1)", "log_softmax": "{0}.log_softmax(-1)",
    "layer_norm": "torch.nn.functional.layer_norm({0}, {0}.shape[-1:])",
    # views
    "t": "{0}.transpose(0, -1)", "permute": "{0}.permute(*reversed(range({0}.dim())))",
    "slice": "{0}[..., 1:]", "step": "{0}[..., ::2]", "unsqueeze": "{0}.unsqueeze(0)", "flatten": "{0}.reshape(-1)",
    "select": "{0}.select(0, 0)", "expand": "{0}.unsqueeze(0).expand(2, *{0}.shape)",
    "gather": "torch.gather({0}, -1, (torch.arange({0}.shape[-1]).flip(0) % max({0}.shape[-1], 1))"
              ".expand({0}.shape).contiguous())",
    # in place, on what the statement computes first (never an input: see INPLACE_INPUT)
    "add_": "{0}.clone().add_({p})", "relu_": "{0}.clone().relu_()",
}
BINARY = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}", "max": "torch.maximum({0}, {1})",
    "min": "torch.minimum({0}, {1})", "pow": "torch.pow({0}, {1})", "eq": "{0} == {1}", "lt": "{0} < {1}",
    "and": "torch.logical_and({0}, {1})", "band": "{0} & {1}", "where": "torch.where({0} > 0, {0}, {1})",
    "fill_t": "{0}.masked_fill({1} > 0, {p})", "matmul": "{0} @ {1}", "cat0": "torch.cat([{0}, {1}], 0)",
    "catl": "torch.cat([{0}, {1}], -1)",
}
# statements that change an input in place (the compiled graph must too)
INPLACE_INPUT = {"iadd": "{0}.add_({p})", "imul": "{0}.mul_({p})"}


class Program:
    """Inputs (dtype, shape, layout) and statements (op, operands, params);
    value i is input i for i < len(inputs), else statement i - len(inputs)."""

    def __init__(self, inputs, stmts, outputs):
        self.inputs, self.stmts, self.outputs = inputs, stmts, outputs

    def source(self, name="f"):
        n = len(self.inputs)
        args = ", ".join(f"v{i}" for i in range(n))
        lines = [f"def {name}({args}):"]
        for j, (op, ops, params) in enumerate(self.stmts):
            template = UNARY.get(op) or BINARY.get(op) or INPLACE_INPUT[op]
            expr = template.format(*(f"v{o}" for o in ops), **params)
            lines.append(f"    v{n + j} = {expr}")
        lines.append(f"    return ({', '.join(f'v{o}' for o in self.outputs)},)")
        return "\n".join(lines) + "\n"

    def make_inputs(self, seed):
        g = torch.Generator().manual_seed(seed)
        return [make_tensor(dt, shape, layout, g) for dt, shape, layout in self.inputs]

    def script(self, seed, backend="neuron"):
        """A runnable Python file reproducing the comparison."""
        return (f"import torch\nimport torchneuron_jit\nfrom torchneuron_jit.testing.fuzz import Program, compare\n\n"
                f"{self.source()}\n"
                f"p = Program({self.inputs!r}, {self.stmts!r}, {self.outputs!r})\n"
                f"print(compare(p, {seed}, {backend!r}) or 'no mismatch')\n")


def make_tensor(dt, shape, layout, g):
    if dt == torch.bool:
        t = torch.rand(shape, generator=g) > 0.5
    elif dt.is_floating_point:
        t = (torch.randn(shape, generator=g) * 3).to(dt)
        flat = t.view(-1)
        if flat.numel() > 11 and layout.endswith("nan"):
            flat[::7] = float("nan")
            flat[::11] = float("inf")
    else:
        t = torch.randint(-100, 100, shape, generator=g).to(dt)
    if layout.startswith("t") and t.dim() >= 2:
        t = t.transpose(0, -1).contiguous().transpose(0, -1)
    elif layout.startswith("s") and t.dim() >= 1:
        t = torch.cat([t, t], -1)[..., ::2] if t.numel() else t
    elif layout.startswith("e") and t.dim() >= 1 and t.shape[0] == 1:
        t = t.expand(3, *t.shape[1:])
    return t


def _run(fn, xs):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*xs)


def _compile(source, name="f"):
    scope = {"torch": torch}
    exec(compile(source, f"<fuzz {name}>", "exec"), scope)
    return scope[name]


def _tolerance(dt):
    return (1e-2, 1e-2) if dt in (torch.float16, torch.bfloat16) else (1e-4, 1e-5)


def _same(got, want):
    """None when got matches want, else what differs."""
    if type(got) is not type(want):
        return f"type {type(got).__name__} != {type(want).__name__}"
    if not isinstance(want, torch.Tensor):
        return None if got == want else f"{got!r} != {want!r}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
    if want.dtype.is_floating_point:
        rtol, atol = _tolerance(want.dtype)
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as e:
            return str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:3])
        return None
    return None if torch.equal(got, want) else f"values differ ({(got != want).sum().item()} elements)"


def _no_worse(got, want, ref):
    """Whether got, a float result that differs from eager's want, is as
    close to ref (the program run in float64) as want is, within the
    tolerance: float16/bfloat16 computed in float32 and rounded once, and
    sums in another order, differ from eager without being wrong."""
    if not isinstance(ref, torch.Tensor) or ref.shape != got.shape:
        return False
    g, w, r = got.double(), want.double(), ref.double()
    rtol, atol = _tolerance(want.dtype)
    ok = ((g - r).abs() <= (w - r).abs() + atol + rtol * r.abs()) | (g == w) | (g.isnan() & w.isnan()) | \
        (g == r) | (g.isnan() & r.isnan())  # the exact answer, where eager's is off (tanh(-9.2) -> -1: rsqrt(-0.0))
    return bool(ok.all())


class NotOurs(Exception):
    """Not a finding about this back end: TorchDynamo itself (its eager back
    end) cannot run the program, or PyTorch's own aot_eager back end (the
    same capture, no lowering) differs from eager as well."""


def compare(program, seed, backend="neuron"):
    """None when compiled and eager agree on program (seed: its inputs), else
    a description of the first difference. backend "jit" is our own front
    door (torchneuron_jit.jit): the program is called once to trace it,
    then compared on its compiled call. Raises NotOurs when the difference
    is PyTorch's (see NotOurs)."""
    why = _compare(program, seed, backend)
    if why and backend not in ("aot_eager", "jit"):
        try:
            upstream = _compare(program, seed, "aot_eager")
        except NotOurs:
            upstream = "refused"
        if upstream:
            raise NotOurs(f"aot_eager differs from eager too ({upstream[:120]}); ours: {why[:120]}")
    return why


def _compare(program, seed, backend):
    torch._dynamo.reset()
    source = program.source()
    eager_in, comp_in = program.make_inputs(seed), program.make_inputs(seed)
    try:
        want = _run(_compile(source), eager_in)
    except Exception as e:  # noqa: BLE001 - the compiled call must raise alike
        want = e
    try:
        if backend == "jit":
            import torchneuron_jit
            fn = torchneuron_jit.jit(_compile(source))
            try:
                _run(fn, program.make_inputs(seed))  # the trace (eager's result)
            except Exception:  # noqa: BLE001 - eager's error, raised again below
                pass
            got = _run(fn, comp_in)  # the compiled entry
        else:
            got = _run(torch.compile(_compile(source), backend=backend), comp_in)
    except Exception as e:  # noqa: BLE001
        if isinstance(want, Exception):
            return None if type(e) is type(want) else f"raised {type(e).__name__}, eager {type(want).__name__}"
        if backend == "jit":
            return f"raised {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        try:
            torch._dynamo.reset()
            _run(torch.compile(_compile(source), backend="eager"), program.make_inputs(seed))
        except Exception as dyn:  # noqa: BLE001
            raise NotOurs(f"TorchDynamo refuses it: {type(dyn).__name__}: {str(dyn).splitlines()[0][:200]}") from None
        return f"raised {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if isinstance(want, Exception):
        return f"eager raised {type(want).__name__}, compiled did not"
    ref = None
    for k, (g, w) in enumerate(zip(got, want)):
        why = _same(g, w)
        if why and isinstance(w, torch.Tensor) and w.dtype.is_floating_point and g.dtype == w.dtype and \
                g.shape == w.shape:
            if ref is None:
                xs = [x.double() if x.dtype.is_floating_point else x for x in program.make_inputs(seed)]
                try:
                    ref = _run(_compile(source), xs)
                except Exception:  # noqa: BLE001 - no float64 reference: the difference stands
                    ref = ()
            why = None if k < len(ref) and _no_worse(g, w, ref[k]) else why
        if why:
            return f"output {k} (v{program.outputs[k]}): {why}"
    for k, (g, w) in enumerate(zip(comp_in, eager_in)):
        why = _same(g, w)
        if why:
            return f"input v{k} after the call: {why}"
    return None


def generate(rng, max_stmts=7):
    """A random valid program (built by trial: each statement is kept only
    if eager runs it)."""
    n_in = rng.randint(1, 3)
    base = rng.choice(SHAPES)
    inputs = []
    for _ in range(n_in):
        shape = rng.choice([base, base, base[-1:] if base else (), base[1:] if len(base) > 1 else base])
        layout = rng.choice(["c", "c", "t", "s", "e", "cnan", "tnan"])
        inputs.append((rng.choice(DTYPES), tuple(shape), layout))
    program = Program(inputs, [], [])
    vals = program.make_inputs(0)
    names = list(UNARY) + list(BINARY) + list(INPLACE_INPUT)
    for _ in range(rng.randint(2, max_stmts) * 4):
        if len(program.stmts) >= max_stmts:
            break
        op = rng.choice(names)
        arity = 2 if op in BINARY else 1
        if op in INPLACE_INPUT:
            ops = (rng.randrange(n_in),)
        else:
            ops = tuple(rng.randrange(len(vals)) for _ in range(arity))
        params = {"p": rng.choice([0.5, 2, -1.5, 3]), "d": "torch." + str(rng.choice(DTYPES)).split(".")[1],
                  "k": rng.choice(["-1", "0", "(0, -1)", "None"]), "kd": rng.choice([True, False])}
        trial = Program(inputs, program.stmts + [(op, ops, params)], [len(vals)])
        try:
            out = _run(_compile(trial.source()), trial.make_inputs(0))[0]
        except Exception:  # noqa: BLE001 - eager refuses: draw again
            continue
        if not isinstance(out, torch.Tensor) or out.numel() > 100000:
            continue
        program = trial
        vals.append(out)
    n = len(inputs)
    computed = list(range(n, n + len(program.stmts)))
    if not computed:
        return None
    outs = sorted(set(rng.sample(computed, min(len(computed), rng.randint(1, 2)))) | {computed[-1]})
    if rng.random() < 0.1:
        outs.append(rng.randrange(n))  # an input returned as it is
    program.outputs = outs
    return program


def shrink(program, seed, why, backend="neuron"):
    """The smallest variant of program that still mismatches (greedy)."""
    def fails(p):
        try:
            return compare(p, seed, backend) is not None
        except Exception:  # noqa: BLE001
            return False

    changed = True
    while changed:
        changed = False
        n = len(program.inputs)
        # fewer outputs
        for o in list(program.outputs):
            if len(program.outputs) > 1:
                p = Program(program.inputs, program.stmts, [x for x in program.outputs if x != o])
                if fails(p):
                    program, changed = p, True
        # drop a statement: its readers read its first operand instead
        for j in reversed(range(len(program.stmts))):
            v, sub = n + j, program.stmts[j][1][0]
            remap = (lambda x, v=v, sub=sub: sub if x == v else x - (x > v))
            stmts = [(op, tuple(remap(x) for x in ops), prm) for k, (op, ops, prm) in enumerate(program.stmts) if k != j]
            outs = sorted({remap(x) for x in program.outputs})
            p = Program(program.inputs, stmts, outs)
            if fails(p):
                program, changed = p, True
                break
        # simpler inputs: contiguous, no NaN
        for i, (dt, shape, layout) in enumerate(program.inputs):
            if layout != "c":
                inputs = list(program.inputs)
                inputs[i] = (dt, shape, "c")
                p = Program(inputs, program.stmts, program.outputs)
                if fails(p):
                    program, changed = p, True
    return program


DOORS = ("neuron", "jit")


def fuzz(seconds=None, seed=0, programs=None, out=None, log=print, refused=None, fell_back=None, doors=DOORS):
    """Runs programs until seconds pass (or `programs` ran), each through
    every front door in doors; returns (programs run, list of (index,
    reason, minimal program)). Programs
    whose difference is PyTorch's own (NotOurs) are not counted; refused (a
    list), when given, gets their reasons; fell_back (a list) the indexes
    of programs a graph of which ran eagerly (our compile failed)."""
    import torchneuron_jit
    with torchneuron_jit.config.patch(compile_blocking=True):  # jit's second call takes the compiled variant
        return _fuzz(seconds, seed, programs, out, log, refused, fell_back, doors)


def _fuzz(seconds, seed, programs, out, log, refused, fell_back, doors):
    import torchneuron_jit
    t0, ran, bad, i = time.monotonic(), 0, [], 0
    while (programs is None or ran < programs) and (seconds is None or time.monotonic() - t0 < seconds):
        rng = random.Random(seed * 1_000_003 + i)
        i += 1
        program = generate(rng)
        if program is None:
            continue
        before = torchneuron_jit.stats()["eager_fallbacks"]
        counted = True
        for door in doors:
            try:
                why = compare(program, i, door)
            except NotOurs as e:
                if refused is not None:
                    refused.append(str(e))
                counted = False
                break
            if why:
                small = shrink(program, i, why, door)
                bad.append((i, f"[{door}] " + (compare(small, i, door) or why), small))
                log(f"MISMATCH seed {seed} program {i}: {bad[-1][1]}\n{small.script(i, door)}")
                if out:
                    Path(out).mkdir(parents=True, exist_ok=True)
                    (Path(out) / f"repro_{seed}_{i}_{door}.py").write_text(small.script(i, door))
                break
        if not counted:
            continue
        ran += 1
        if fell_back is not None and torchneuron_jit.stats()["eager_fallbacks"] > before:
            fell_back.append(i)
    return ran, bad


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torchneuron_jit.testing.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--programs", type=int, default=None, help="stop after this many programs")
    ap.add_argument("--out", default=None, help="directory for the minimal repro files")
    args = ap.parse_args(argv)
    import torchneuron_jit
    t0, refused, fell_back = time.monotonic(), [], []
    ran, bad = fuzz(args.seconds, args.seed, args.programs, args.out, refused=refused, fell_back=fell_back)
    st = torchneuron_jit.stats()
    print(f"seed {args.seed}: {ran} programs in {time.monotonic() - t0:.0f} s, {len(bad)} mismatches; "
          f"{st['kernels_compiled']} kernels compiled, {st['eager_fallbacks']} graphs fell back to eager; "
          f"{len(refused)} not counted: PyTorch's own (TorchDynamo refuses them, or aot_eager differs too)")
    if fell_back:
        print(f"programs with a graph that ran eagerly: {fell_back[:20]}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
