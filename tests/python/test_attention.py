"""Attention written as matmul, softmax and matmul runs as one call of
PyTorch's CPU flash attention (backend._flash_attention, config
flash_attention) through both doors, with eager's values, and is left as it
is wherever the rewrite would change what the program computes."""
import math
import warnings

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import config

pytestmark = pytest.mark.usefixtures("fresh_backend")


@pytest.fixture(autouse=True)
def flash_on():
    """Every attention of these small tests rewritten (auto takes masked
    attention only where its scores are large: test_auto_policy)."""
    config.flash_attention = "on"

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
F = torch.nn.functional


def _ops():
    return {op: sum(r.values()) for op, r in torchneuron_jit.stats()["fallback_ops"].items()}


def _check(fn, *calls, door="neuron"):
    """Runs fn through a door on each argument tuple of calls, asserting
    parity with eager (NaN where eager has NaN) and no warning; returns
    {op: nodes run through PyTorch}."""
    c = torch.compile(fn, backend="neuron") if door == "neuron" else torchneuron_jit.jit(fn)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for args in calls:
            torch.testing.assert_close(c(*args), fn(*args), equal_nan=True)
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert ours == [] and torchneuron_jit.stats()["eager_fallbacks"] == 0, ours
    return _ops()


def _heads(x, h):
    b, s, d = x.shape
    return x.view(b, s, h, d // h).transpose(1, 2)


def attention(q, k, v, mask):
    """Hugging Face's eager attention: scaled scores, an additive mask, softmax, dropout (eval)."""
    q, k, v = _heads(q, 4), _heads(k, 4), _heads(v, 4)
    scores = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(q.shape[-1]))
    probs = F.dropout(F.softmax(scores + mask, dim=-1), p=0.1, training=False)
    out = torch.matmul(probs, v)
    return out.transpose(1, 2).reshape(q.shape[0], -1, 4 * q.shape[-1])


def _inputs(b=2, s=12, d=32, mask_shape=None):
    torch.manual_seed(s)
    q, k, v = (torch.randn(b, s, d) for _ in range(3))
    keep = torch.ones(b, s)
    keep[1, s // 2:] = 0  # the second sentence padded
    mask = (1.0 - keep)[:, None, None, :] * torch.finfo(torch.float32).min
    return q, k, v, mask


@pytest.mark.parametrize("door", ["neuron", "jit"])
def test_eager_attention_becomes_one_flash_call(door):
    ops = _check(attention, _inputs(), _inputs(), door=door)
    assert ops.get(FLASH) == 1 and "aten::bmm" not in ops, ops


def test_jit_variable_lengths_keep_the_flash_call_in_the_symbolic_variant():
    # lengths 12, 9, 21, 5, 17: the second trace is symbolic in the sequence length (dynamic_after 2)
    calls = [_inputs(s=s) for s in (12, 9, 21, 5, 17)]
    ops = _check(attention, *calls, door="jit")
    assert torchneuron_jit.stats()["traces"] == 2
    assert ops.get(FLASH) == 2 and "aten::bmm" not in ops, ops


def test_a_row_masked_with_minus_inf_throughout_stays_nan_as_in_eager():
    q, k, v, _ = _inputs()
    mask = torch.zeros(2, 1, 12, 12)
    mask[1, 0, 3, :] = float("-inf")   # query 3 of the second sentence sees nothing: eager's softmax gives NaN
    mask[0, 0, :, 5:] = float("-inf")  # partly masked rows: finite
    with torch.no_grad():
        want = attention(q, k, v, mask)
    assert want.isnan().any() and not want[0].isnan().any()
    ops = _check(attention, (q, k, v, mask))
    assert ops.get(FLASH) == 1, ops


def test_masks_added_one_after_another_and_a_2d_mask():
    # T5: the scores plus a position bias plus the padding mask, no scaling
    def t5(q, k, v, bias, mask):
        q, k, v = _heads(q, 4), _heads(k, 4), _heads(v, 4)
        scores = torch.matmul(q, k.transpose(3, 2))
        scores += bias
        scores += mask
        return torch.matmul(F.softmax(scores.float(), dim=-1).type_as(scores), v)

    def causal(q, k, v, mask2d):
        q, k, v = _heads(q, 4), _heads(k, 4), _heads(v, 4)
        return torch.matmul(torch.softmax(q @ k.transpose(-1, -2) / 3.0 + mask2d, -1), v)

    q, k, v, mask = _inputs()
    bias = torch.randn(1, 4, 12, 12)
    assert _check(t5, (q, k, v, bias, mask)).get(FLASH) == 1
    tri = torch.full((12, 12), float("-inf")).triu(1)
    assert _check(causal, (q, k, v, tri)).get(FLASH) == 2


def test_what_would_change_the_program_stays_matmul_and_softmax():
    q, k, v, mask = _inputs()

    def probs_returned(q, k, v, mask):  # the probabilities are read elsewhere
        q, k, v = _heads(q, 4), _heads(k, 4), _heads(v, 4)
        p = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + mask, -1)
        return p @ v, p

    def scaled_after_mask(q, k, v, mask):  # softmax((s + m) * c) is not flash attention's softmax(s * c + m)
        q, k, v = _heads(q, 4), _heads(k, 4), _heads(v, 4)
        return torch.softmax((q @ k.transpose(-1, -2) + mask) * 0.5, -1) @ v

    def other_value_width(q, k, v, mask):  # v's heads narrower than q's: flash attention takes one head size
        q, k = _heads(q, 4), _heads(k, 4)
        v = _heads(v[..., :16], 4)
        return torch.softmax(q @ k.transpose(-1, -2) + mask, -1) @ v

    def softmax_over_queries(q, k, v, mask):
        q, k, v = _heads(q, 4), _heads(k, 4), _heads(v, 4)
        return torch.softmax(q @ k.transpose(-1, -2), -2) @ v

    def double(q, k, v, mask):  # float64 stays: the rewrite is float32's
        q, k, v = _heads(q.double(), 4), _heads(k.double(), 4), _heads(v.double(), 4)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    for fn in (probs_returned, scaled_after_mask, other_value_width, softmax_over_queries, double):
        torchneuron_jit.reset_stats()
        torch._dynamo.reset()
        ops = _check(fn, (q, k, v, mask))
        assert FLASH not in ops and ops.get("aten::bmm") == 2, (fn.__name__, ops)


