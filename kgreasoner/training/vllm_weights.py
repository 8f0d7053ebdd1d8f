"""The trainer's weights under the names and shapes vLLM's model loaders take, for TRL's weight sync.

transformers 5 keeps a Qwen3-MoE layer's experts fused, one tensor per projection:
`model.layers.{L}.mlp.experts.gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up rows: the
forward splits the product with `chunk(2, dim=-1)`, gate first) and `...mlp.experts.down_proj` [E, H, I].
vLLM's Qwen3-MoE loader (`Qwen3MoeModel.load_weights`, through `FusedMoE.make_expert_params_mapping`)
takes the names of the released checkpoints, one per expert and projection, as `nn.Linear` weights
([out, in]): `...mlp.experts.{e}.gate_proj.weight` [I, H], `...up_proj.weight` [I, H] and
`...down_proj.weight` [H, I], which is also what `save_pretrained` writes. A fused name matches none of
its mappings: a KeyError, or in loaders that skip unknown names, rollouts from the experts vLLM
loaded at start. `vllm_named_weights` unfuses them (views, no copies); every other weight, and every
weight of a model without fused experts, passes as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

FUSED_GATE_UP = ".mlp.experts.gate_up_proj"
FUSED_DOWN = ".mlp.experts.down_proj"
UNFUSED_LAYOUTS = ("qwen3_moe",)
"""Model types whose fused experts are laid out as above (checked against transformers 5.23's modeling)."""
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")
"""Config fields by which transformers' MoE configs (Qwen, Mixtral, DeepSeek) give their expert count."""
VLLM_MOE_BACKEND = "triton"
"""vLLM's MoE kernels for a model with experts (its `moe_backend` engine argument, `KernelConfig.moe_backend`).

vLLM picks its MoE kernels at start-up, and for unquantized experts may pick FlashInfer's CUTLASS or TRTLLM
ones (in its current source, the first choice on Blackwell GPUs), whose weight layout it makes once, after
the checkpoint loads
(`convert_to_unquantized_kernel_format`: w13's gate and up halves swapped, TRTLLM's block layout). The
weight loader kept on those parameters writes the checkpoint's layout, so a later `model.load_weights`
(TRL's sync, every step) leaves experts the kernels misread: rollouts from corrupted experts, no error.
Triton's kernels take the checkpoint's layout as it is, so every sync loads correctly."""


def has_experts(config) -> bool:
    """Whether a transformers config describes a mixture-of-experts model."""
    return any(getattr(config, field, None) for field in EXPERT_COUNTS)


def vllm_engine_args(config) -> dict[str, str]:
    """Engine arguments the colocated `vllm.LLM` serving a model of `config` gets besides TRL's: a MoE model's
    experts on Triton's kernels (`VLLM_MOE_BACKEND` says why); nothing for a dense model."""
    return {"moe_backend": VLLM_MOE_BACKEND} if has_experts(config) else {}


def is_fused_expert(name: str) -> bool:
    """Whether `name` is a fused expert weight of transformers 5 (all of a layer's experts in one tensor)."""
    return name.endswith((FUSED_GATE_UP, FUSED_DOWN))


def check_unfusable(model_type: str, names: Iterable[str]) -> None:
    """Refuse (ValueError) a model with fused experts whose layout `vllm_named_weights` does not know."""
    fused = next((name for name in names if is_fused_expert(name)), None)
    if fused is not None and model_type not in UNFUSED_LAYOUTS:
        raise ValueError(
            f"{fused}: model type {model_type!r} keeps its experts fused, and its layout for vLLM's "
            f"loader is not known here (known: {', '.join(UNFUSED_LAYOUTS)}); train a supported "
            "model or use rollout_backend: hf"
        )


def vllm_named_weights(
    weights: Iterable[tuple[str, torch.Tensor]], model_type: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs vLLM's loader takes for the trainer's `weights` of a `model_type` model.

    Fused experts come out one expert after the other, gate, up, then down for each; the tensors are
    views of the fused one, so they must be used before the next pair is asked for (TRL's sync loads
    each pair at once, inside the ZeRO-3 gather of its parameter).
    """
    for name, tensor in weights:
        if not is_fused_expert(name):
            yield name, tensor
            continue
        check_unfusable(model_type, [name])
        prefix = name.rsplit(".", 1)[0]  # ...mlp.experts
        if name.endswith(FUSED_GATE_UP):
            half = tensor.shape[1] // 2
            for expert, rows in enumerate(tensor):
                yield f"{prefix}.{expert}.gate_proj.weight", rows[:half]
                yield f"{prefix}.{expert}.up_proj.weight", rows[half:]
        else:
            for expert, weight in enumerate(tensor):
                yield f"{prefix}.{expert}.down_proj.weight", weight
