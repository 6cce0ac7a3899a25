"""Test harnesses of torchneuron_jit that run against eager PyTorch.

Nothing is imported here, so ``import torchneuron_jit.testing`` stays free:
each harness is its own module, with its own command line
(``python -m torchneuron_jit.testing.<name> --help``):

* ``opinfo``: the OpInfo parity sweep, every lowered ATen op through the
  samples of PyTorch's OpInfo database, compiled against eager.
* ``fuzz``: the differential fuzzer, random programs over the lowered op
  set compiled against eager, a mismatch shrunk to a runnable file.
"""
