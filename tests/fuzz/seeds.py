"""Writes the starting corpora of the libFuzzer targets (make fuzz-c).

graph/: the encodings of real graphs, captured where the back end imports
them: the benchmark blocks (MLP, attention, GPT block, rotary attention,
CNN, pointwise chains) and programs of the differential fuzzer
(torchneuron_jit.testing.fuzz), so every op family and dtype starts
covered. cache/: records as the store holds them (a header, then an
artifact or a trace payload), valid and damaged, with the flag byte
fuzz_cache.c reads first.

Usage: python tests/fuzz/seeds.py OUT_DIR
"""
import hashlib
import json
import logging
import random
import struct
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torchneuron_jit  # noqa: E402
from torchneuron_jit import backend  # noqa: E402
from torchneuron_jit.testing import fuzz  # noqa: E402


def _capture(encodings):
    imported_by = backend.from_fx

    def from_fx(gm, roles=None):
        imported = imported_by(gm, roles)
        encodings.append(imported.graph.encode())
        return imported
    backend.from_fx = from_fx


def _blocks():
    from benchmarks import models
    torch.manual_seed(0)
    for name, (build, make_input, shapes, _) in models.SUITE.items():
        if name in ("bert", "gpt2", "encoder12"):  # transformers is a benchmark extra; 12 layers add nothing
            continue
        model = build().eval()
        with torch.no_grad():
            torch.compile(model, backend="neuron")(make_input(shapes[0]))
        torch._dynamo.reset()


def _programs(n):
    rng_seed = 0
    done = 0
    while done < n:
        rng_seed += 1
        program = fuzz.generate(random.Random(rng_seed))
        if program is None:
            continue
        try:
            fuzz.compare(program, rng_seed)
        except fuzz.NotOurs:
            pass
        done += 1


def _record(payload, version=1):
    """A record with a wrong checksum (Python has no XXH3 here): the seeds
    whose flag byte has bit 0 are repaired by fuzz_cache.c, the others
    stand for damage."""
    return struct.pack("<4sHHQQQQQ", b"TNCR", version, 0, len(payload), 0, 1, 2, 3) + payload


def main(out):
    out = Path(out)
    encodings = []
    _capture(encodings)
    logging.getLogger("torch").setLevel(logging.CRITICAL)  # eager errors of fuzzer programs are expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _blocks()
        _programs(60)
    graph_dir = out / "graph"
    graph_dir.mkdir(parents=True, exist_ok=True)
    for enc in {bytes(e) for e in encodings}:
        (graph_dir / hashlib.sha1(enc).hexdigest()[:16]).write_bytes(enc)

    cache_dir = out / "cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    artifact = json.dumps({"format": backend.ARTIFACT_FORMAT, "groups": [], "onednn": []}).encode()
    seeds = {
        "artifact-repaired-stored": bytes([1 | 16]) + _record(artifact),
        "trace-repaired-stored-evicts": bytes([1 | 2 | 16 | (6 << 5)]) + _record(b"\x00" * 64),
        "damaged-stored": bytes([16 | 4]) + _record(artifact)[:-3],
        "old-version-stored": bytes([16 | 8]) + _record(artifact, version=0),
        "empty-payload-repaired": bytes([1 | 16]) + _record(b""),
        "short": bytes([16]) + b"TNCR\x01\x00",
    }
    for name, data in seeds.items():
        (cache_dir / name).write_bytes(data)
    print(f"seeds: {len(list(graph_dir.iterdir()))} graphs, {len(seeds)} records in {out}"
          f" (stats {torchneuron_jit.stats()['graphs_compiled']} graphs compiled)")


if __name__ == "__main__":
    main(sys.argv[1])
