"""`ServeConfig`: what `kgreasoner serve` and `kgreasoner answer` run (YAML + `--set` overrides).

    kgreasoner serve --config configs/tiny-cpu/serve.yaml --set llm=hf:checkpoints/tiny-cpu/sft/final

The same dataclass drives both commands, so an answer on the command line and one over HTTP go
through the same model, tool, limits and sampling defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kgreasoner.llm.backends import check_backend_spec
from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.rollout import RolloutConfig

SEED_RANGE = (-(2**63), 2**63 - 1)
"""Seeds a 64-bit generator takes (vLLM's range); torch's manual_seed fails outside it."""


@dataclass
class ServeConfig:
    """Model, knowledge graph, limits and batching of the answer service."""

    llm: str | None = field(
        default=None,
        metadata={
            "help": "hf:PATH (local transformers model), vllm:PATH (offline vLLM engine), vllm:URL[#MODEL] (a "
            "running `vllm serve`, token ids in and out: needs `tokenizer`) or openai:URL[#MODEL] (any "
            "OpenAI-compatible /v1/completions, text in and out)"
        },
    )
    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "vllm:URL and openai backends: the served model's tokenizer directory. vllm:URL needs it to send "
            "token ids; openai uses its chat template for the prompt, as the hf backend does with the "
            "checkpoint's own (without it openai prompts use the protocol's plain layout, which a model "
            "trained with a chat template has not seen)"
        },
    )
    kg: str | None = field(
        default=None,
        metadata={
            "help": "KG spec (kgreasoner.kg.open_kg): memory:PATH, oxigraph:DIR, sparql[+dialect]:URL, or a path"
        },
    )
    model_name: str | None = field(
        default=None,
        metadata={
            "help": "name reported by /v1/models and chat responses (default: the checkpoint folder or served model)"
        },
    )
    host: str = field(default="127.0.0.1", metadata={"help": "address `kgreasoner serve` binds (loopback by default)"})
    port: int = field(default=8000, metadata={"help": "port `kgreasoner serve` listens on (0: a free one)"})
    tool: ToolConfig = field(
        default_factory=ToolConfig,
        metadata={
            "help": "the search tool; must match what the model was trained with (entity_handles for tiny models)"
        },
    )
    rollout: RolloutConfig = field(
        default_factory=RolloutConfig,
        metadata={
            "help": "rollout limits; max_turns and max_new_tokens are also the caps on what a request may ask for"
        },
    )
    temperature: float = field(
        default=0.0, metadata={"help": "sampling temperature when a request names none (0: greedy)"}
    )
    seed: int = field(default=0, metadata={"help": "sampling seed when a request names none"})
    max_question_chars: int = field(default=2000, metadata={"help": "longest question accepted (characters)"})
    max_topic_entities: int = field(default=16, metadata={"help": "most topic entities one request may name"})
    max_body_bytes: int = field(default=65536, metadata={"help": "largest HTTP request body; larger ones get 413"})
    header_timeout: float = field(
        default=10.0,
        metadata={
            "help": "seconds to receive a request's headers, from the connection's opening (or the next request's "
            "first byte); a slower client gets 408 and loses its connection (uvicorn has no such limit of its own)"
        },
    )
    body_timeout: float = field(
        default=30.0,
        metadata={
            "help": "seconds to receive a request's whole body; a slower client gets 408 and loses its connection "
            "(so a client trickling its body cannot hold a connection)"
        },
    )
    request_timeout: float = field(
        default=120.0,
        metadata={
            "help": "seconds from a request's arrival to its answer, queueing included; past it generation of "
            "that request stops (a call to a generation server still running is abandoned and its connection "
            "closed) and the client gets 504"
        },
    )
    max_batch_size: int = field(
        default=16,
        metadata={
            "help": "hf and vllm:PATH: requests generated together in one rollout batch (one model forward per step "
            "for all). A generation server (openai:URL, vllm:URL) batches concurrent requests itself: there "
            "each request is rolled out on its own (see backend_workers)"
        },
    )
    batch_wait: float = field(
        default=0.01,
        metadata={
            "help": "hf and vllm:PATH: seconds the batcher waits for more requests after the first before it starts "
            "a batch"
        },
    )
    max_queue: int = field(default=256, metadata={"help": "requests waiting beyond this many get 503"})
    torch_threads: int | None = field(
        default=None,
        metadata={
            "help": "hf backend: torch intra-op threads (None: torch's default, one per core). On a machine whose "
            "cores other CPU jobs share, 1 keeps OpenMP threads from spinning against them (measured on "
            "2 shared cores: a 32-request batch in 1.4 s with 1 thread, 36 s with 2)"
        },
    )
    backend_workers: int = field(
        default=16,
        metadata={
            "help": "openai:URL and vllm:URL: requests rolled out at once, each on its own, so at most this many "
            "generation requests in flight; a request whose upstream call stalls holds one of them until its "
            "request_timeout, never the others"
        },
    )
    backend_timeout: float = field(
        default=120.0,
        metadata={
            "help": "openai:URL and vllm:URL: seconds per generation request (each is also cut off at its "
            "request's request_timeout)"
        },
    )

    def __post_init__(self) -> None:
        if self.llm is not None:
            try:
                check_backend_spec(self.llm, self.tokenizer)
            except ValueError as err:
                raise ValueError(f"llm: {err}") from err
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {self.seed}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {self.torch_threads}")
        for name in (
            "max_question_chars",
            "max_topic_entities",
            "max_body_bytes",
            "max_batch_size",
            "max_queue",
            "backend_workers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("request_timeout", "backend_timeout", "body_timeout", "header_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.batch_wait < 0:
            raise ValueError(f"batch_wait must be >= 0, got {self.batch_wait}")
