"""Which decompositions of the back end's table round float16 and bfloat16
results otherwise than eager's kernels: each OpInfo's first samples in
both dtypes, traced with the table (``backend.decompositions()``) and run,
against the op run eagerly, with assert_close's default tolerances.

    python -m torchneuron_jit.testing.halfdecomp                 # every OpInfo
    python -m torchneuron_jit.testing.halfdecomp logit addr     # some

Prints one line per (OpInfo, dtype) whose decomposed result differs beyond
assert_close's tolerance, with the ops the trace made; ops that draw
random numbers are left out (two draws differ anyway). What it lists and
an op's samples through both doors confirm goes into backend.HALF_WHOLE.
"""
import argparse
import collections
import sys
import warnings

import torch
import torch.utils._pytree as pytree

_RANDOM = ("rand", "normal", "uniform", "bernoulli", "dropout", "rrelu", "fractional", "multinomial", "cauchy",
           "exponential", "geometric", "empty")


def _case(opinfo, sample):
    """(fn of the sample's tensors, its tensors) for one OpInfo sample."""
    flat, spec = pytree.tree_flatten(((sample.input, *sample.args), sample.kwargs))
    where = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]

    def fn(*tensors):
        leaves = list(flat)
        for i, t in zip(where, tensors):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return opinfo.op(*args, **kwargs)

    return fn, [flat[i] for i in where]


def differences(names=(), samples=6):
    """{(OpInfo name, dtype name): [(sample index, words, ops)]} of the
    samples whose decomposed result differs from eager's."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.testing._internal.common_methods_invocations import op_db

    from torchneuron_jit import backend

    table = backend.decompositions()
    found = collections.defaultdict(list)
    for opinfo in op_db:
        if (names and opinfo.name not in names) or any(word in opinfo.name for word in _RANDOM):
            continue
        for dtype in (torch.float16, torch.bfloat16):
            if dtype not in opinfo.supported_dtypes("cpu"):
                continue
            try:
                cases = list(opinfo.sample_inputs("cpu", dtype, requires_grad=False))[:samples]
            except Exception:  # an OpInfo whose samples need what this machine lacks
                continue
            for k, sample in enumerate(cases):
                fn, tensors = _case(opinfo, sample)
                if not tensors:
                    continue
                try:
                    want = fn(*[t.clone() for t in tensors])
                    gm = make_fx(fn, decomposition_table=table)(*[t.clone() for t in tensors])
                    got = gm(*[t.clone() for t in tensors])
                except Exception:  # eager refuses the sample, or it cannot be traced: nothing to compare
                    continue
                try:
                    torch.testing.assert_close(got, want, equal_nan=True)
                except AssertionError as exc:
                    ops = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
                    words = " ".join(line.strip() for line in str(exc).splitlines()[1:4])
                    found[(opinfo.name, str(dtype).removeprefix("torch."))].append((k, words, ops))
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ops", nargs="*", help="OpInfo names (default: every one)")
    parser.add_argument("--samples", type=int, default=6, help="samples per OpInfo and dtype")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    found = differences(tuple(args.ops), args.samples)
    for (name, dtype), cases in sorted(found.items()):
        k, words, ops = cases[0]
        print(f"{name} {dtype}: {len(cases)} samples differ; sample {k}: {words}; ops {', '.join(ops[:8])}")
    print(f"{len(found)} OpInfo and dtype pairs differ")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
