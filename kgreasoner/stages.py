"""Stages of `kgreasoner demo` and `kgreasoner ablate`: the runner and the store of finished stages.

A `Stage` is a name, a title, the shell commands that do the same, and the library call that runs
it. `StageRunner.run` skips a stage the store holds as finished (so an interrupted demo or
ablation resumes), else prints its title (and commands), runs it, and records its wall and CPU
seconds with its result in the store.

The store keeps one JSON marker per finished stage under its root (`OUT/stages`):
`ROOT/NAME.json` for the demo (one run, each stage writes its own folder of OUT), or, for a stage
shared by content (`stage_key`: the hash of its commands, the recipe files they name and the
previous stage's key), `ROOT/NAME/KEY.json` beside the stage's output folder `ROOT/NAME/KEY/`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

C = TypeVar("C")


@dataclass
class Stage:
    """One stage: its name, a title for the progress lines, the shell commands doing the same, and what runs it."""

    name: str
    title: str
    commands: list[str]
    run: Callable[[], dict[str, Any]]


def command(*parts: Any, sets: Sequence[str] = ()) -> str:
    """A shell command line: the parts (None left out), then `--set ITEM` for each override."""
    words = [str(p) for p in parts if p is not None]
    for item in sets:
        words += ["--set", item]
    return " ".join(shlex.quote(w) for w in words)


@dataclass(frozen=True)
class StageInput(Generic[C]):
    """What one stage runs with: its config object, built from the recipe YAML at `path` (None: the config's
    defaults) with the `--set` overrides `sets` on top, exactly as the stage's printed command builds it."""

    config: C
    path: str | None
    sets: tuple[str, ...]

    def config_args(self) -> list[str]:
        """`--config PATH` for the stage's command, or nothing without a recipe."""
        return ["--config", self.path] if self.path else []

    def command(self, *parts: Any) -> str:
        """The stage's shell command: `parts` (program and subcommand), `--config PATH`, then `--set` each override."""
        return command(*parts, *self.config_args(), sets=self.sets)


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON through a temporary file renamed onto `path`: a run killed while writing leaves
    the previous file or none, never a cut one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    partial.replace(path)


class StageRecordError(ValueError):
    """A record of a finished stage or run that cannot be read; the message names the file and what is wrong."""


STAGE_FIELDS = ("stage", "seconds", "commands", "result")
"""What a stage record holds (`StageRunner.run` writes it); `result` holds at least the stage's `line`."""


def read_record(path: Path, fields: Sequence[str], what: str = "stage") -> dict[str, Any]:
    """The JSON object in `path` holding every one of `fields`; anything else is a StageRecordError saying to
    delete the file, so the `what` it records runs again."""
    again = f"delete it and the {what} runs again"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StageRecordError(
            f"{path}: not a readable {what} record, cut short or not JSON ({err}); {again}"
        ) from None
    if not isinstance(record, dict):
        raise StageRecordError(f"{path}: a {what} record is a JSON object, not {type(record).__name__}; {again}")
    missing = [f"'{name}'" for name in fields if name not in record]
    result = record.get("result")
    if (
        "result" in fields
        and result is not None
        and not (isinstance(result, dict) and isinstance(result.get("line"), str))
    ):
        missing.append("'result.line'")
    if missing:
        raise StageRecordError(f"{path}: {what} record without {', '.join(missing)}; {again}")
    return record


def default_threads() -> int:
    """Torch threads of every stage when `--threads` does not say: `OMP_NUM_THREADS` when set (a job given cores of
    its own says how many), else every core this process may run on. Not the load average at start: what else
    happened to run then must not decide how a stage computes."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"OMP_NUM_THREADS must be a positive integer (torch threads of each stage), got {value!r}"
            )
        return int(value)
    if hasattr(os, "sched_getaffinity"):  # the cores `taskset` or a container left this process
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_text(threads: int) -> str:
    return f"{threads} torch thread{'s' * (threads > 1)}"


def log_progress() -> None:
    """The library's own INFO lines (ranker epochs, ...) on stderr: stages that print nothing else for minutes."""
    logger = logging.getLogger("kgreasoner")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("    %(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def stage_key(previous: str, stage: Stage, folder: Path) -> str:
    """A stage's identity: its commands with the run folder left out, the recipe files they name, the
    previous stage's key. Equal keys mean equal inputs, so the output is shared."""
    digest = hashlib.sha256(f"{previous}\n{stage.name}\n".encode())
    for line in stage.commands:
        digest.update(line.replace(str(folder), "{run}").encode() + b"\n")
        words = shlex.split(line)
        for index, word in enumerate(words[:-1]):
            if word == "--config":
                digest.update(Path(words[index + 1]).read_bytes())
    return digest.hexdigest()[:16]


class StageStore:
    """Markers of finished stages under `root`, by name (one run) or by name and content key (shared)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def folder(self, name: str, key: str) -> Path:
        """Where the stage with this key writes its output."""
        return self.root / name / key

    def marker(self, name: str, key: str | None = None) -> Path:
        return self.root / f"{name}.json" if key is None else self.root / name / f"{key}.json"

    def finished(self, name: str, key: str | None = None) -> dict[str, Any] | None:
        """The record of the finished stage, None when it has not finished."""
        marker = self.marker(name, key)
        return read_record(marker, STAGE_FIELDS) if marker.exists() else None

    def records(self) -> dict[str, dict[str, Any]]:
        """Every finished stage's record by stage name (the by-name markers)."""
        records = {}
        for path in sorted(self.root.glob("*.json")):
            record = read_record(path, STAGE_FIELDS)
            records[record["stage"]] = record
        return records

    def save(self, record: dict[str, Any]) -> None:
        write_json(self.marker(record["stage"], record.get("key")), record)


def _cpu_seconds() -> float:
    # User + system time of this process and of the children it waited for: a stage's threads and
    # any subprocess it ran.
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclass
class StageRunner:
    """Runs stages into a store; `show_commands` prints each stage's shell commands before it runs.

    Each stage runs with `threads` torch threads, set at its start (a stage or library that changed the count
    does not carry it into the next) and said in its first line; the caller's count is restored after."""

    store: StageStore
    threads: int
    show_commands: bool = True

    def run(
        self, stage: Stage, head: str, *, key: str | None = None, finish: str | None = None, **extra: Any
    ) -> tuple[dict[str, Any], bool]:
        """(the stage's record, whether it ran now): a finished stage is not run again.

        Prints `HEAD (N torch threads) ...` before and `FINISH: RESULT LINE (SECONDS s)` after (FINISH defaults
        to HEAD); `extra` fields go into the record.
        """
        import torch

        done = self.store.finished(stage.name, key)
        if done is not None:
            return done, False
        print(f"{head} ({threads_text(self.threads)}) ...", flush=True)
        if self.show_commands:
            for line in stage.commands:
                print(f"    $ {line}", flush=True)
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            wall, cpu = time.perf_counter(), _cpu_seconds()
            result = stage.run()
            seconds, cpu_seconds = time.perf_counter() - wall, _cpu_seconds() - cpu
        finally:
            torch.set_num_threads(previous)
        print(f"{finish or head}: {result['line']} ({seconds:.1f}s)", flush=True)
        record = {
            "stage": stage.name,
            **({"key": key} if key is not None else {}),
            "seconds": round(seconds, 2),
            "cpu_seconds": round(cpu_seconds, 2),
            "commands": stage.commands,
            "threads": self.threads,
            **extra,
            "result": result,
        }
        self.store.save(record)
        return record, True
