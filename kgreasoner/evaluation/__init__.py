"""Evaluation: metrics, the resumable harness, reports and `kgreasoner eval`.

- `metrics`: Hits@1 and set F1 / EM over normalised answers.
- the LLM clients the methods call are `kgreasoner.llm`'s (`open_llm(spec)`; `llm` here re-exports them).
- `methods`: the method registry and `EvalConfig`; `rollout_method`: our model with the tool.
- `harness`: per-question JSONL (append-only, resumable) and `run_evaluation`.
- `report`: summaries overall and by hop count, as JSON and Markdown.
- `failures`: one failure category per wrong answer, read from the kgreasoner trace.
- `commands`: the `eval` subcommand.
Nothing is imported here, so importing the package loads neither torch nor a model.
"""
