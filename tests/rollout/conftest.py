"""Tiny real tokenizers and models for rollout tests, a scripted search session and scripts.

- `bpe_tokenizer`: a byte-level BPE (GPT-2 pre-tokenisation) trained here on a tiny corpus, with
  a vocabulary so small that every protocol tag is several tokens.
- `special_tokenizer`: the same BPE with the tags added as single special tokens.
- `tiny_model(tokenizer)`: a randomly initialised, seeded Qwen3ForCausalLM (hidden 64, 2 layers,
  head_dim 32). Its free output is garbage, which is what malformed-output tests need; tests that
  need a given output force it with `ScriptedLogits`.
- `stub`: a local HTTP server answering `/v1/completions` from a reply function (remote backends);
  its `.bodies` are the request bodies it got, in order.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from kgreasoner.protocol import TAGS, ToolResult
from kgreasoner.records.edges import Edge

CORPUS = [
    "The User asks a question, and the Assistant solves it. User: what timezone is utah in",
    "Topic Entity: Utah Assistant: I need the time zone of Utah and its capital city.",
    "(Utah, time zone, Mountain Time Zone) (Utah, capital, Salt Lake City) Denver Colorado",
    "search think answer triples backtrack | 0123456789 (),.:?!'",
]
EOS = "<|endoftext|>"


def _train_bpe() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=330, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)


@pytest.fixture(scope="session")
def bpe_tokenizer() -> PreTrainedTokenizerFast:
    return _train_bpe()


@pytest.fixture(scope="session")
def special_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = _train_bpe()
    tokenizer.add_special_tokens({"additional_special_tokens": list(TAGS)})
    return tokenizer


def build_model(tokenizer, seed: int = 0) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=8192,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_model():
    cache = {}

    def get(tokenizer):
        key = id(tokenizer)
        if key not in cache:
            cache[key] = build_model(tokenizer)
        return cache[key]

    return get


class ScriptedSession:
    """A test double of the contract's `SearchSession` (retrieval issue), for unit tests of masking.

    `call(query)` answers from a fixed table (query stripped -> lines); unknown or empty queries
    come back as error results, as the real tool does. It never raises.
    """

    def __init__(self, table: dict[str, list[str]], topics: tuple[str, ...] = ("Utah",)) -> None:
        self.table = table
        self.queries: list[str] = []
        self.num_calls = 0
        self.num_backtracks = 0
        self._shown = [("", t) for t in topics]

    def call(self, query: str) -> ToolResult:
        self.num_calls += 1
        self.queries.append(query)
        name = query.strip()
        if not name:
            return ToolResult("The search query is empty.", [], "empty_query", None, False)
        if name not in self.table:
            return ToolResult(f"No entity named {name[:40]!r}.", [], "unknown_entity", None, False)
        lines = self.table[name]
        self._shown.extend(("", line.strip("()").split(", ")[-1]) for line in lines)
        edges = [Edge(*parts, *parts[::2], "out") for parts in (line.strip("()").split(", ") for line in lines)]
        return ToolResult("\n".join(lines), edges, None, name, False)

    def resolve_answer(self, text: str) -> list[str]:
        return [part.strip().upper() for part in text.split("|") if part.strip()]

    def shown_entities(self) -> list[tuple[str, str]]:
        return list(self._shown)

    def label_of(self, entity: str) -> str | None:
        return entity  # the table's names are their own ids


class ScriptedLogits:
    """A test-only logits processor that forces a scripted token sequence per row.

    `scripts[row.index]` lists the ids the row must write, in order of its model-written tokens
    (tool tokens do not count). Past the script's end the row samples freely. Forcing keeps the
    model's real forward passes: only the sampling distribution is replaced by a one-hot.
    """

    def __init__(self, scripts: dict[int, list[int]]) -> None:
        self.scripts = scripts

    def __call__(self, rows, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        for i, row in enumerate(rows):
            script = self.scripts.get(row.index, [])
            if not row.finished and row.num_model_tokens < len(script):
                logits[i] = float("-inf")
                logits[i, script[row.num_model_tokens]] = 0.0
        return logits


class RecordingLogits:
    """A test-only processor that stores each live row's raw logits, keyed by (row, token number)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], torch.Tensor] = {}

    def __call__(self, rows, logits: torch.Tensor) -> torch.Tensor:
        for i, row in enumerate(rows):
            if not row.finished:
                self.seen[(row.index, row.num_model_tokens)] = logits[i].clone()
        return logits


@pytest.fixture
def stub(openai_server):
    """`stub(reply)`: the shared stand-in server (tests/conftest.py) answering `reply(JSON body)`."""
    return lambda reply: openai_server(lambda request: reply(request.body))
