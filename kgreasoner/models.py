"""Load a causal LM with its tokenizer, or build a tiny one from scratch for CPU.

- `load_model_and_tokenizer(name_or_path)`: any causal LM by hub name (offline: from the local
  cache) or local path, with a pad token set (`ensure_pad_token`); a local checkpoint's weight files
  are checked first (`check_weights`: empty, truncated or not safetensors is an error naming the file).
- `build_tiny(config, texts, out_dir)`: trains a tokenizer on the texts (`kgreasoner.tokenizer`),
  builds a seeded Qwen3 or LLaMA from a `TinyModelConfig` and saves a checkpoint that
  `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(out_dir)` load like any other:
  `config.json`, `model.safetensors`, `generation_config.json`, `tokenizer.json`,
  `tokenizer_config.json`, `chat_template.jinja`, plus `tiny_model.yaml` (the recipe, for the record).

Stop tokens: `generation_config.eos_token_id` is `[<|im_end|>, </answer>]` (`tokenizer.STOP_TOKENS`),
so generation ends with the turn or right after the answer; `pad_token_id` is `<|endoftext|>`.

CLI: `python -m kgreasoner.models build-tiny --config configs/tiny-cpu/model.yaml --texts FILE... --out DIR`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kgreasoner.config import ConfigError, add_config_arguments, load_config
from kgreasoner.tokenizer import (
    STOP_TOKENS,
    TokenizerConfig,
    read_training_texts,
    tokenizer_summary,
    train_tokenizer,
)

if TYPE_CHECKING:  # torch + transformers models take seconds to import; load them when used.
    import torch
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

ARCHITECTURES = ("qwen3", "llama")
MIN_HEAD_DIM = 32
"""vLLM's CPU attention kernels need head_dim >= 32."""
PAD_CANDIDATES = ("<|finetune_right_pad_id|>", "<|endoftext|>", "<pad>", "<|pad|>", "[PAD]")
"""Reserved pad-like tokens tried, in order, before falling back to eos."""
DTYPES = ("auto", "float32", "bfloat16", "float16")
TINY_RECIPE_FILE = "tiny_model.yaml"


