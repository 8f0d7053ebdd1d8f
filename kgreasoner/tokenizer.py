"""Tokenizers for tiny CPU models, trained locally with the `tokenizers` library.

Two kinds share one byte-level pipeline, so every string encodes and `decode(encode(x)) == x`
holds exactly (whitespace, newlines, unicode, control characters, anything valid UTF-8):

- `word` (default): every word seen in the training texts (questions, KG labels) is ONE token, up
  to `vocab_size`; a word not in the vocabulary falls back to its UTF-8 bytes, one token each.
  At a 12-minute CPU budget this beat a byte-level BPE (half the sequence length,
  names not garbled). Built as a BPE model with no merges and `ignore_merges=True`: a pre-token
  found in the vocabulary is emitted whole, anything else splits into the 256 byte symbols.
- `bpe`: a byte-level BPE of `vocab_size`, trained with `tokenizers.trainers.BpeTrainer`.

Pre-tokenization (both kinds): `WORD_PATTERN` splits text into words with their leading space
(`" Utah"`), punctuation runs and whitespace runs; `_`, `-` and `.` inside a word keep it whole so
PathQuestion names such as `frederica_of_mecklenburg-strelitz` and dotted Freebase relations are
one word. Pieces are then mapped to the GPT-2 byte alphabet (space -> `Ġ`, newline -> `Ċ`) and the
ByteLevel decoder maps them back. No normaliser: case and unicode are kept as written.

A word appears in trajectories both after a space (`(E2 Utah, ...`) and right after a tag or
bracket (`<search>Utah</search>`), which are two different pre-tokens. Training texts are usually
labels or questions, which show their first word only in the second form, so the first word of
every text is also counted in its after-a-space form.

Added tokens, each a single id in both kinds:
- the protocol tags (`kgreasoner.protocol.TAGS`), not special: they are content the model writes
  and reads, and `skip_special_tokens=True` must keep them;
- entity handles `E1` .. `E{num_handles}` (`protocol.HANDLE_PREFIX`), not special, matched only as
  whole words, so `(E2 Utah` gives `(`, `E2`, ` Utah` while `E2x` or `E650` are spelled normally;
- `<|im_start|>` (turn start), `<|im_end|>` (end of turn = eos) and `<|endoftext|>` (pad), special.

Chat template (`CHAT_TEMPLATE`, Jinja, roles system / user / assistant only)::

    <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{question}<|im_end|>\\n
    <|im_start|>assistant\\n{trajectory}<|im_end|>\\n

`add_generation_prompt=True` ends the text with `<|im_start|>assistant\\n`. The assistant content
and its `<|im_end|>` are wrapped in `{% generation %}`, so `return_assistant_tokens_mask=True`
marks exactly the tokens the model is trained to write.

With `TokenizerConfig.system_prompt: false` (the compact prompt) the template leaves system turns
out: a model trained from scratch learns the protocol from its examples, not from instructions, and
the ~260-token system prompt was most of every GRPO sequence. Pretrained models keep the paper's
instructions (their own chat templates render the system turn).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from kgreasoner.config import ConfigError
from kgreasoner.protocol import ANSWER_CLOSE, HANDLE_PREFIX, INSTRUCTIONS, PROMPT_TEMPLATE, TAGS

if TYPE_CHECKING:  # transformers costs a second to import; the CLI parser should not pay it.
    from transformers import PreTrainedTokenizerFast

TURN_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
"""Ends every chat turn; the model's last token. Generation also stops at `</answer>`."""
PAD_TOKEN = "<|endoftext|>"
PROMPT_TEXTS = (INSTRUCTIONS, PROMPT_TEMPLATE)
"""Learned beside the given texts (`TokenizerConfig.include_prompt`)."""
SPECIAL_TOKENS = (TURN_START, EOS_TOKEN, PAD_TOKEN)
STOP_TOKENS = (EOS_TOKEN, ANSWER_CLOSE)
"""Tokens whose ids go in `generation_config.eos_token_id`. The tool-call boundary `</search>`
is deliberately not one: stopping there is the rollout engine's choice (it resumes after the
tool's `<triples>`), not the end of a generation."""

WORD_PATTERN = r" ?'?[\p{L}\p{N}_]+(?:[\-.][\p{L}\p{N}_]+)*| ?[^\s\p{L}\p{N}_]+|\s+(?!\S)|\s+"
TOKENIZER_KINDS = ("word", "bpe")
NAMES_FILE = "names.tsv"
CHAT_ROLES = ("system", "user", "assistant")
"""Role names the chat template writes after `<|im_start|>`; the word vocabulary always has them."""
BYTE_ALPHABET = tuple(sorted(pre_tokenizers.ByteLevel.alphabet()))

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('chat template: unknown role ' ~ message['role'] ~ '; use system, user or assistant') }}"
    "{%- endif -%}"
    "{%- if message['role'] != 'system' or not compact -%}"
    "{{ '<|im_start|>' ~ message['role'] ~ '\\n' }}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{ message['content'] ~ '<|im_end|>' }}{% endgeneration %}"
    "{%- else -%}"
    "{{ message['content'] ~ '<|im_end|>' }}"
    "{%- endif -%}"
    "{{ '\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def chat_template(system_prompt: bool = True) -> str:
    """CHAT_TEMPLATE, with system turns rendered or (compact) left out."""
    return "{%- set compact = " + ("false" if system_prompt else "true") + " -%}" + CHAT_TEMPLATE


