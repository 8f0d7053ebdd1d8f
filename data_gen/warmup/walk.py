"""The walk along gold paths that makes one verified record per question (`WarmupGenerator`): gold
records, error corrections, relation-filter pages, multi-topic routes, the teacher's rewrite."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from data_gen.warmup.config import WarmupConfig
from data_gen.warmup.teacher import Teacher
from data_gen.warmup.templates import DEFAULT_TEMPLATES
from data_gen.warmup.writer import Route, Skip, Step, TrajectoryWriter, relation_words, shuffle_blocks
from kgreasoner.kg.base import KnowledgeGraph, execute_path, follow
from kgreasoner.protocol import (
    ANSWER_SEPARATOR,
    BACKTRACK_MARK,
    QUERY_SEPARATOR,
    RELATIONS_MARK,
    TOPIC_SEPARATOR,
    ToolResult,
    check_format,
    parse_trajectory,
    topic_names,
)
from kgreasoner.records.ids import INVERSE_PREFIX, is_literal_id
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample
from kgreasoner.records.trajectories import Segment, WarmupRecord
from kgreasoner.retrieval.tool import KGSearchTool


class WarmupGenerator:
    """Makes verified warm-up records for QA examples over one KG with one tool configuration.

    Each question is walked on `kg.for_example(example.id)`: the KG itself, or in a per-question
    KG (RoG's subgraphs) the question's own subgraph.
    """

    def __init__(
        self,
        kg: KnowledgeGraph,
        tool: KGSearchTool,
        config: WarmupConfig,
        templates: dict[str, tuple[str, ...]] | None = None,
        teacher: Teacher | None = None,
    ) -> None:
        self.kg = kg
        self.tool = tool
        self.config = config
        self.templates = templates or dict(DEFAULT_TEMPLATES)
        self.teacher = teacher
        self.stats: Counter[str] = Counter()
        self._gold_cache: dict[str, tuple[set[str], set[str]]] = {}
        self._reach_cache: dict[tuple[str, str, tuple[str, ...]], bool] = {}

    # --- gold answers ---
    def gold(self, example: QAExample) -> tuple[set[str], set[str]]:
        """(answer ids, normalised answer names/aliases/ids) of an example."""
        if example.id not in self._gold_cache:
            ids = {a.id for a in example.answers}
            forms = {normalize_answer(f) for a in example.answers for f in a.surface_forms()}
            self._gold_cache[example.id] = (ids, {f for f in forms if f})
        return self._gold_cache[example.id]

    def is_gold(self, example: QAExample, entity: str) -> bool:
        ids, forms = self.gold(example)
        return entity in ids or normalize_answer(self.kg.for_example(example.id).label(entity)) in forms

    def reaches_gold(self, example: QAExample, entity: str, rest: Sequence[str]) -> bool:
        """True when following `rest` from `entity` gives a gold answer (cached per question)."""
        if not rest:
            return self.is_gold(example, entity)
        key = (example.id, entity, tuple(rest))
        if key not in self._reach_cache:
            reached = execute_path(self.kg.for_example(example.id), entity, rest)
            self._reach_cache[key] = any(self.is_gold(example, e) for e in reached)
        return self._reach_cache[key]

    def route(self, example: QAExample) -> tuple[Route, ...]:
        """The route(s) to walk: one gold path from a topic entity, or for a multi-topic question
        (`intersect`) each topic entity's own path, in order."""
        if not example.gold_paths:
            raise Skip("no_gold_path")
        if example.intersect:
            routes = tuple(Route(t, tuple(p)) for t, p in zip(example.topic_entities, example.gold_paths))
            if not all(r.path and self.reaches_gold(example, r.topic.id, r.path) for r in routes):
                raise Skip("gold_path_misses_answers")
            return routes
        for path in example.gold_paths:
            for topic in example.topic_entities:
                if path and self.reaches_gold(example, topic.id, path):
                    return (Route(topic, tuple(path)),)
        raise Skip("gold_path_misses_answers")

    # --- records ---
    def make(self, example: QAExample, correction: bool) -> WarmupRecord:
        """One verified record; a correction when asked and possible (else gold, counted). Raises Skip."""
        route = self.route(example)
        rng = random.Random(f"{self.config.seed}|{example.id}|gold")
        gold_writer = self.walk(example, route, rng, detour_at=None)
        made = self.correction(example, route, gold_writer.picks) if correction else None
        record, writer = made or (self.verify(example, gold_writer, "gold"), gold_writer)
        self.stats["repeated_searches"] += writer.repeats
        self.stats["first_shown_dead_ends"] += writer.dead_ends
        if writer.backtrack_outcome:
            self.stats[f"backtrack_output:{writer.backtrack_outcome}"] += 1
        if self.teacher is not None:
            record = self.teach(example, record, writer)
        if self.config.shuffle_triples:
            record = shuffle_blocks(
                record,
                writer.units,
                random.Random(f"{self.config.seed}|{example.id}|shuffle"),
                {h for h, _ in writer.session.shown_entities() if h},
            )
        return record

    def teach(self, example: QAExample, record: WarmupRecord, writer: TrajectoryWriter) -> WarmupRecord:
        """The record with each template thought replaced by the teacher's, where the teacher gave one.

        Thoughts never change what is searched, so they are written after the walk, only for the
        record that is kept; a rewritten record that fails verification keeps its templates.
        """
        assert self.teacher is not None
        segments = list(record.segments)
        handle_note = (
            " (write the handle, e.g. E3, for an entity that has one)" if self.tool.config.entity_handles else ""
        )
        for index, offset, hint, action in writer.thoughts:
            text = segments[index].text
            written = self.teacher.thought(
                {
                    "question": example.question,
                    "topics": TOPIC_SEPARATOR.join(topic_names(example.topic_entities)),
                    "trajectory": "".join(s.text for s in segments[:index]) + text[:offset],
                    "action": action,
                    "hint": hint,
                    "handle_note": handle_note,
                }
            )
            if written is not None:
                segments[index] = Segment(text[:offset] + written + text[offset + len(hint) :], True)
        taught = WarmupRecord(**{**record.__dict__, "segments": tuple(segments)})
        try:
            return self.verify(example, writer, record.kind, taught.segments)
        except Skip:
            self.stats["teacher_record_rejected"] += 1
            return record

    def correction(
        self, example: QAExample, route: tuple[Route, ...], places: int
    ) -> tuple[WarmupRecord, TrajectoryWriter] | None:
        """A verified correction record, or None (counted) when no hop allows one.

        Hops are tried in a seeded order; the first whose backtrack shows new triples of the
        entity the detour left wins. Without one, the first that worked at all is used: in small
        KGs the entity's neighbours were all shown already, so the tool climbs to an ancestor or
        says nothing is left — real outputs the model also meets.
        """
        order = list(range(places))
        random.Random(f"{self.config.seed}|{example.id}|places").shuffle(order)
        reasons: list[str] = []
        fallback: tuple[WarmupRecord, TrajectoryWriter] | None = None
        for attempt, place in enumerate(order):
            try:
                writer = self.walk(
                    example, route, random.Random(f"{self.config.seed}|{example.id}|fix|{attempt}"), detour_at=place
                )
                record = self.verify(example, writer, "correction")
            except Skip as skip:
                reasons.append(skip.reason)
                continue
            if writer.backtrack_outcome == "parent":
                fallback = (record, writer)
                break
            fallback = fallback or (record, writer)
        if fallback is None:
            self.stats["correction_fell_back_to_gold"] += 1
            for reason in sorted(set(reasons)):
                self.stats[f"correction_failed:{reason}"] += 1
            return None
        return fallback

    def walk(
        self, example: QAExample, routes: tuple[Route, ...], rng: random.Random, detour_at: int | None
    ) -> TrajectoryWriter:
        """Search along the route(s); with `detour_at`, take a wrong entity at that step and backtrack.

        Where the gold continuation is not among the triples shown, the entity is searched again with
        the relation filter (`NAME | REL`, the relation its `more:` line lists) for its next page, after
        listing its other relations (`NAME | relations`) while the listing does not name the gold one.
        A multi-topic question walks each topic's route in turn; every route but the first must end
        at an answer an earlier route's last search showed, and that shared entity is the answer.
        """
        w = TrajectoryWriter(self, example, routes[0], rng)
        step_index = 0
        shared: set[str] | None = None
        current = routes[0].topic.id
        w.think(
            w.template("start", entity=w.ref(current), need=w.need(current, w.step_relations(current, 0))),
            f"search {w.query(current)}",
        )
        result = w.search_entity(current)
        for number, route in enumerate(routes):
            w.route, w.allowed = route, shared
            path = route.path
            current, hop = route.topic.id, 0
            while True:
                options = w.steps(current, hop)
                while not options:
                    result = self.page(w, current, hop, result)
                    options = w.steps(current, hop)
                chosen = self.choose(w, options)
                w.picks += 1
                lead = ""
                dead_end = self.first_shown_dead_end(w, current, hop, options)
                if dead_end is not None:
                    w.dead_ends += 1
                    lead = self.detour(w, current, hop, options, chosen, pick=dead_end)
                    options = w.steps(current, hop)
                    chosen = self.choose(w, options)
                elif detour_at == step_index:
                    lead = self.detour(w, current, hop, options, chosen)
                    options = w.steps(current, hop)  # the backtrack may have shown more; the chosen one stays valid
                hop_after = hop + len(chosen.relations)
                fact = w.fact(chosen)
                hop_text = w.hop(chosen)
                line = w.line(chosen)
                first = (
                    w.template("recover", entity=w.ref(current), fact=fact, hop=hop_text, line=line)
                    if lead
                    else w.template("fact", fact=fact, hop=hop_text, line=line)
                )
                step_index += 1
                if hop_after == len(path) and number + 1 < len(routes):
                    finals = {s.target for s in options if hop + len(s.relations) == len(path)}
                    shared = finals if shared is None else shared & finals
                    topic = routes[number + 1].topic.id
                    w.route = routes[number + 1]
                    hint = (
                        first
                        + " "
                        + w.template("joint", entity=w.ref(topic), need=w.need(topic, w.step_relations(topic, 0)))
                    )
                    w.think(hint, f"search {w.query(topic)}")
                    result = w.search_entity(topic)
                    break
                if hop_after == len(path):
                    answers = [chosen.target]
                    if self.config.answer_mode == "all":
                        answers = list(
                            dict.fromkeys(answers + [s.target for s in options if hop + len(s.relations) == len(path)])
                        )
                    answer_text = f" {ANSWER_SEPARATOR} ".join(w.ref(a) for a in answers)
                    final = w.template("final", answer=answer_text)
                    if len(routes) > 1:
                        final = w.template("common", answer=answer_text) + " " + final
                    w.think(first + " " + final, f"answer {answer_text}")
                    w.finish(answers)
                    break
                next_relations = w.step_relations(chosen.target, hop_after)
                hint = (
                    first
                    + " "
                    + w.template("next", entity=w.ref(chosen.target), need=w.need(chosen.target, next_relations))
                )
                w.think(hint, f"search {w.query(chosen.target)}")
                result = w.search_entity(chosen.target)
                current, hop = chosen.target, hop_after
        if detour_at is not None and w.backtracks == w.dead_ends:
            raise Skip("detour_not_taken")
        return w

    def page(self, w: TrajectoryWriter, current: str, hop: int, result: ToolResult) -> ToolResult:
        """The next page of `current`'s lines by the hop's relation (`NAME | REL`), when its last result lists
        unseen ones by it, or the next listing of its relations (`NAME | relations`), when that result does not
        name the relation but leaves some unnamed; each counts against `max_repeats`. Else Skip."""
        if result.error is not None:
            raise Skip(f"gold_not_shown:{result.error}")
        relation = w.route.path[hop]
        wanted = w.session.filter_name(current, relation.removeprefix(INVERSE_PREFIX))
        listed = wanted in dict(result.more)
        if not listed and not result.unlisted:
            raise Skip("gold_not_shown")
        if w.repeats >= self.config.max_repeats:
            raise Skip("gold_not_shown:max_repeats")
        w.repeats += 1
        need = w.need(current, w.step_relations(current, hop))
        if not listed:
            w.think(
                w.template("list", entity=w.ref(current), need=need),
                f"search {w.query(current)} {QUERY_SEPARATOR} {RELATIONS_MARK}",
            )
            return w.search_entity(current, relation=RELATIONS_MARK)
        hint = w.template("again", entity=w.ref(current), need=need, relation=wanted)
        w.think(hint, f"search {w.query(current)} {QUERY_SEPARATOR} {wanted}")
        return w.search_entity(current, relation=wanted)

    def choose(self, w: TrajectoryWriter, options: list[Step]) -> Step:
        """The question's own witness entity if shown, else the first shown; by name only an unambiguous one."""
        if not self.tool.config.entity_handles:
            options = [s for s in options if w.unique_label(s.target)]
            if not options:
                raise Skip("namesakes_shown")
        if self.config.pick == "first_shown":
            return options[0]
        witness = set(w.example.extra.get("path_entities") or [])
        return next((s for s in options if s.target in witness), options[0])

    def first_shown_dead_end(self, w: TrajectoryWriter, current: str, hop: int, options: list[Step]) -> Step | None:
        """With `pick: first_shown`, the first entity shown by the gold relation from `current` when it
        reaches no answer because it lacks the next gold relation in the KB (not merely another answer),
        is named and was not searched yet; else None."""
        path = w.route.path
        if self.config.pick != "first_shown" or hop + 1 >= len(path):
            return None
        shown = list(dict.fromkeys(w.forward.get((current, path[hop]), [])))
        if not shown or shown[0] in {s.target for s in options}:
            return None
        first = shown[0]
        if (
            first in w.searched
            or is_literal_id(first)
            or w.kg.is_unnamed(first)
            or self.is_gold(w.example, first)
            or follow(w.kg, [first], path[hop + 1])
        ):
            return None
        return Step(current, (path[hop],), first)

    def detour(
        self, w: TrajectoryWriter, current: str, hop: int, options: list[Step], chosen: Step, pick: Step | None = None
    ) -> str:
        """Search a wrong shown entity (`pick`, else one chosen here), say why it does not fit, backtrack;
        returns the text so far."""
        path = w.route.path
        first_shown = pick is not None
        if first_shown:
            siblings = [pick]
        else:
            valid = {s.target for s in options}
            wrong = [
                s
                for s in w.neighbours(current)
                if s.target not in valid
                and s.target not in w.searched
                and s.target != current
                and not is_literal_id(s.target)
                and not w.kg.is_unnamed(s.target)
                and not self.is_gold(w.example, s.target)
                and (self.tool.config.entity_handles or w.unique_label(s.target))
            ]
            if not wrong:
                raise Skip("no_wrong_entity")
            # A sibling by the same relation that does not continue the path is the most plausible mistake.
            siblings = [s for s in wrong if s.relations == chosen.relations]
            pick = siblings[0] if siblings else w.rng.choice(wrong[:3])
        need = w.need(current, chosen.relations)
        rest = hop + len(chosen.relations)
        if first_shown:
            # Following the first matching line is the policy, not a mistake: the thought is the one of any hop.
            ahead = w.template("next", entity=w.ref(pick.target), need=w.need(pick.target, path[rest : rest + 1]))
            thought = w.template("fact", fact=w.fact(pick), hop=w.hop(pick), line=w.line(pick)) + " " + ahead
        else:
            thought = w.template(
                "detour",
                wrong=w.ref(pick.target),
                wrong_fact=w.fact(pick),
                wrong_hop=w.hop(pick),
                wrong_line=w.line(pick),
            )
        w.think(thought, f"search {w.query(pick.target)}")
        result = w.search_entity(pick.target)
        if result.error is not None:
            notice = w.template("notice_empty", wrong=w.ref(pick.target))
        elif siblings and rest < len(path):
            if w.steps(pick.target, rest):
                raise Skip("sibling_continues")
            notice = w.template(
                "notice_dead_end",
                wrong=w.ref(pick.target),
                next_relation=relation_words(path[rest : rest + 1]),
                next_key=w.relation_key(path[rest]),
            )
        else:
            notice = w.template(
                "notice_relation",
                wrong=w.ref(pick.target),
                wrong_relation=relation_words(pick.relations),
                need=need,
                entity=w.ref(current),
            )
        w.think(notice, f"search {w.query(pick.target)} {QUERY_SEPARATOR} {BACKTRACK_MARK}")
        back = w.search_entity(pick.target, backtrack=True)
        if back.error is not None:
            w.backtrack_outcome = f"error:{back.error}"
        else:
            w.backtrack_outcome = "parent" if back.entity == current else "ancestor"
        return notice

    def verify(
        self, example: QAExample, writer: TrajectoryWriter, kind: str, segments: Sequence[Segment] | None = None
    ) -> WarmupRecord:
        """The record of `writer` (or `segments` written in its session), if its format is valid, its answers
        resolve in that session to gold answers and it holds exactly the backtracks the walk made (one
        when a correction, plus one per `first_shown` dead end); else Skip."""
        segments = writer.segments if segments is None else segments
        session = writer.session
        record = WarmupRecord(
            id=example.id,
            question=example.question,
            topic_entities=tuple(example.topic_entities),
            segments=tuple(segments),
            kind=kind,
            hops=example.hops,
            split=example.split,
        )
        completion = record.completion
        report = check_format(completion)
        if not report.valid:
            raise Skip(f"invalid_format:{report.errors[0]}")
        parsed = parse_trajectory(completion)
        if parsed.answer_text is None:
            raise Skip("no_answer")
        _, forms = self.gold(example)
        answers = session.resolve_answer(parsed.answer_text)
        if not answers or not all(normalize_answer(a) in forms for a in answers):
            raise Skip("answer_not_gold")
        backtracks = sum(1 for s in parsed.searches if s.is_backtrack)
        if backtracks != writer.backtracks or backtracks != writer.dead_ends + (kind == "correction"):
            raise Skip("backtrack_count")
        return record
