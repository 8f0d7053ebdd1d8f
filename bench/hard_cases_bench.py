"""Hard-case scoring time on CPU: logits at every position vs at labelled positions only.

    python -m bench.hard_cases_bench --model CKPT --trajectories WARMUP.jsonl [--batch 16] [--repeats 5] [--threads 1]

Scores the first `--batch` warm-up trajectories (no grad) as `kgreasoner hard-cases` does, once
through the model's full forward (every position through the LM head) and once through
`kgreasoner.training.hard_cases.batch_losses`, after one untimed pass of each; prints seconds per batch and the largest
difference between the per-example losses of the two.
Measured (PQL-2H grouped copy warm-up, its untrained 1M model, batch 16 of 581 tokens, 1,067 labelled, one
thread, nothing else running): 2.307 -> 0.661 s per batch (3.49x), losses equal to 1.9e-06.
"""

from __future__ import annotations

import time

import torch

from bench.sft_head_bench import batch_arguments, make_batch
from kgreasoner.models import load_model_and_tokenizer
from kgreasoner.training.hard_cases import batch_losses


def labelled_batch_losses(model, batch) -> torch.Tensor:
    return batch_losses(model, batch["input_ids"], batch["attention_mask"], batch["labels"])


def full_losses(model, batch) -> torch.Tensor:
    """The reference: every position through the LM head, as `kgreasoner hard-cases` did before."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    target = batch["labels"][:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, ignore_index=-100, reduction="none")
    return nll.sum(1) / (target != -100).sum(1)


@torch.no_grad()
def timed(fn, model, batch, repeats: int) -> tuple[float, torch.Tensor]:
    losses = fn(model, batch)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(model, batch)
    return (time.perf_counter() - start) / repeats, losses


def main() -> None:
    parser = batch_arguments(__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model)
    model.eval()
    batch = make_batch(args.trajectories, tokenizer, args.batch)
    labelled = int((batch["labels"] != -100).sum())
    print(f"batch {tuple(batch['input_ids'].shape)}, {labelled} labelled tokens, vocabulary {model.config.vocab_size}")
    full_s, full = timed(full_losses, model, batch, args.repeats)
    ours_s, ours = timed(labelled_batch_losses, model, batch, args.repeats)
    print(f"every position: {full_s:.3f} s/batch; labelled only: {ours_s:.3f} s/batch ({full_s / ours_s:.2f}x)")
    print(f"largest per-example loss difference: {float((full - ours).abs().max()):.2e}")


if __name__ == "__main__":
    main()
