"""Encoders: relation humanising, the hashing encoder, the disk cache and the real MiniLM."""

from __future__ import annotations

import numpy as np
import pytest

from kgreasoner.retrieval.encoder import (
    CachedEncoder,
    EncoderConfig,
    HashingEncoder,
    MiniLMEncoder,
    build_encoder,
    humanize_relation,
)


@pytest.mark.parametrize(
    "relation, words",
    [
        ("people.person.nationality", "person nationality"),
        ("^people.person.nationality", "person nationality"),
        ("cause_of_death", "cause of death"),
        ("location.location.time_zones", "location time zones"),
        ("<http://www.wikidata.org/prop/direct/P19>", "p19"),
        ("birthPlace", "birth place"),
    ],
)
def test_humanize_relation(relation, words):
    assert humanize_relation(relation) == words


def test_hashing_encoder_is_deterministic_and_normalised():
    enc = HashingEncoder(64)
    a = enc.encode(["time zone of utah", "time zone", "banana"])
    assert a.shape == (3, 64) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert np.array_equal(a, HashingEncoder(64).encode(["time zone of utah", "time zone", "banana"]))
    assert a[0] @ a[1] > a[0] @ a[2]


class CountingEncoder(HashingEncoder):
    def __init__(self):
        super().__init__(32)
        self.seen: list[str] = []

    def encode(self, texts):
        self.seen.extend(texts)
        return super().encode(texts)


def test_cache_in_memory_and_on_disk(tmp_path):
    base = CountingEncoder()
    cached = CachedEncoder(base, tmp_path)
    first = cached.encode(["a b", "c", "a b"])
    assert base.seen == ["a b", "c"]
    cached.encode(["c"])
    assert base.seen == ["a b", "c"] and cached.hits == 2 and cached.misses == 2
    cached.flush()
    again = CountingEncoder()
    reloaded = CachedEncoder(again, tmp_path)
    assert len(reloaded) == 2
    assert np.array_equal(reloaded.encode(["a b", "c", "d"]), np.vstack([first[:2], HashingEncoder(32).encode(["d"])]))
    assert again.seen == ["d"]


def test_config_rejects_unknown_kind():
    with pytest.raises(ValueError, match="encoder.kind must be one of"):
        EncoderConfig(kind="word2vec")


def test_real_minilm_offline():
    encoder = build_encoder(EncoderConfig(kind="minilm", batch_size=2))
    assert isinstance(encoder.encoder, MiniLMEncoder) and encoder.dim == 384
    texts = [
        "location time zones",
        "what timezone is utah in",
        "banana bread recipe",
        "a much longer text about time zones",
    ]
    vectors = encoder.encode(texts)
    assert vectors.shape == (4, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    # Padding inside a batch must not change a text's vector.
    alone = encoder.encoder.encode(["location time zones"])
    assert np.allclose(alone[0], vectors[0], atol=1e-5)


WRITER = """
import sys
from kgreasoner.retrieval.encoder import CachedEncoder, HashingEncoder
worker, folder = int(sys.argv[1]), sys.argv[2]
cached = CachedEncoder(HashingEncoder(32), folder, flush_every=7)
for i in range(60):  # every worker writes the texts of i % 40, so writers overlap on each text
    cached.encode([f"text {i % 40}", f"worker {worker} text {i}"])
cached.flush()
"""


@pytest.mark.slow
def test_concurrent_writers_share_one_cache_folder(tmp_path):
    import subprocess
    import sys

    reader_base = CountingEncoder()
    reader = CachedEncoder(reader_base, tmp_path)  # opened before any shard exists
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(tmp_path)]) for w in range(4)]
    assert [w.wait(60) for w in writers] == [0] * 4
    folder = tmp_path / HashingEncoder(32).name
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []  # no temp file left behind
    texts = [f"text {i}" for i in range(40)] + [f"worker {w} text {i}" for w in range(4) for i in range(60)]
    # the live reader loads the writers' shards instead of encoding: its own encoder never runs
    assert np.array_equal(reader.encode(texts), HashingEncoder(32).encode(texts))
    assert reader_base.seen == [] and (reader.hits, reader.misses) == (280, 0)
    fresh = CachedEncoder(CountingEncoder(), tmp_path)
    assert len(fresh) == 280 and np.array_equal(fresh.encode(texts), HashingEncoder(32).encode(texts))


def test_texts_missed_during_a_running_batch_are_encoded_together_once():
    import threading
    import time

    release = threading.Event()

    class Gated(HashingEncoder):
        def __init__(self):
            super().__init__(32)
            self.calls: list[list[str]] = []

        def encode(self, texts):
            self.calls.append(list(texts))
            if len(self.calls) == 1:
                release.wait(10)
            return super().encode(texts)

    base = Gated()
    cached = CachedEncoder(base)
    requests = [["a"], ["b", "x"], ["c", "x"], ["d", "a"]]
    results: dict[int, np.ndarray] = {}

    def call(i):
        results[i] = cached.encode(requests[i])

    first = threading.Thread(target=call, args=(0,))
    first.start()
    while not base.calls:
        time.sleep(0.001)
    others = [threading.Thread(target=call, args=(i,)) for i in (1, 2, 3)]
    for thread in others:
        thread.start()
    deadline = time.time() + 10
    while len(cached._queue) < 4 and time.time() < deadline:  # b, x, c, d wait for the running batch
        time.sleep(0.001)
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert base.calls[0] == ["a"] and sorted(base.calls[1]) == ["b", "c", "d", "x"] and len(base.calls) == 2
    assert cached.batches == 2
    for i, texts in enumerate(requests):
        assert np.array_equal(results[i], HashingEncoder(32).encode(texts))