def test_off_in_the_config():
    config.flash_attention = False
    ops = _check(attention, _inputs())
    assert FLASH not in ops and ops.get("aten::bmm") == 2, ops


def test_hf_bert_eager_attention_from_config():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    ids = torch.randint(1, 200, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 5:] = 0

    def f(ids, mask):
        return model(input_ids=ids, attention_mask=mask).last_hidden_state

    for door in ("neuron", "jit"):
        torchneuron_jit.reset_stats()
        ops = _check(f, (ids, mask), door=door)
        assert ops.get(FLASH) == 2 and "aten::bmm" not in ops, (door, ops)


def test_scores_scaled_and_masked_in_place():
    def inplace(q, k, v, mask):
        q, k, v = _heads(q, 4), _heads(k, 4), _heads(v, 4)
        scores = q @ k.transpose(-1, -2)
        scores *= 0.25
        scores /= 2.0
        scores += mask
        return scores.softmax(-1) @ v

    assert _check(inplace, _inputs()).get(FLASH) == 1


def test_auto_policy_takes_unmasked_attention_always_and_masked_from_a_size():
    config.flash_attention = "auto"
    q, k, v, mask = _inputs()  # scores of 2 x 4 x 12 x 12 = 1152 elements
    assert _check(attention, (q, k, v, torch.zeros_like(mask))).get(FLASH) is None
    torch._dynamo.reset()
    torchneuron_jit.reset_stats()
    config.flash_attention_min_scores = 1152
    assert _check(attention, (q, k, v, mask)).get(FLASH) == 1

    def unmasked(q, k, v):
        q, k, v = _heads(q, 4), _heads(k, 4), _heads(v, 4)
        return torch.softmax(q @ k.transpose(-1, -2) * 0.5, -1) @ v

    torch._dynamo.reset()
    torchneuron_jit.reset_stats()
    config.flash_attention_min_scores = 1 << 40
    assert _check(unmasked, (q, k, v)).get(FLASH) == 1


EMPTY_ATTENTION = '''
import sys, torch, torchneuron_jit
def attn(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1) @ v
for case in sys.argv[1:]:
    print(case, flush=True)  # the case a crash was in
    lq, lk, heads = (int(a) for a in case.split(","))
    q, k, v = torch.randn(2, heads, lq, 8), torch.randn(2, heads, lk, 8), torch.randn(2, heads, lk, 8)
    torch._dynamo.reset()  # each case's own static graph
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(attn, backend="neuron")(q, k, v), attn(q, k, v))
        torch.testing.assert_close(torchneuron_jit.jit(attn)(q, k, v), attn(q, k, v))
print("ok")
'''


def test_attention_over_an_empty_sequence_stays_matmul_and_softmax(run_python, tmp_path):
    """PyTorch's CPU flash kernel divides by zero on an empty q, k or v (the
    process died of SIGFPE), where eager's matmul and softmax give an empty
    or zero result: such attention is not rewritten. In a child process,
    so that a crash is this test's failure only (its last line names the
    case, as lq,lk,heads)."""
    (tmp_path / "empty.py").write_text(EMPTY_ATTENTION)
    r = run_python("empty.py", "0,0,4", "0,5,4", "5,0,4", "5,5,0", timeout=240)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout, r.stderr[-2000:])
