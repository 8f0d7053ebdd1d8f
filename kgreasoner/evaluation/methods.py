"""The method registry of `kgreasoner eval` and the config that sets every method up.

`build_method(name, context)` makes one method; `METHODS` lists the names. `EvalConfig` is the
YAML recipe (`kgreasoner eval --config FILE --set tog.width=5`), every field documented.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kgreasoner.baselines.base import Method
from kgreasoner.baselines.io import IOMethod
from kgreasoner.baselines.oracle import OracleConfig, OracleMethod
from kgreasoner.baselines.parog import PaRoGConfig, PaRoGMethod
from kgreasoner.baselines.sog import SoGConfig, SoGMethod
from kgreasoner.baselines.tog import ToGConfig, ToGMethod
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.llm.clients import LLMClient
from kgreasoner.llm.spec import CLIENT_FORMS, describe_forms
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.rollout import RolloutConfig


@dataclass
class EvalConfig:
    """Settings of one evaluation run (YAML for `kgreasoner eval --config`)."""

    workers: int = field(
        default=0,
        metadata={
            "help": "questions answered at once; 0: the LLM client's own concurrency (HTTP threads, or the hf "
            "batch size)"
        },
    )
    batch_size: int = field(
        default=16,
        metadata={
            "help": "hf: prompts per generation batch; also the questions per rollout batch of the kgreasoner method"
        },
    )
    max_tokens: int = field(default=256, metadata={"help": "reply budget of one LLM call of the pipeline baselines"})
    limit: int | None = field(
        default=None, metadata={"help": "answer only the first N questions of the split (None: all)"}
    )
    temperature: float = field(default=0.0, metadata={"help": "kgreasoner method sampling temperature (0: greedy)"})
    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "kgreasoner method over openai:URL: the model's tokenizer (path), whose chat template renders "
            "the prompts as in training"
        },
    )
    tog: ToGConfig = field(default_factory=ToGConfig, metadata={"help": "ToG beam search"})
    sog: SoGConfig = field(default_factory=SoGConfig, metadata={"help": "SoG tool limits"})
    parog: PaRoGConfig = field(default_factory=PaRoGConfig, metadata={"help": "PaRoG limits"})
    oracle: OracleConfig = field(default_factory=OracleConfig, metadata={"help": "oracle walk limits"})
    tool: ToolConfig = field(
        default_factory=ToolConfig, metadata={"help": "search tool of the kgreasoner and oracle methods"}
    )
    rollout: RolloutConfig = field(
        default_factory=RolloutConfig, metadata={"help": "rollout limits of the kgreasoner method"}
    )

    def __post_init__(self) -> None:
        if self.workers < 0 or self.batch_size < 1 or self.max_tokens < 1:
            raise ValueError("workers must be >= 0, batch_size and max_tokens >= 1")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {self.limit}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@dataclass
class MethodContext:
    """What methods are built from: the KG, the LLM client (None for LLM-free methods), the config.

    The search tool is made on first use (with an embedding or gat ranker it loads an encoder).
    """

    kg: KnowledgeGraph
    llm: LLMClient | None
    config: EvalConfig = field(default_factory=EvalConfig)
    _tool: KGSearchTool | None = None

    @property
    def tool(self) -> KGSearchTool:
        if self._tool is None:
            self._tool = KGSearchTool(self.kg, self.config.tool)
        return self._tool


def _kgreasoner(ctx: MethodContext) -> Method:
    from kgreasoner.evaluation.rollout_method import KGReasonerMethod
    from kgreasoner.rollout import SamplingParams

    return KGReasonerMethod(
        ctx.llm,
        ctx.tool,
        ctx.config.rollout,
        SamplingParams(temperature=ctx.config.temperature, seed=0),
        ctx.config.tokenizer,
    )


METHODS: dict[str, Callable[[MethodContext], Method]] = {
    "io": lambda ctx: IOMethod(False),
    "cot": lambda ctx: IOMethod(True),
    "tog": lambda ctx: ToGMethod(ctx.kg, ctx.config.tog),
    "sog": lambda ctx: SoGMethod(ctx.kg, ctx.config.sog),
    "parog": lambda ctx: PaRoGMethod(ctx.kg, ctx.config.parog),
    "oracle": lambda ctx: OracleMethod(ctx.tool, ctx.config.oracle),
    "kgreasoner": _kgreasoner,
}


def build_method(name: str, ctx: MethodContext) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    method = METHODS[name](ctx)
    if method.uses_llm and ctx.llm is None:
        raise ValueError(f"method {name!r} needs an LLM: pass --llm {describe_forms(CLIENT_FORMS)}")
    return method
