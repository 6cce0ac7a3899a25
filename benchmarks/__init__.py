"""The benchmark suite: ``python -m benchmarks`` (see benchmarks/suite.py).

The other files here are standalone scripts (``python benchmarks/X.py``).
"""
