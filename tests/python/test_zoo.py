"""The model zoo (benchmarks/zoo.py) in CI's size: every Hugging Face model
through both doors, with each attention implementation, at batch 1 and
then 8 on the same compiled model (Dynamo's second shape makes its graph
dynamic; jit traces a second variant). Each call matches eager, no graph
runs eagerly as a whole, and we warn about nothing; through jit, another
instance of the model then runs the plans its trace records stored."""
import os
import sys
import warnings

import pytest
import torch

import torchneuron_jit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks import zoo  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_backend")

SEQ = 16


# Through Dynamo (2-7 s a row here), eager attention runs in CI for four models; the other six's eager
# attention is the same matmul-softmax-matmul (their sdpa rows and jit rows stay). make test-long runs all.
EAGER_ATTN_DYNAMO_IN_CI = {"bert", "gpt2", "llama", "t5_encoder"}


def _rows():
    for name in zoo.MODELS:
        for attn in ("sdpa", "eager"):
            for door in ("dynamo", "jit"):
                long = door == "dynamo" and attn == "eager" and name not in EAGER_ATTN_DYNAMO_IN_CI
                yield pytest.param(name, attn, door, marks=[pytest.mark.long] if long else [],
                                   id=f"{name}-{attn}-{door}")


@pytest.mark.parametrize("name,attn,door", list(_rows()))
def test_zoo_row_compiles_and_matches_eager(name, attn, door):
    model, make = zoo.build(name, "ci", attn)
    compiled = torch.compile(model, backend="neuron") if door == "dynamo" else torchneuron_jit.jit(model)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for batch in (1, 8):
            torch.manual_seed(batch)
            inputs = make(batch, SEQ)
            want = zoo._leaves(model(*inputs))
            for _ in range(2):  # the compiling call, then a call of what it compiled
                got = zoo._leaves(compiled(*inputs))
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
                if name == "minilm":  # sentence embeddings: what a user compares
                    cos = torch.nn.functional.cosine_similarity(got[0], want[0], dim=1)
                    assert cos.min().item() >= 0.99999
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    st = torchneuron_jit.stats()
    assert ours == [], ours
    assert st["eager_fallbacks"] == 0
    assert st["graphs_compiled"] >= 1
    if door == "jit":
        assert st["traces"] == 2  # one variant per batch size, no eager entry
        # another instance (same weights) runs both variants' stored plans, compiling nothing
        again, _ = zoo.build(name, "ci", attn)
        jitted = torchneuron_jit.jit(again)
        with torch.no_grad():
            for batch in (1, 8):
                torch.manual_seed(batch)
                inputs = make(batch, SEQ)
                for g, w in zip(zoo._leaves(jitted(*inputs)), zoo._leaves(model(*inputs))):
                    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        now = torchneuron_jit.stats()
        assert (now["plans_loaded"], now["graphs_compiled"], now["traces"]) == (2, st["graphs_compiled"], 2), now
        assert now["kernels_compiled"] == st["kernels_compiled"]  # loaded from object code