@dataclass
class TokenizerConfig:
    """How the tiny model's tokenizer is trained (section `tokenizer:` of a tiny model YAML)."""

    kind: str = field(
        default="word",
        metadata={"help": "'word': one token per word seen in the texts, byte fallback; 'bpe': byte-level BPE"},
    )
    vocab_size: int = field(
        default=24000,
        metadata={
            "help": "size of the learned vocabulary including the 256 byte symbols (and for 'word' the 3 chat "
            "role names), excluding added tokens (tags, handles, specials); 'word' keeps the most "
            "frequent words that fit"
        },
    )
    min_frequency: int = field(
        default=1,
        metadata={"help": "a word (or BPE pair) must occur at least this often in the texts to get its own token"},
    )
    num_handles: int = field(
        default=64, metadata={"help": "entity handles E1..E{num_handles} added as single tokens; 0 for no handles"}
    )
    include_prompt: bool = field(
        default=True,
        metadata={
            "help": "also learn the words of the system prompt (protocol.INSTRUCTIONS), which every "
            "example starts with; without them it is ~800 byte tokens instead of ~200"
        },
    )
    system_prompt: bool = field(
        default=True,
        metadata={
            "help": "false: the chat template leaves the system turn (the paper's instructions) out, so a prompt "
            "is the question and topic entities only (~20 tokens instead of ~280); for models trained from "
            "scratch, which learn the protocol from examples"
        },
    )

    def __post_init__(self) -> None:
        if self.kind not in TOKENIZER_KINDS:
            raise ConfigError(f"tokenizer.kind must be one of {list(TOKENIZER_KINDS)}, got {self.kind!r}")
        if self.vocab_size <= len(BYTE_ALPHABET):
            raise ConfigError(
                f"tokenizer.vocab_size must exceed the {len(BYTE_ALPHABET)} byte symbols, got {self.vocab_size}"
            )
        if self.min_frequency < 1:
            raise ConfigError(f"tokenizer.min_frequency must be >= 1, got {self.min_frequency}")
        if self.num_handles < 0:
            raise ConfigError(f"tokenizer.num_handles must be >= 0, got {self.num_handles}")


def handle_tokens(num_handles: int) -> list[str]:
    """`E1` .. `E{num_handles}`: the handle strings a tokenizer with `num_handles` holds."""
    return [f"{HANDLE_PREFIX}{i}" for i in range(1, num_handles + 1)]


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> PreTrainedTokenizerFast:
    """Train a tokenizer of `config.kind` on `texts` (questions, KG labels, any lines of text).

    Returns a transformers fast tokenizer with the protocol tags, handles, special tokens and the
    chat template set; deterministic for the same texts and config.
    """
    from transformers import PreTrainedTokenizerFast

    if config.include_prompt:
        texts = itertools.chain(PROMPT_TEXTS, texts)
    segments = list(_training_segments(texts, config.num_handles))
    pre_tokenizer = _pre_tokenizer()
    if config.kind == "word":
        model = models.BPE(vocab=_word_vocab(segments, pre_tokenizer, config), merges=[], ignore_merges=True)
        backend = _assemble(model, pre_tokenizer)
    else:
        backend = _assemble(models.BPE(), pre_tokenizer)
        trainer = trainers.BpeTrainer(
            vocab_size=config.vocab_size,
            min_frequency=config.min_frequency,
            initial_alphabet=list(BYTE_ALPHABET),
            special_tokens=[],
            show_progress=False,
        )
        backend.train_from_iterator(segments, trainer=trainer)
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    # single_word: a handle is a token only standing alone, so "E23" with 20 handles is not "E2"+"3".
    backend.add_tokens(
        [AddedToken(t, single_word=True, normalized=False, special=False) for t in handle_tokens(config.num_handles)]
    )
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=chat_template(config.system_prompt),
        # The default clean-up would drop spaces before punctuation and break exact round trips.
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _assemble(model: models.Model, pre_tokenizer: pre_tokenizers.PreTokenizer) -> Tokenizer:
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    return backend


def _word_vocab(
    segments: list[str], pre_tokenizer: pre_tokenizers.PreTokenizer, config: TokenizerConfig
) -> dict[str, int]:
    """The 256 byte symbols, the chat roles, then the most frequent words (ties by text, for
    determinism)."""
    counts: Counter[str] = Counter()
    for segment in segments:
        counts.update(piece for piece, _ in pre_tokenizer.pre_tokenize_str(segment))
    vocab = {symbol: index for index, symbol in enumerate((*BYTE_ALPHABET, *CHAT_ROLES))}
    for word, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(vocab) >= config.vocab_size or count < config.min_frequency:
            break
        vocab.setdefault(word, len(vocab))
    return vocab


