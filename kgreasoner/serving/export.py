"""Export a trained checkpoint as a directory `vllm serve` loads: LoRA merged, stop tokens set.

    kgreasoner export checkpoints/grpo/final --out exported/grpo [--base checkpoints/sft/final]

- A LoRA adapter directory (`adapter_config.json`) is merged into its base model
  (`base_model_name_or_path`, a directory or a hub name in the local cache, or `--base`) with PEFT's
  `merge_and_unload`; a full checkpoint is copied through `save_pretrained` as is.
- Written: `config.json`, `model.safetensors`, the tokenizer (from the adapter directory when it has
  one: that is the tokenizer training added tags and handles to), and `generation_config.json`
  whose `eos_token_id` lists the tokenizer's end-of-turn token plus `</answer>` when that tag is a
  single token, so a server stops right after the answer as the hf backend does.
- `export.json` records the source, the base, whether an adapter was merged, the stop ids, which
  protocol tags are single tokens, and the largest logit difference between the source model and
  the exported one on a probe text (the merge check).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tqdm import tqdm

from kgreasoner.protocol import ANSWER_CLOSE, TAGS, build_prompt

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER_CONFIG = "adapter_config.json"
MANIFEST = "export.json"
PROBE_QUESTION = ("what timezone is utah in", ["Utah"])
PROBE_TRAJECTORY = (
    " <think> I need the time zone. <search>Utah</search>\n"
    "<triples>\n(Utah, time zone, Mountain Time Zone)\n</triples>\n"
)


def export_checkpoint(
    source: str | Path, out: str | Path, base: str | Path | None = None, dtype: str = "float32"
) -> dict[str, Any]:
    """Write the servable directory `out` from `source`; returns the manifest (also in `out/export.json`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

    from kgreasoner.models import check_weights, ensure_pad_token

    source, out = Path(source), Path(out)
    if not source.is_dir():
        raise FileNotFoundError(f"{source} is not a checkpoint directory")
    check_weights(source)  # an adapter's weights, or the model's
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; choose a new --out")
    torch_dtype = getattr(torch, dtype)
    adapter = (source / ADAPTER_CONFIG).is_file()
    stages = tqdm(total=4, desc="export", unit="stage", disable=None, postfix="load")
    model: PeftModel | PreTrainedModel
    if adapter:
        from peft import PeftModel

        recorded = json.loads((source / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
        base_path = str(base) if base is not None else recorded
        if not base_path:
            raise ValueError(f"{source / ADAPTER_CONFIG} names no base model; pass --base")
        check_weights(base_path)
        try:  # a directory, or a hub name (an adapter trained from `Qwen/Qwen3-8B` records that)
            base_model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch_dtype)
        except OSError as err:
            raise FileNotFoundError(
                f"base model {base_path} of the adapter is neither a checkpoint directory nor "
                f"in the local hub cache (pass --base): {err}"
            ) from err
        model = PeftModel.from_pretrained(base_model, source)
        tokenizer_dir = source if _has_tokenizer(source) else base_path
    else:
        if base is not None:
            raise ValueError(f"--base is only for LoRA adapters; {source} has no {ADAPTER_CONFIG}")
        base_path = None
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
        tokenizer_dir = source
    model.eval()
    stages.update()
    stages.set_postfix_str("merge" if adapter else "copy")
    tokenizer = ensure_pad_token(AutoTokenizer.from_pretrained(tokenizer_dir))
    probe = tokenizer(
        build_prompt(PROBE_QUESTION[0], PROBE_QUESTION[1], tokenizer) + PROBE_TRAJECTORY,
        add_special_tokens=False,
        return_tensors="pt",
    )["input_ids"]
    with torch.no_grad():
        reference = model(input_ids=probe).logits.float()
    # peft types the unwrapped model as an nn.Module: it is the base model, a PreTrainedModel.
    merged = model if isinstance(model, PreTrainedModel) else cast(PreTrainedModel, model.merge_and_unload())
    merged.generation_config = _generation_config(merged, tokenizer)
    if merged.config.pad_token_id is None:
        merged.config.pad_token_id = tokenizer.pad_token_id
    stages.update()
    stages.set_postfix_str("save")
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    stages.update()
    stages.set_postfix_str("check")

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch_dtype).eval()
    with torch.no_grad():
        difference = (reloaded(input_ids=probe).logits.float() - reference).abs().max().item()
    single = {tag: len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1 for tag in TAGS}
    manifest = {
        "source": str(source),
        "base": None if base_path is None else str(base_path),
        "merged_adapter": adapter,
        "dtype": dtype,
        "eos_token_id": merged.generation_config.eos_token_id,
        "single_token_tags": single,
        "probe_max_logit_difference": difference,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    stages.update()
    stages.close()
    return manifest


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()


def _generation_config(model: Any, tokenizer: Any) -> Any:
    """The model's generation config with the end-of-turn token and a one-token `</answer>` as stops."""
    from transformers import GenerationConfig

    config = model.generation_config or GenerationConfig()
    stops: list[int] = []
    configured = config.eos_token_id
    for value in (configured, tokenizer.eos_token_id):
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is not None and int(token) not in stops:
                stops.append(int(token))
    answer_ids = tokenizer(ANSWER_CLOSE, add_special_tokens=False)["input_ids"]
    if len(answer_ids) == 1 and answer_ids[0] not in stops:
        stops.append(answer_ids[0])
    config.eos_token_id = stops
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    return config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="merge a LoRA adapter (or copy a checkpoint) into a directory `vllm serve` loads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", type=Path, help="a checkpoint or LoRA adapter directory")
    parser.add_argument("--out", type=Path, required=True, help="the new directory to write")
    parser.add_argument("--base", type=Path, help="base model of a LoRA adapter (default: the one the adapter names)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="weight dtype of the export"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    manifest = export_checkpoint(args.source, args.out, args.base, args.dtype)
    kind = "merged LoRA adapter into " + str(manifest["base"]) if manifest["merged_adapter"] else "copied checkpoint"
    print(
        f"export: {args.source} -> {args.out} ({kind}); stop ids {manifest['eos_token_id']}; "
        f"probe max |logit difference| {manifest['probe_max_logit_difference']:.2e}"
    )
    missing = [tag for tag, single in manifest["single_token_tags"].items() if not single]
    if missing:
        print(f"export: note: {', '.join(missing)} are several tokens each; servers stop on them as strings")
    print(
        f"export: serve it with `vllm serve {args.out}` and answer with `kgreasoner answer "
        f"--llm vllm:http://127.0.0.1:8000/v1 --tokenizer {args.out} ...` (or --llm openai:URL, text)"
    )
    return 0
