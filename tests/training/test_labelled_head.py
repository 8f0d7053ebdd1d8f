"""The labelled-positions LM head gives TRL's fused head's outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from kgreasoner.models import load_model_and_tokenizer
from kgreasoner.training.labelled_head import add_labelled_lm_head


def _batch(vocab_size: int):
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab_size, (3, 24), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 18:] = 0
    labels = input_ids.clone()
    labels[:, :10] = -100  # the prompt
    labels[0, 14:17] = -100  # a <triples> block
    labels[2, 18:] = -100  # padding
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _outputs_and_grads(model, batch):
    model.zero_grad()
    out = model(**batch, fused_lm_head=True)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_same_loss_metrics_and_gradients_as_trl(tiny_checkpoint):
    trl_model, _ = load_model_and_tokenizer(tiny_checkpoint)
    ours, _ = load_model_and_tokenizer(tiny_checkpoint)
    add_fused_lm_head(trl_model, outputs=("log_probs", "entropy", "is_top1"))
    add_fused_lm_head(ours, outputs=("log_probs", "entropy", "is_top1"))
    add_labelled_lm_head(ours)
    batch = _batch(trl_model.config.vocab_size)

    expected, expected_grads = _outputs_and_grads(trl_model, batch)
    got, grads = _outputs_and_grads(ours, batch)

    assert torch.equal(got.label_mask, expected.label_mask)
    # 23 next-token labels per row; the first label of a row is never predicted, so the prompt masks 9
    assert int(got.label_mask.sum()) == 3 * 23 - 3 * 9 - 3 - 6
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.log_probs, expected.log_probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.entropy, expected.entropy, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.is_top1, expected.is_top1.to(got.is_top1.dtype))
    assert got.log_probs[~got.label_mask].abs().sum() == 0
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_num_items_in_batch_divides_the_summed_loss(tiny_checkpoint):
    model, _ = load_model_and_tokenizer(tiny_checkpoint)
    add_fused_lm_head(model)
    add_labelled_lm_head(model)
    batch = _batch(model.config.vocab_size)
    with torch.no_grad():
        mean = model(**batch, fused_lm_head=True)
        summed = model(**batch, fused_lm_head=True, num_items_in_batch=1)
    torch.testing.assert_close(summed.loss, mean.loss * mean.label_mask.sum())


def test_a_batch_without_labels_gives_a_differentiable_zero(tiny_checkpoint):
    model, _ = load_model_and_tokenizer(tiny_checkpoint)
    add_fused_lm_head(model)
    add_labelled_lm_head(model)
    batch = _batch(model.config.vocab_size)
    batch["labels"][:] = -100
    out = model(**batch, fused_lm_head=True)
    out.loss.backward()
    assert out.loss.item() == 0.0


def test_generation_path_is_untouched(tiny_checkpoint):
    model, _ = load_model_and_tokenizer(tiny_checkpoint)
    batch = _batch(model.config.vocab_size)
    with torch.no_grad():
        before = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        add_fused_lm_head(model)
        add_labelled_lm_head(model)
        after = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.equal(before, after)


def test_models_that_scale_logits_are_refused(tiny_checkpoint):
    model, _ = load_model_and_tokenizer(tiny_checkpoint)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        add_labelled_lm_head(model)
