"""What a warm-up run generates, from which data, and where it goes (`WarmupConfig`), and the optional
teacher endpoint that writes the thinking text (`TeacherConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from data_gen.augment import AugmentConfig
from kgreasoner.config import count_or_all
from kgreasoner.records.splits import DEFAULT_SPLIT_SCHEME, SCHEMES, SPLIT_SCHEME_HELP
from kgreasoner.retrieval.tool import ToolConfig

ANSWER_MODES = ("first", "all")
PICKS = ("witness", "first_shown")
HANDLE_NUMBERS = ("appearance", "random")

WARMUP_PROMPT = (
    "You write the hidden thinking of an assistant that answers a question by searching a knowledge "
    "graph from inside its reasoning. The tool returns triples inside <triples> tags.\n"
    "Question: {question}\nTopic entity: {topics}\n"
    "The reasoning so far:\n{trajectory}\n"
    "The assistant's next action is: {action}\n"
    "The next thought must convey: {hint}\n"
    "Write only that next thought: one to three short sentences that lead to the action, naming "
    "entities exactly as the triples write them{handle_note}. Do not write any tags and do not "
    "write the action itself."
)
"""The teacher's warm-up prompt. Written here in the paper's spirit (its exact text is not in this
repository); replace it with `teacher.prompt`. Slots: question, topics, trajectory, action, hint,
handle_note."""


@dataclass
class TeacherConfig:
    """An OpenAI-compatible chat endpoint that writes the thinking text (off by default)."""

    enabled: bool = field(
        default=False, metadata={"help": "ask the teacher for each thought; templates are the fallback"}
    )
    base_url: str | None = field(
        default=None,
        metadata={"help": "endpoint base, e.g. http://127.0.0.1:8000/v1 (`/chat/completions` is appended)"},
    )
    model: str = field(default="", metadata={"help": "model name sent to the endpoint"})
    api_key_env: str = field(
        default="OPENAI_API_KEY", metadata={"help": "environment variable holding the API key (sent only if set)"}
    )
    prompt: str = field(
        default=WARMUP_PROMPT,
        metadata={"help": "the warm-up prompt (slots: question, topics, trajectory, action, hint, handle_note)"},
    )
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature"})
    max_tokens: int = field(default=128, metadata={"help": "cap on the tokens of one thought"})
    max_chars: int = field(default=600, metadata={"help": "a longer reply is rejected (template used instead)"})
    timeout: float = field(default=30.0, metadata={"help": "seconds per request"})
    max_consecutive_failures: int = field(
        default=5,
        metadata={
            "help": (
                "after this many failures in a row the teacher is not asked again (every later thought counts as "
                "a fallback)"
            )
        },
    )

    def __post_init__(self) -> None:
        if self.enabled and (not self.base_url or not self.model):
            raise ValueError("teacher.enabled needs teacher.base_url and teacher.model")
        if self.max_tokens < 1 or self.max_chars < 1 or self.timeout <= 0 or self.max_consecutive_failures < 1:
            raise ValueError("teacher.max_tokens, max_chars and max_consecutive_failures must be >= 1 and timeout > 0")


@dataclass
class WarmupConfig:
    """What a warm-up run (`data_gen.warmup`) generates, from which data, and where it goes."""

    dataset: str = field(
        metadata={"help": "dataset folder (kb.tsv + questions.jsonl) or a set name (PQ-2H, PQL-3H, ...)"}
    )
    output: str = field(metadata={"help": "JSONL of WarmupRecord to write"})
    data_root: str | None = field(
        default=None,
        metadata={"help": "data root for named benchmarks (default: $KGREASONER_DATA, then ../shared/data)"},
    )
    split_scheme: str = field(default=DEFAULT_SPLIT_SCHEME, metadata={"help": SPLIT_SCHEME_HELP})
    split_seed: int = field(default=0, metadata={"help": "seed of that split"})
    tool: ToolConfig = field(
        default_factory=ToolConfig,
        metadata={"help": "the search tool (handles, ranking, top_k): use the one the model will meet"},
    )
    num_examples: int | str | None = field(
        default=500,
        metadata={
            "help": (
                "trajectories from train-split questions (the paper used ~500); `all` or null: one per training "
                "question (the gold rows of guided groups in GRPO)"
            )
        },
    )
    sample_size: int | None = field(
        default=None, metadata={"help": "with sample_output: how many training questions the SFT sample holds"}
    )
    sample_output: str | None = field(
        default=None,
        metadata={
            "help": (
                "also write the records of the first `sample_size` training questions (in `sample` order) and "
                "every dev record here: a small SFT warm-up beside the full set guided groups take gold rows from"
            )
        },
    )
    sample: str = field(
        default="shuffled",
        metadata={
            "help": (
                "which training questions the first `num_examples` are: `shuffled` (a seeded shuffle) or "
                "`stratified` (hop counts take turns, and relation paths within a hop count, so a small warm-up "
                "covers every hop count and as many paths as fit)"
            )
        },
    )
    dev_examples: int | str | None = field(
        default=50,
        metadata={
            "help": "trajectories from dev-split questions, for early stopping of SFT (`all`/null: every one; 0: none)"
        },
    )
    correction_share: float = field(
        default=0.3, metadata={"help": "share of records that are error-correction trajectories (0-1)"}
    )
    answer_mode: str = field(
        default="first",
        metadata={
            "help": (
                "first: answer the gold answer the walk reached; all: every gold answer the last search showed "
                "(`A | B`)"
            )
        },
    )
    shuffle_triples: bool = field(
        default=False,
        metadata={
            "help": (
                "shuffle the candidates in each tool block (a mediator's lines stay together) and renumber "
                "handles in order of appearance, so that handle numbers and line positions do not predict the "
                "relation; such records no longer replay verbatim"
            )
        },
    )
    handle_numbers: str = field(
        default="appearance",
        metadata={
            "help": (
                "`appearance`: handles numbered in order of appearance, as the tool numbers them; `random`: "
                "training records give every non-topic handle a random unused number up to `handle_pool`, so no "
                "handle can be predicted by counting and the model must copy it from the line that holds it; dev "
                "records keep the tool's numbers"
            )
        },
    )
    handle_pool: int = field(
        default=64,
        metadata={
            "help": "highest handle number `handle_numbers: random` draws (at most the tokenizer's `num_handles`)"
        },
    )
    copies: int = field(
        default=1,
        metadata={
            "help": (
                "records per training question; with `handle_numbers: random` each copy numbers its handles anew "
                "(a fresh numbering per epoch, as it were)"
            )
        },
    )
    lookup_drills: int = field(
        default=0,
        metadata={
            "help": "[experimental] drill records per training record (data_gen/lookup_drill.py): the trajectory up "
            "to one of its tool blocks, masked, then that block's lines probed in random order, each line's "
            "tail handle and label trained; 0: none"
        },
    )
    thought_names: bool = field(
        default=False,
        metadata={
            "help": (
                "with handles, also write labels after handles in the thinking (tiny models copy handles more "
                "easily than names)"
            )
        },
    )
    pick: str = field(
        default="witness",
        metadata={
            "help": (
                "which shown entity a walk follows when several carry the gold relation: `witness` (the one on "
                "the question's own gold path, else the first shown) or `first_shown` (the first shown that reaches "
                "a gold answer; a first-shown one that dead-ends in the KB is searched first and backtracked from, "
                "as a model that takes the first matching line must do)"
            )
        },
    )
    augment: AugmentConfig = field(
        default_factory=AugmentConfig,
        metadata={
            "help": (
                "training-question rewrites before their trajectories are made: paraphrase mixing, name dropout "
                "(data_gen/augment.py)"
            )
        },
    )
    max_repeats: int = field(
        default=3,
        metadata={
            "help": (
                "filtered pages (`NAME | REL`) and relation listings (`NAME | relations`) of one entity when the "
                "gold continuation was not shown yet; beyond them the question is skipped "
                "(gold_not_shown:max_repeats)"
            )
        },
    )
    seed: int = field(default=0, metadata={"help": "seed of question order, template choice and error placement"})
    templates: str | None = field(
        default=None,
        metadata={"help": "YAML mapping template group -> list of strings, replacing the built-in groups it names"},
    )
    teacher: TeacherConfig = field(
        default_factory=TeacherConfig, metadata={"help": "optional LLM that writes the thinking text"}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "tokenizer (path or hub name) to report mean token counts in the summary"}
    )
    summary: str | None = field(
        default=None, metadata={"help": "summary JSON path (default: the output path with .summary.json)"}
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        if self.split_scheme not in SCHEMES:
            raise ValueError(f"split_scheme must be one of {SCHEMES}, got {self.split_scheme!r}")
        if self.answer_mode not in ANSWER_MODES:
            raise ValueError(f"answer_mode must be one of {ANSWER_MODES}, got {self.answer_mode!r}")
        if not 0.0 <= self.correction_share <= 1.0:
            raise ValueError(f"correction_share must be in [0, 1], got {self.correction_share}")
        if self.pick not in PICKS:
            raise ValueError(f"pick must be one of {PICKS}, got {self.pick!r}")
        if self.sample not in ("shuffled", "stratified"):
            raise ValueError(f"sample must be shuffled or stratified, got {self.sample!r}")
        if (self.sample_output is None) != (self.sample_size is None) or (self.sample_size or 1) < 1:
            raise ValueError("sample_output and sample_size (>= 1) go together")
        if self.handle_numbers not in HANDLE_NUMBERS:
            raise ValueError(f"handle_numbers must be one of {HANDLE_NUMBERS}, got {self.handle_numbers!r}")
        if self.copies < 1 or self.handle_pool < 1:
            raise ValueError(f"copies and handle_pool must be >= 1, got {self.copies} and {self.handle_pool}")
        if self.copies > 1 and self.handle_numbers != "random":
            raise ValueError("copies > 1 repeats identical records unless handle_numbers is `random`")
        if self.lookup_drills < 0:
            raise ValueError(f"lookup_drills must be >= 0, got {self.lookup_drills}")
        if self.lookup_drills and not self.tool.entity_handles:
            raise ValueError("lookup_drills probe handles: it needs tool.entity_handles true")
        if self.max_repeats < 0:
            raise ValueError(f"max_repeats must be >= 0, got {self.max_repeats}")
        self.num_examples = count_or_all(self.num_examples, "num_examples")
        self.dev_examples = count_or_all(self.dev_examples, "dev_examples")

    @property
    def summary_path(self) -> Path:
        if self.summary:
            return Path(self.summary)
        out = Path(self.output)
        return out.with_name(out.name.removesuffix(".jsonl") + ".summary.json")
