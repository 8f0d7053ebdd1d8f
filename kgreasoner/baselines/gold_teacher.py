"""The gold-path teacher: rules for `ScriptedLLM` that answer the baselines' prompts from each
question's gold path.

A deterministic teacher built from gold paths, not a model. The rules read the prompt (its last
`Question:` line names the example), look at the gold relation path and the KG, and write the
reply a perfect LLM would write for that step. They answer only from what the prompt shows
(relations listed, candidates listed, triplets or tables retrieved), so a baseline that fails to
retrieve the answer fails. Used by the tests (wrapped in a `ScriptedLLM`), to drive each
baseline's control flow exactly, and by `data_gen/pipeline_sft.py`, to write SFT data for every LLM
step of ToG and SoG (the same-backbone comparison).
"""

from __future__ import annotations

import json
import re

from kgreasoner.kg.base import KnowledgeGraph, follow
from kgreasoner.records.ids import INVERSE_PREFIX
from kgreasoner.records.schema import QAExample


def _plain(relation: str) -> str:
    return relation[len(INVERSE_PREFIX) :] if relation.startswith(INVERSE_PREFIX) else relation


def _section(prompt: str, start: str, end: str) -> list[str]:
    """Non-empty lines between the last `start` line and the next `end` line."""
    head = prompt.rsplit(start, 1)[1]
    body = head.split(end, 1)[0]
    return [line.strip() for line in body.splitlines() if line.strip()]


class GoldTeacher:
    """Per-question gold knowledge: path, frontiers, answer labels."""

    def __init__(self, kg: KnowledgeGraph, examples: list[QAExample], sog_frontier_cap: int = 3) -> None:
        self.kg = kg
        self.by_question = {e.question: e for e in examples}
        self.sog_frontier_cap = sog_frontier_cap

    def example(self, prompt: str) -> QAExample:
        question = re.findall(r"^Question: (.*)$", prompt, re.MULTILINE)[-1]
        return self.by_question[question]

    def frontiers(self, example: QAExample) -> list[list[str]]:
        frontier, out = [example.topic_entities[0].id], []
        for relation in example.gold_paths[0]:
            out.append(frontier)
            frontier = sorted(follow(self.kg, frontier, relation))
        out.append(frontier)
        return out

    def answer_labels(self, example: QAExample) -> list[str]:
        return [a.name for a in example.answers]

    # ---- ToG
    def tog(self, prompt: str) -> str | None:
        example = self.example(prompt)
        gold = {_plain(r) for r in example.gold_paths[0]}
        if prompt.rstrip().endswith("Choices:"):
            relations = _section(prompt, "Relations:\n", "Choices:")
            return "\n".join(f"{{{r}}} (score: 1.0)" for r in relations if r in gold)
        if prompt.rstrip().endswith("Scores:"):
            on_path = {self.kg.label(e) for f in self.frontiers(example)[1:] for e in f}
            candidates = _section(prompt, "Candidates:\n", "Scores:")
            return "\n".join(f"{{{c}}} (score: {1.0 if c in on_path else 0.0})" for c in candidates)
        triplets = self._triplets(prompt)
        last = _plain(example.gold_paths[0][-1])
        found = [x for x in self.answer_labels(example) if any(r == last and x in (h, t) for h, r, t in triplets)]
        if prompt.rstrip().endswith("Enough?"):
            return "{Yes}. The triplets name the answer." if found else "{No}. More is needed."
        if prompt.rstrip().endswith("Reply:"):
            return "From the triplets. Answer: {" + " | ".join(found or ["unknown"]) + "}"
        return None

    @staticmethod
    def _triplets(prompt: str) -> list[tuple[str, str, str]]:
        out = []
        for line in prompt.split("Knowledge triplets:", 1)[-1].splitlines():
            parts = line.strip()[1:-1].split(", ") if line.strip().startswith("(") else []
            if len(parts) == 3:
                out.append((parts[0], parts[1], parts[2]))
        return out

    # ---- SoG
    def sog(self, prompt: str) -> str | None:
        if "search(entity, direction, properties_to_filter_for)" not in prompt:
            return None
        example = self.example(prompt)
        calls = []
        for relation, frontier in zip(example.gold_paths[0], self.frontiers(example)):
            direction = "incoming" if relation.startswith(INVERSE_PREFIX) else "outgoing"
            # Only entities the transcript has shown (or the topic), as a real LLM would.
            shown = [e for e in frontier if f"| {e} |" in prompt or f"({e})" in prompt]
            calls += [(e, direction, _plain(relation)) for e in shown[: self.sog_frontier_cap]]
        done = prompt.count("\nObservation:\n")
        if done < len(calls):
            entity, direction, relation = calls[done]
            return f'I follow {relation}.\nAction: search("{entity}", "{direction}", ["{relation}"])'
        seen = prompt.split("Observation:", 1)[-1]
        found = [x for x in self.answer_labels(example) if f"| {x} |" in seen]
        return "Final answer: {" + " | ".join(found or ["unknown"]) + "}"

    # ---- PaRoG
    def parog(self, prompt: str) -> str | None:
        example = self.example(prompt)
        path = example.gold_paths[0]
        end = prompt.rstrip().rsplit("\n", 1)[-1]
        if end == "Sub-objectives:":
            return json.dumps([f"step {i + 1}: follow {r}" for i, r in enumerate(path)])
        if end == "Tentative answers:":
            return json.dumps([{"A": "Wrong Guess", "R": "a guess"} for _ in path])
        if end == "Selection:" and "Relations:" in prompt:
            sub_objective = re.search(r"Sub-objective: step \d+: follow (\S+)", prompt)
            if sub_objective is None:  # the teacher's own sub-objectives name the relation to follow
                raise ValueError(
                    "gold teacher: a PaRoG relation prompt without a 'Sub-objective: step N: follow R' line"
                )
            wanted = sub_objective.group(1)
            options = _section(prompt, "Relations:\n", "Selection:")
            return json.dumps({"relations": [r for r in options if r == wanted]})
        if end == "Selection:":
            return json.dumps({"entities": _section(prompt, "Candidates:\n", "Selection:")})
        if end == "Refined answer:":
            return json.dumps({"A": "Wrong Guess", "R": "my tentative answer stands"})
        if end == "Final answer:":
            return json.dumps({"A": "Wrong Guess", "R": "no idea"})
        return None

    # ---- io
    def io(self, prompt: str) -> str | None:
        return "Answer: {" + self.answer_labels(self.example(prompt))[0] + "}"
