"""SFT step time on CPU: TRL's fused LM head vs the labelled-positions head.

    python -m bench.sft_head_bench --model CKPT --trajectories WARMUP.jsonl [--batch 16] [--steps 5] [--threads 1]

Takes the first `--batch` warm-up trajectories, tokenised as `train/sft.py` does (labels only on
model-written tokens), and times `--steps` forward + backward passes with each head after one
untimed pass. Prints the sequence and label counts, seconds per step, and tokens/s (all tokens of
the padded batch, as TRL's `num_tokens` counts them), and the largest loss difference between heads.
"""

from __future__ import annotations

import argparse
import time

import torch

from kgreasoner.models import load_model_and_tokenizer
from kgreasoner.records.trajectories import read_warmup
from kgreasoner.training.labelled_head import add_labelled_lm_head
from kgreasoner.training.trl_internals import add_fused_lm_head
from kgreasoner.training.warmup_data import encode_record


def make_batch(path: str, tokenizer, size: int) -> dict[str, torch.Tensor]:
    encoded = [encode_record(r, tokenizer) for r in read_warmup(path)[:size]]
    width = max(len(e["input_ids"]) for e in encoded)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(encoded), width), pad)
    labels = torch.full((len(encoded), width), -100)
    attention = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, e in enumerate(encoded):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        attention[row, :n] = 1
        mask = torch.tensor(e["assistant_masks"], dtype=torch.bool)
        labels[row, :n] = torch.where(mask, ids[row, :n], -100)
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def batch_arguments(doc: str) -> argparse.ArgumentParser:
    """The options both CPU benches share: checkpoint, warm-up trajectories, batch size, torch threads."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--trajectories", required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    return parser


def time_head(model, batch, steps: int) -> tuple[float, float]:
    def step() -> float:
        model.zero_grad()
        out = model(**batch, fused_lm_head=True)
        out.loss.backward()
        return out.loss.item()

    loss = step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, loss


def main() -> None:
    parser = batch_arguments(__doc__)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model, tokenizer = load_model_and_tokenizer(args.model)
    batch = make_batch(args.trajectories, tokenizer, args.batch)
    tokens = int(batch["attention_mask"].sum())
    labelled = int((batch["labels"] != -100).sum())
    print(
        f"vocab {model.config.vocab_size}, batch {tuple(batch['input_ids'].shape)}, "
        f"{tokens} tokens, {labelled} labelled ({labelled / tokens:.1%})"
    )
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    fused, fused_loss = time_head(model, batch, args.steps)
    add_labelled_lm_head(model)
    ours, our_loss = time_head(model, batch, args.steps)
    for name, seconds in (("trl fused head", fused), ("labelled head", ours)):
        print(f"{name:15s} {seconds:6.2f} s/step  {tokens / seconds:8.0f} tokens/s")
    print(f"speed-up {fused / ours:.2f}x; loss {fused_loss:.5f} vs {our_loss:.5f}")


if __name__ == "__main__":
    main()
