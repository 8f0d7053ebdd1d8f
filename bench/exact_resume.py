"""The quick demo's SFT stage killed after a checkpoint and resumed, against the same stage never stopped.

    python -m bench.exact_resume --out OUT [--kill-after 50]

Runs the quick demo's stages before SFT into OUT (skipped when done), then its SFT recipe twice: once
through, once killed right after the checkpoint of step `--kill-after` (an exception in `on_save`, as a
kill leaves it) and resumed with `resume=True`. Prints every logged loss after that step from both runs,
and whether they are equal to the last digit. About 2 CPU minutes on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from transformers import TrainerCallback

from kgreasoner.config import load_config
from kgreasoner.demo import QUICK_CONFIG, Demo, DemoConfig
from kgreasoner.stages import StageRunner
from kgreasoner.training.sft import train_sft

REPO = Path(__file__).resolve().parents[1]


class Killed(Exception):
    """What the callback raises in place of the kill."""


class KillAfterSave(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Killed


def logged_losses(run_dir: Path) -> dict[int, float]:
    last = max(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text(encoding="utf-8"))
    return {row["step"]: row["loss"] for row in state["log_history"] if "loss" in row}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the demo folder (its stages before SFT are kept)")
    parser.add_argument("--kill-after", type=int, default=50, help="the checkpoint's step (a multiple of save_steps)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    demo = Demo(load_config(DemoConfig, REPO / QUICK_CONFIG), args.out)
    runner = StageRunner(demo.store, 1, show_commands=False)
    for stage in demo.stages():
        if stage.name == "sft":
            break
        runner.run(stage, stage.name)
    whole = dataclasses.replace(demo.sft.config, run_dir=str(args.out / "sft-whole"))
    train_sft(whole)
    killed = dataclasses.replace(demo.sft.config, run_dir=str(args.out / "sft-killed"))
    try:
        train_sft(killed, callbacks=[KillAfterSave(args.kill_after)])
    except Killed:
        print(f"killed after checkpoint-{args.kill_after}; resuming", flush=True)
    train_sft(killed, resume=True)
    expected, resumed = logged_losses(Path(whole.run_dir)), logged_losses(Path(killed.run_dir))
    after = [step for step in sorted(expected) if step > args.kill_after]
    for step in after:
        again = resumed.get(step, float("nan"))
        print(f"step {step:>4}: never stopped {expected[step]:.4f}, killed and resumed {again:.4f}")
    print(f"every logged loss after step {args.kill_after} equal: {all(expected[s] == resumed.get(s) for s in after)}")


if __name__ == "__main__":
    main()
