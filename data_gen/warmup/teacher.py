"""The optional teacher: an OpenAI-compatible endpoint asked for each thought, the templates its fallback."""

from __future__ import annotations

from collections import Counter
from typing import Any

from data_gen.warmup.config import TeacherConfig
from kgreasoner.llm import OpenAIClient
from kgreasoner.protocol import TAGS


class Teacher:
    """Asks an OpenAI-compatible endpoint for one thought; None (and a counted failure) on any problem."""

    def __init__(self, config: TeacherConfig) -> None:
        self.config = config
        self.client = OpenAIClient(
            config.base_url or "",
            config.model,
            max_tokens=config.max_tokens,
            timeout=config.timeout,
            api_key_env=config.api_key_env,
            temperature=config.temperature,
        )
        self.calls = 0
        self.used = 0
        self.failures: Counter[str] = Counter()
        self._consecutive = 0

    @property
    def fallbacks(self) -> int:
        return sum(self.failures.values())

    def thought(self, slots: dict[str, str]) -> str | None:
        if self._consecutive >= self.config.max_consecutive_failures:
            self.failures["gave_up"] += 1
            return None
        self.calls += 1
        try:
            reply = self._ask(self.config.prompt.format(**slots))
        except Exception as err:  # any endpoint problem means: use the template
            return self._fail(f"endpoint:{type(err).__name__}")
        text = " ".join(reply.split())
        if not text:
            return self._fail("empty")
        if len(text) > self.config.max_chars:
            return self._fail("too_long")
        if any(tag in text for tag in TAGS):
            return self._fail("has_tags")
        self._consecutive = 0
        self.used += 1
        return text

    def _fail(self, reason: str) -> None:
        self._consecutive += 1
        self.failures[reason] += 1
        return None

    def _ask(self, prompt: str) -> str:
        return self.client.complete(prompt).text

    def stats(self) -> dict[str, Any]:
        return {"calls": self.calls, "used": self.used, "fallbacks": self.fallbacks, "failures": dict(self.failures)}