def _training_segments(texts: Iterable[str], num_handles: int) -> Iterator[str]:
    """Texts cut at added tokens (they never reach the model vocabulary), plus each segment's first
    word after a space (see the module docstring)."""
    added = [re.escape(t) for t in (*TAGS, *SPECIAL_TOKENS)]
    added += [rf"\b{t}\b" for t in handle_tokens(num_handles)]
    splitter = re.compile("|".join(added))
    pre_tokenizer = _pre_tokenizer()
    for text in texts:
        for segment in splitter.split(text):
            if not segment:
                continue
            yield segment
            _, (start, end) = pre_tokenizer.pre_tokenize_str(segment)[0]
            if not segment[start].isspace():
                yield " " + segment[start:end]


def read_training_texts(paths: Iterable[str | Path], splits: Iterable[str] | None = None) -> Iterator[str]:
    """Texts to train a tokenizer on, from dataset files.

    - `*.jsonl`: QA examples (the project's schema): the question, topic entity names, answer
      names and aliases, of the examples whose split is in `splits` (all when None: RL reads the
      training questions, which a warm-up sample alone would leave as byte pieces); or warm-up
      trajectories (`data_gen.warmup`): every segment's text, so
      the thinking templates and the tool's printed triples are words of their own (and the raw
      prompt of pipeline-step records, data_gen/pipeline_sft.py);
    - `*.nt`: N-Triples KG: `rdfs:label` values, relations and other literal values;
    - a `*.tsv` KG with a `names.tsv` beside it (the KG loader's convention: ids are not labels):
      per triple the subject label, the relation and the object label (literal values as written,
      unnamed mediator nodes skipped);
    - `names.tsv` (`id \\t label`): the labels;
    - anything else (kb.tsv without names, PathQuestion .txt, plain text): each tab-separated
      field of each line.
    KG labels are read per triple, so a label counts as often as the tool would print it.
    """
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"training text file not found: {path}")
        if path.suffix == ".jsonl":
            yield from (_warmup_texts(path) if _is_warmup_file(path) else _qa_texts(path, splits))
        elif path.suffix == ".nt":
            yield from _ntriples_texts(path)
        elif path.name == NAMES_FILE:
            from kgreasoner.kg.memory import read_names

            yield from read_names(path).values()
        elif path.suffix == ".tsv" and (path.parent / NAMES_FILE).exists():
            yield from _named_kg_texts(path, path.parent / NAMES_FILE)
        else:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    yield from (f for f in line.rstrip("\r\n").split("\t") if f.strip())


def _is_warmup_file(path: Path) -> bool:
    from kgreasoner.records.schema import iter_json_lines

    _, first = next(iter_json_lines(path), ("", {}))
    return isinstance(first, dict) and "segments" in first


def _warmup_texts(path: Path) -> Iterator[str]:
    # The texts of warm-up records (kgreasoner.records.trajectories' format) read as plain JSON: the
    # tokenizer sits below training, and a record's fields are checked where SFT reads it.
    from kgreasoner.records.schema import SchemaError, iter_json_lines

    for where, record in iter_json_lines(path):
        try:
            yield str(record["question"])
            if record.get("prompt") is not None:
                yield str(record["prompt"])
            yield from (str(segment["text"]) for segment in record["segments"])
        except (KeyError, TypeError) as err:
            raise SchemaError(f"{where}: not a warm-up record ({err!r})") from err


def _qa_texts(path: Path, splits: Iterable[str] | None = None) -> Iterator[str]:
    from kgreasoner.records.schema import iter_jsonl

    keep = None if splits is None else set(splits)
    for example in iter_jsonl(path):
        if keep is not None and example.split not in keep:
            continue
        yield example.question
        yield from (t.name for t in example.topic_entities)
        for answer in example.answers:
            yield answer.name
            yield from answer.aliases


def _named_kg_texts(path: Path, names_path: Path) -> Iterator[str]:
    from kgreasoner.kg.memory import read_names

    names = read_names(names_path)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 3:
                raise ValueError(f"{path}:{number}: expected 'subject<TAB>relation<TAB>object'")
            subject, relation, obj = fields
            yield from _node_label(subject, names)
            yield relation
            yield from _node_label(obj, names)


def _node_label(node: str, names: dict[str, str]) -> Iterator[str]:
    from kgreasoner.records.ids import is_literal_id, literal_value

    label = literal_value(node) if is_literal_id(node) else names.get(node)
    if label:
        yield label


def _ntriples_texts(path: Path) -> Iterator[str]:
    from kgreasoner.kg.rdf import RDFS_LABEL, iter_ntriples_as_ids
    from kgreasoner.records.ids import is_literal_id, literal_value

    for _, relation, obj in iter_ntriples_as_ids(path):
        if relation != RDFS_LABEL:
            yield relation
        if is_literal_id(obj):
            yield literal_value(obj)


def tokenizer_summary(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """Sizes worth logging: learned vocabulary and added tokens."""
    added = len(tokenizer.get_added_vocab())
    return {"vocab_size": len(tokenizer), "learned": len(tokenizer) - added, "added": added}