@dataclass
class TinyModelConfig:
    """A small decoder-only LM trained from scratch on CPU (YAML: configs/tiny-cpu/model.yaml)."""

    architecture: str = field(default="qwen3", metadata={"help": "model family: qwen3 or llama"})
    hidden_size: int = field(default=256, metadata={"help": "width of the residual stream"})
    num_layers: int = field(default=4, metadata={"help": "number of transformer blocks"})
    num_heads: int = field(default=4, metadata={"help": "attention (query) heads per block"})
    num_kv_heads: int = field(
        default=2, metadata={"help": "key/value heads (grouped-query attention); must divide num_heads"}
    )
    head_dim: int = field(
        default=64,
        metadata={"help": f"width of one attention head; >= {MIN_HEAD_DIM} so a CPU vLLM can serve the model"},
    )
    intermediate_size: int = field(default=768, metadata={"help": "hidden width of the SwiGLU MLP"})
    max_position_embeddings: int = field(
        default=4096,
        metadata={"help": "longest sequence (prompt + trajectory) in tokens the rotary embedding is set up for"},
    )
    tie_word_embeddings: bool = field(
        default=True, metadata={"help": "share the input embedding with the LM head (saves vocab x hidden parameters)"}
    )
    initializer_range: float = field(default=0.02, metadata={"help": "std of the normal weight init"})
    seed: int = field(default=0, metadata={"help": "seed of the weight init: same seed, same weights"})
    tokenizer: TokenizerConfig = field(
        default_factory=TokenizerConfig,
        metadata={"help": "tokenizer training settings (kind, vocab_size, min_frequency, num_handles)"},
    )

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"architecture must be one of {list(ARCHITECTURES)}, got {self.architecture!r}")
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim < MIN_HEAD_DIM:
            raise ConfigError(
                f"head_dim must be >= {MIN_HEAD_DIM} (vLLM on CPU cannot serve smaller "
                f"attention heads), got {self.head_dim}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        if self.initializer_range <= 0:
            raise ConfigError(f"initializer_range must be > 0, got {self.initializer_range}")


def build_tiny_model(config: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A freshly initialised Qwen3ForCausalLM or LlamaForCausalLM sized for `tokenizer`, float32.

    The init is seeded with `config.seed` (and leaves the global RNG as it was), so the same
    config and tokenizer give bit-identical weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_class, model_class = {
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[config.architecture]
    stops = generation_config(tokenizer)
    hf_config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=stops.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = model_class(hf_config)
    model.generation_config = stops
    return model


def generation_config(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Stop at the end of the turn or right after `</answer>`; pad with the tokenizer's pad."""
    from transformers import GenerationConfig

    stop_ids = [tokenizer.convert_tokens_to_ids(token) for token in STOP_TOKENS]
    return GenerationConfig(eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)


def build_tiny(
    config: TinyModelConfig, texts: Iterable[str], out_dir: str | Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Train the tokenizer on `texts`, build the seeded model and save both to `out_dir`."""
    tokenizer = train_tokenizer(texts, config.tokenizer)
    model = build_tiny_model(config, tokenizer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / TINY_RECIPE_FILE).write_text(
        yaml.safe_dump(dataclasses.asdict(config), sort_keys=False), encoding="utf-8"
    )
    return model, tokenizer


def parameter_counts(model: PreTrainedModel) -> dict[str, int]:
    """Unique parameters: total, in the input/output embeddings, and in the rest."""
    unique = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in unique.values())
    modules = (model.get_input_embeddings(), model.get_output_embeddings())
    weights = (module.get_parameter("weight") for module in modules if module is not None)
    embeddings = {id(weight): weight for weight in weights}  # tied weights count once
    in_embeddings = sum(p.numel() for p in embeddings.values())
    return {"total": total, "embeddings": in_embeddings, "non_embedding": total - in_embeddings}


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give `tokenizer` a pad token if it has none, preferring a reserved token distinct from eos.

    Why not simply eos: collators that drop the loss on padding would then also drop it on the
    real end of the answer, and the model would not learn to stop.
    """
    if tokenizer.pad_token is not None:
        return tokenizer
    vocab = tokenizer.get_vocab()
    for candidate in PAD_CANDIDATES:
        if candidate in vocab and candidate != tokenizer.eos_token:
            tokenizer.pad_token = candidate
            return tokenizer
    if tokenizer.eos_token is None:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token; add a pad token before training"
        )
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_and_tokenizer(
    name_or_path: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str = "cpu",
    padding_side: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load any causal LM and its tokenizer by hub name or local directory.

    Args:
        name_or_path: a local checkpoint directory, or a hub name already in the local cache
            (nothing is downloaded when HF_HUB_OFFLINE=1).
        dtype: "auto" (the checkpoint's dtype), "float32", "bfloat16", "float16" or a torch.dtype.
        device: "cpu", "cuda", "cuda:1", ..., or "auto" to let accelerate place the layers.
        padding_side: set the tokenizer's padding side ("left" for batched generation); None
            keeps the checkpoint's.
    Returns:
        (model in eval mode, tokenizer with a pad token). The model's config and generation
        config get the tokenizer's pad id when they had none.
    """
    dtype = _torch_dtype(dtype)  # a bad dtype is refused before anything loads
    tokenizer = load_tokenizer(name_or_path, padding_side)
    return load_model(name_or_path, tokenizer, dtype, device), tokenizer


def load_tokenizer(name_or_path: str | Path, padding_side: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of a checkpoint or cached hub model, with a pad token (`ensure_pad_token`)."""
    from transformers import AutoTokenizer

    if padding_side not in (None, "left", "right"):
        raise ValueError(f"padding_side must be 'left', 'right' or None, got {padding_side!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    except OSError as err:
        raise FileNotFoundError(_not_found(name_or_path, err)) from err
    ensure_pad_token(tokenizer)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    return tokenizer


def load_model(
    name_or_path: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    dtype: str | torch.dtype = "auto",
    device: str = "cpu",
) -> PreTrainedModel:
    """The causal LM of a checkpoint or cached hub model, in eval mode, with `tokenizer`'s pad id set
    where its config and generation config have none (arguments as `load_model_and_tokenizer`)."""
    from transformers import AutoModelForCausalLM

    dtype = _torch_dtype(dtype)
    check_weights(name_or_path)
    placement: dict[str, Any] = {"device_map": "auto"} if device == "auto" else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype, **placement)
    except OSError as err:
        raise FileNotFoundError(_not_found(name_or_path, err)) from err
    if device != "auto":
        model.to(device)  # type: ignore[arg-type]  # transformers wraps `to`, and its type reads self as the argument
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model


def inference_dtype(device: str) -> str:
    """bfloat16 on GPUs (half the memory, the dtype the released models are trained in), float32 on
    CPU (without bf16 instructions fp32 is faster there, and exact)."""
    return "float32" if device == "cpu" else "bfloat16"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    import torch

    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)} or a torch.dtype, got {dtype!r}")
        return dtype if dtype == "auto" else getattr(torch, dtype)
    return dtype


class CheckpointError(ValueError):
    """A checkpoint's weight file is empty, cut short or not safetensors; the message names the file."""


def check_weights(name_or_path: str | Path) -> None:
    """Refuse a local checkpoint whose safetensors weights could not load, naming the file and what is wrong:
    empty, shorter than its own header says (a copy or save cut short), not safetensors, or a shard its
    index lists that is missing. Only the headers are read. A hub name is left to transformers.
    """
    folder = Path(name_or_path)
    if not folder.is_dir():
        return
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        import json

        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{index}: not a safetensors index ({err!r})") from None
        missing = sorted(name for name in shards if not (folder / name).is_file())
        if missing:
            raise CheckpointError(f"{index}: lists {', '.join(missing)}, which the checkpoint does not hold")
    for path in sorted(folder.glob("*.safetensors")):
        _check_safetensors(path)


def _check_safetensors(path: Path) -> None:
    """A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's byte
    range, then the tensors' bytes."""
    import json

    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path}: empty (0 bytes); save or copy the checkpoint again")
    with path.open("rb") as handle:
        head = handle.read(8)
        header_bytes = int.from_bytes(head, "little") if len(head) == 8 else None
        if header_bytes is None or header_bytes > size - 8:
            raise CheckpointError(
                f"{path}: truncated or not safetensors: {size:,} bytes, too few for its own header; "
                "save or copy the checkpoint again"
            )
        try:
            header = json.loads(handle.read(header_bytes))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise CheckpointError(f"{path}: not a safetensors file (its header is not one)") from None
    if 8 + header_bytes + end > size:
        raise CheckpointError(
            f"{path}: truncated: {size:,} bytes where its header describes {8 + header_bytes + end:,}; "
            "save or copy the checkpoint again"
        )


def _not_found(name_or_path: str | Path, err: OSError) -> str:
    return (
        f"cannot load model {str(name_or_path)!r}: not a checkpoint directory and not in the local hub cache "
        f"(no downloads when HF_HUB_OFFLINE=1): {err}"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """The `build-tiny` subcommand (for `kgreasoner` and `python -m kgreasoner.models`)."""
    parser = subparsers.add_parser(
        "build-tiny",
        help="train a tokenizer and save a freshly initialised tiny model checkpoint",
        description="Fields of the --config YAML (TinyModelConfig):\n" + _describe_tiny(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--texts",
        nargs="+",
        required=True,
        type=Path,
        metavar="FILE",
        help="training texts: questions.jsonl, names.tsv, kb.tsv, PathQuestion .txt, plain text",
    )
    parser.add_argument(
        "--text-splits",
        nargs="+",
        default=None,
        metavar="SPLIT",
        help="read only these splits of QA files among --texts (e.g. train; default: every example)",
    )
    parser.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    parser.set_defaults(func=run_build_tiny)


def run_build_tiny(args: argparse.Namespace) -> int:
    config = load_config(TinyModelConfig, args.config, args.overrides)
    started = time.perf_counter()
    model, tokenizer = build_tiny(config, read_training_texts(args.texts, args.text_splits), args.out)
    sizes = tokenizer_summary(tokenizer)
    counts = parameter_counts(model)
    print(
        f"tokenizer ({config.tokenizer.kind}): {sizes['vocab_size']:,} tokens "
        f"({sizes['learned']:,} learned + {sizes['added']} added)"
    )
    print(
        f"model ({config.architecture}): {counts['total']:,} parameters, "
        f"{counts['non_embedding']:,} without embeddings"
    )
    print(f"saved to {args.out} in {time.perf_counter() - started:.1f}s")
    return 0


def _describe_tiny() -> str:
    from kgreasoner.config import describe

    return describe(TinyModelConfig) + "\n tokenizer:\n" + describe(TokenizerConfig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kgreasoner.models", description=__doc__.split("\n")[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(subparsers)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as err:
        print(f"{args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
