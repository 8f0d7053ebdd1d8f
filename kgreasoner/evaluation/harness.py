"""Run methods over questions: per-question JSONL written as it goes, resumable, then a summary.

`evaluate_method(method, examples, path, llm=...)` appends one JSON record per question to
`path` and flushes it, so an interrupted run loses at most the questions in flight; run again
with the same path, it skips the ids already there (a half-written last line is dropped).

Record fields: `id, method, question, hops, gold, answers, hits1, f1, em, precision, recall,
format_valid, llm_calls, prompt_tokens, completion_tokens, kg_queries, wall_time, error, trace,
failure`. A method that raises on one question gets a record with `error` set and no answers; the
run goes on. `failure` is the category of a wrong answer (`kgreasoner.evaluation.failures`), null
for correct answers and for traces without a search record; a method's `kg` attribute, when it
has one, serves the categories' KG checks.

Concurrency: LLM methods run `workers` questions at once in threads (each with a metered view
of the shared client, so usage is per question; the hf client batches what the threads send);
batched methods (kgreasoner) answer `batch_size` questions per call, and each question's
`wall_time` is its batch's time divided by the batch size.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kgreasoner.baselines.base import Method, MethodResult
from kgreasoner.evaluation.failures import classify_failure
from kgreasoner.evaluation.metrics import score_answers
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.llm.clients import LLMClient
from kgreasoner.records.schema import QAExample


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Complete records of a results file; a trailing line cut by an interruption is removed from the file."""
    path = Path(path)
    if not path.exists():
        return []
    records, good_bytes = [], 0
    with open(path, "rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                break
            if not isinstance(record, dict) or "id" not in record:
                break
            records.append(record)
            good_bytes += len(raw)
    if good_bytes < path.stat().st_size:
        with open(path, "r+b") as handle:
            handle.truncate(good_bytes)
    return records


def make_record(
    method: str,
    example: QAExample,
    result: MethodResult,
    usage: dict[str, int],
    wall_time: float,
    kg: KnowledgeGraph | None = None,
) -> dict[str, Any]:
    scores = score_answers(result.answers, example.answers)
    return {
        "id": example.id,
        "method": method,
        "question": example.question,
        "hops": example.hops,
        "gold": example.answer_names,
        "answers": list(result.answers),
        "hits1": scores.hits1,
        "f1": scores.f1,
        "em": scores.em,
        "precision": scores.precision,
        "recall": scores.recall,
        "format_valid": bool(result.format_valid),
        "llm_calls": int(usage.get("llm_calls", 0)),
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "completion_tokens": int(usage.get("completion_tokens", 0)),
        "kg_queries": int(result.kg_queries),
        "wall_time": round(wall_time, 6),
        "error": result.error,
        "trace": result.trace,
        "failure": classify_failure(example, result.trace, scores.hits1 == 1.0, kg),
    }


def evaluate_method(
    method: Method,
    examples: Sequence[QAExample],
    path: str | Path,
    llm: LLMClient | None = None,
    workers: int = 1,
    batch_size: int = 16,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Answer every example not yet in `path`; return the records of `examples` (old and new), in their order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {r["id"] for r in read_records(path)}
    todo = [e for e in examples if e.id not in done]
    lock = threading.Lock()
    with open(path, "a", encoding="utf-8") as sink, _progress(len(todo), method.name, progress) as bar:

        def write(record: dict[str, Any]) -> None:
            line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
            with lock:
                sink.write(line)
                sink.flush()
                bar.update(1)

        if method.batched:
            for start in range(0, len(todo), batch_size):
                for record in _run_batch(method, todo[start : start + batch_size]):
                    write(record)
        elif workers <= 1:
            for example in todo:
                write(_run_one(method, example, llm))
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
                for future in concurrent.futures.as_completed([pool.submit(_run_one, method, e, llm) for e in todo]):
                    write(future.result())
    by_id = {r["id"]: r for r in read_records(path)}
    return [by_id[e.id] for e in examples if e.id in by_id]


def _run_one(method: Method, example: QAExample, llm: LLMClient | None) -> dict[str, Any]:
    metered = llm.metered() if (llm is not None and method.uses_llm) else None
    start = time.perf_counter()
    try:
        result = method.answer(example, metered)
    except Exception as err:  # one question's failure is recorded, not fatal for the run
        result = MethodResult([], False, None, error=f"{type(err).__name__}: {err}")
    seconds = time.perf_counter() - start
    usage = result.usage if result.usage is not None else (metered.usage.as_dict() if metered else {})
    return make_record(method.name, example, result, usage, seconds, method.kg)


def _run_batch(method: Method, batch: Sequence[QAExample]) -> list[dict[str, Any]]:
    start = time.perf_counter()
    try:
        results = method.answer_batch(batch)
    except Exception as err:
        results = [MethodResult([], False, None, error=f"{type(err).__name__}: {err}") for _ in batch]
    share = (time.perf_counter() - start) / max(1, len(batch))
    return [make_record(method.name, e, r, r.usage or {}, share, method.kg) for e, r in zip(batch, results)]


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _progress(total: int, name: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=name, unit="q", dynamic_ncols=True)


def select_examples(examples: Iterable[QAExample], limit: int | None) -> list[QAExample]:
    """The examples in order, the first `limit` only when given."""
    examples = list(examples)
    return examples if limit is None else examples[:limit]


RUN_FILE = "run.json"


def run_evaluation(
    method_names: Sequence[str],
    examples: Sequence[QAExample],
    ctx: Any,
    out_dir: str | Path,
    info: Any,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Evaluate each method into `out_dir/<method>.jsonl` and write `summary.json` / `summary.md`.

    `ctx` is a `MethodContext`, `info` a `RunInfo`. The folder remembers what it holds
    (`run.json`): resuming into it with another dataset, split or split scheme is refused.
    Methods evaluated earlier into the same folder stay in the summary.
    """
    from kgreasoner.evaluation.methods import build_method
    from kgreasoner.evaluation.report import summarize, write_report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_run_file(
        out / RUN_FILE,
        {"dataset": info.dataset, "split": info.split, "split_scheme": info.split_scheme, "seed": info.seed},
    )
    methods = [build_method(name, ctx) for name in method_names]  # fail before any work on a bad name
    summaries: dict[str, dict[str, Any]] = {}
    previous = out / "summary.json"
    if previous.exists():
        summaries.update(json.loads(previous.read_text(encoding="utf-8")).get("methods", {}))
    config = ctx.config
    llm = ctx.llm
    workers = config.workers or (llm.concurrency if llm is not None else 1)
    for method in methods:
        records = evaluate_method(
            method,
            examples,
            out / f"{method.name}.jsonl",
            llm=llm,
            workers=workers,
            batch_size=config.batch_size,
            progress=progress,
        )
        summaries[method.name] = summarize(records)
    write_report(out, info, summaries)
    return summaries


def _check_run_file(path: Path, wanted: dict[str, Any]) -> None:
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
        different = {k: (stored.get(k), v) for k, v in wanted.items() if stored.get(k) != v}
        if different:
            detail = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in different.items())
            raise ValueError(f"{path.parent} holds results of another evaluation ({detail}); use another --out")
        return
    path.write_text(json.dumps(wanted, indent=2) + "\n", encoding="utf-8")
