"""Request deadlines as the rollout engine's stop rule (`RolloutEngine.run(..., halt=...)`).

Each request has a deadline (arrival + `request_timeout`). The engine asks the rule after every
token a row is given (hf and vllm backends) and before each tool call (every backend, so per turn
for openai); a row past its deadline stops with finish reason `error` and is reported as timed
out (its trajectory's error kind is `halt`), while the rest of its batch goes on.
"""

from __future__ import annotations

import time

TIMEOUT_ERROR = "generation stopped: the request timeout ({seconds:g} s) passed"


class Deadlines:
    """`halt` for one rollout batch: row index -> `time.monotonic()` limit."""

    def __init__(self, deadlines: dict[int, float], timeout: float) -> None:
        self.deadlines = deadlines
        self.message = TIMEOUT_ERROR.format(seconds=timeout)

    def __call__(self, row: int) -> str | None:
        deadline = self.deadlines.get(row)
        if deadline is None or time.monotonic() <= deadline:
            return None
        return self.message
