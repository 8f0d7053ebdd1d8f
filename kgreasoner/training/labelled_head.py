"""An LM head that scores only labelled positions, for SFT off CUDA.

TRL's `SFTTrainer` calls `model(..., fused_lm_head=True)` and reads per-token log-probabilities,
entropy and top-1 hits. Its fused head projects only labelled positions on Triton devices; on CPU
it projects every position (prompt and `<triples>` blocks included) through the vocabulary. A warm-up
trajectory has about ten times more masked than trained tokens, so on CPU most of an SFT step went
into logits nobody uses. `add_labelled_lm_head` swaps in a head that gathers the labelled hidden
states first and projects only those; it returns the same `FusedCausalLMOutput`, so TRL's loss,
its metrics and DDP (which calls `model.forward`) are unchanged.
"""

from __future__ import annotations

import functools
import types

import torch

from kgreasoner.training.trl_internals import FusedCausalLMOutput


def logit_scaling(model) -> str | None:
    """The config field by which `model` scales or soft-caps its logits, or None for a plain `lm_head(hidden)`."""
    config = model.config.get_text_config()
    for name in (
        "final_logit_softcapping",
        "logit_scale",
        "output_multiplier",
        "lm_head_multiplier",
        "logits_scaling",
    ):
        if getattr(config, name, None) not in (None, 1.0):
            return name
    return None


def add_labelled_lm_head(model) -> None:
    """Replace `model.forward`'s `fused_lm_head=True` path by one that projects only labelled positions.

    Call it after TRL patched the model (the `fused_lm_head=False` path goes on to TRL's forward).
    Models that scale or soft-cap their logits are refused: this head applies neither.
    """
    scaling = logit_scaling(model)
    if scaling is not None:
        raise ValueError(
            f"labelled LM head: {model.config.get_text_config().model_type} sets {scaling}, "
            "which this head does not apply"
        )
    previous_forward = model.forward

    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head:
            return previous_forward(
                *args, labels=labels, shift_labels=shift_labels, num_items_in_batch=num_items_in_batch, **kwargs
            )
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        if shift_labels is None:
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        else:
            labels = shift_labels
        mask = labels != -100
        targets = labels[mask]
        logits = self.get_output_embeddings()(hidden[mask]).float()
        log_probs_all = torch.log_softmax(logits, dim=-1)
        token_log_probs = log_probs_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            entropy = -(log_probs_all.exp() * log_probs_all).sum(-1)
            is_top1 = (logits.argmax(-1) == targets).to(logits.dtype)

        def scatter(values: torch.Tensor) -> torch.Tensor:
            # `masked_scatter` keeps a batch without labels connected to the graph (a zero loss, not an error)
            return values.new_zeros(mask.shape).masked_scatter(mask, values)

        log_probs = scatter(token_log_probs)
        denominator = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(
            loss=-log_probs.sum() / denominator,
            log_probs=log_probs,
            entropy=scatter(entropy),
            is_top1=scatter(is_top1),
            label_mask=mask,
        )

    model.forward = types.MethodType(forward, model)
