"""Differential fuzzer of torchneuron_jit.jit and Python state.

    python -m torchneuron_jit.testing.statefuzz --seconds N [--seed S]

Each program is a module of Python state (a number, a dict with a nested
dict, a list, a plain object, a class attribute, and a list and a dict in
a closure) and a function that mixes tensor ops with reads of that state
(subscripts, attributes, len, sum, iteration, branches on it) and, in some
programs, writes to it (an item, an attribute, an append, a global, a
closure list). The module is made twice: one copy's function goes through
jit, the other's runs eagerly. Before each of the calls the same random
change of the state (or none) is made in both copies; each call's result
and the state after it must be the same. Program i of seed S is the same
on every run; a mismatch prints the program and the calls that show it.
"""
import argparse
import random
import sys
import time
import warnings

import torch

STATE = '''import torch
G_num = {num}
G_dict = {{"a": {a}, "b": {{"c": {c}}}}}
G_list = [{l0}, {l1}, {l2}]
class Obj:
    pass
G_obj = Obj()
G_obj.s = {s}
G_obj.t = 1.0
class C:
    factor = {factor}
def make():
    k = [{k}]
    cfg = {{"a": {cfg}}}
    def f(x):
{body}
        return y
    return f, k, cfg
f, k, cfg = make()
'''

READS = ('G_num', 'G_dict["a"]', 'G_dict["b"]["c"]', 'G_list[1]', 'len(G_list)', 'G_obj.s', 'C.factor', 'k[0]',
         'cfg["a"]', 'G_dict.get("a", 0.0)', 'sum(G_list)', 'max(k)')
OPS = ('y = y * ({r}) + ({r})', 'y = torch.sin(y) * ({r})', 'y = (y + ({r})).relu()',
       'y = y.exp().clamp(max=10.0) - ({r})', 'y = torch.where(y > ({r}), y, y * ({r}))')
WRITES = ('G_obj.t = G_obj.t + 1.0', 'k[0] = k[0] + 0.5', 'G_list.append(1.0)', 'cfg["a"] = cfg["a"] * 2.0',
          'G_num += 1.0', 'G_dict["b"]["c"] = G_dict["b"]["c"] - 1.0', 'del G_list[-1]')
CHANGES = ('G_dict["a"] = {v}', 'G_dict["b"]["c"] = {v}', 'G_list[1] = {v}', 'G_list.append({v})', 'G_obj.s = {v}',
           'C.factor = {v}', 'k[0] = {v}', 'cfg["a"] = {v}', 'G_num = {v}', 'G_dict["b"] = {{"c": {v}}}',
           'G_list[:] = [{v}, {v}, {v}]')
SNAPSHOT = '(G_num, G_dict, G_list, G_obj.s, G_obj.t, C.factor, k, cfg)'
CALLS = 6  # calls of each program


def _number(rng):
    return rng.choice([0.5, 1.5, -1.0, 2.0, 0.25, 3.0, -0.5])


def generate(rng):
    """(module source, the changes before each call) of a random program."""
    blocks, writes = [["y = x * 1.0"]], rng.random() < 0.3  # statements, each a list of lines
    for _ in range(rng.randint(1, 5)):
        kind = rng.random()
        if kind < 0.6:
            op = rng.choice(OPS)
            while "{r}" in op:
                op = op.replace("{r}", rng.choice(READS), 1)
            blocks.append([op])
        elif kind < 0.8:
            blocks.append([f"if {rng.choice(READS)} > {_number(rng)}:", f"    y = y + ({rng.choice(READS)})", "else:",
                           "    y = y * 0.5"])
        else:
            blocks.append(["for v in G_list:", "    y = y + v"])
    if writes:
        write = rng.choice(WRITES)
        blocks.insert(rng.randint(1, len(blocks)), [write])
        if write.startswith("G_num"):
            blocks.insert(0, ["global G_num"])
    lines = [line for block in blocks for line in block]
    body = "\n".join("        " + line for line in lines)
    source = STATE.format(num=_number(rng), a=_number(rng), c=_number(rng), l0=_number(rng), l1=_number(rng),
                          l2=_number(rng), s=_number(rng), factor=_number(rng), k=_number(rng), cfg=_number(rng),
                          body=body)
    calls = [None if rng.random() < 0.4 else rng.choice(CHANGES).format(v=_number(rng)) for _ in range(CALLS)]
    return source, calls


def _module(source, name):
    scope = {"__name__": name}
    exec(compile(source, f"<statefuzz {name}>", "exec"), scope)
    return scope


def compare(source, calls, name="p"):
    """None when jit and eager agree on every call, else what differs."""
    import torchneuron_jit
    jitted, eager = _module(source, name), _module(source, name)
    jf = torchneuron_jit.jit(jitted["f"])
    x = torch.linspace(-2, 2, 8)
    for i, change in enumerate(calls):
        if change:
            for scope in (jitted, eager):
                try:
                    exec(change, scope)
                except IndexError:  # the list the program shortened: the same in both copies
                    pass
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                want = eager["f"](x)
            except Exception as e:  # noqa: BLE001 - the jitted call must raise alike
                want = e
            try:
                got = jf(x)
            except Exception as e:  # noqa: BLE001
                got = e
        if isinstance(want, Exception) or isinstance(got, Exception):
            if type(want) is not type(got):
                return f"call {i} (after {change or 'no change'}): jit {got!r}, eager {want!r}"
            continue
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True):  # fuzz.py's float32 tolerance
            return f"call {i} (after {change or 'no change'}): jit {got.tolist()}, eager {want.tolist()}"
        a, b = eval(SNAPSHOT, jitted), eval(SNAPSHOT, eager)
        if repr(a) != repr(b):
            return f"call {i} (after {change or 'no change'}): state {a} after jit, {b} after eager"
    return None


def fuzz(seconds=None, seed=0, programs=None, log=print):
    """Runs programs until seconds pass (or `programs` ran); returns
    (programs run, calls made, [(index, reason, source, calls)])."""
    t0, ran, bad, i = time.monotonic(), 0, [], 0
    while (programs is None or ran < programs) and (seconds is None or time.monotonic() - t0 < seconds):
        rng = random.Random(seed * 1_000_003 + i)
        source, calls = generate(rng)
        why = compare(source, calls, f"p{seed}_{i}")
        if why:
            bad.append((i, why, source, calls))
            log(f"MISMATCH seed {seed} program {i}: {why}\n{source}\nchanges before each call: {calls}")
        i += 1
        ran += 1
    return ran, ran * CALLS, bad


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torchneuron_jit.testing.statefuzz",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--programs", type=int, default=None)
    args = ap.parse_args(argv)
    import torchneuron_jit
    t0 = time.monotonic()
    ran, calls, bad = fuzz(args.seconds, args.seed, args.programs)
    st = torchneuron_jit.stats()
    print(f"seed {args.seed}: {ran} programs ({calls} calls) in {time.monotonic() - t0:.0f} s, {len(bad)} mismatches; "
          f"{st['traces']} traces, {st['traces_loaded']} from records, {st['graphs_compiled']} graphs compiled")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
