"""The JSON files in the data/ folder of the ToG repository (IDEA-FinAI/ToG), as QA examples.

Each file is a JSON array of records with the question under `question` (WebQSP: `RawQuestion`,
else `ProcessedQuestion`) and `topic_entity` as `{mid: name}`. The answers sit where each
benchmark puts them:

- CWQ (`cwq.json`): `answer`, one name; the original release's `answers`
  `[{answer, answer_id, aliases}]` is read too.
- WebQSP (`WebQSP.json`): `Parses[*].Answers[*]` with `AnswerArgument` (a mid, or a value when
  `EntityName` is null) and `EntityName`; each parse's `InferentialChain` is a gold path.
- GrailQA (`grailqa.json`, spelt `graliqa.json` in the repository):
  `answer[*].{answer_argument, entity_name}` (no `entity_name` for values).
- SimpleQuestions (`SimpleQA.json`): `answer`, one name.

Value answers (dates, numbers) get literal ids in N-Triples form, as the KG layer writes them.
These files hold the benchmarks' test questions, so examples are marked `split="test"`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from kgreasoner.records.ids import make_literal
from kgreasoner.records.schema import Answer, DuplicateKeyError, QAExample, SchemaError, TopicEntity, load_json

logger = logging.getLogger(__name__)

# format key -> the `source` written on its examples
TOG_FORMATS: dict[str, str] = {"cwq": "CWQ", "webqsp": "WebQSP", "grailqa": "GrailQA", "simpleqa": "SimpleQuestions"}
# ToG's file names (lower-cased) -> format key
TOG_FILES: dict[str, str] = {
    "cwq.json": "cwq",
    "webqsp.json": "webqsp",
    "grailqa.json": "grailqa",
    "graliqa.json": "grailqa",
    "simpleqa.json": "simpleqa",
}
QUESTION_FIELDS = ("question", "RawQuestion", "ProcessedQuestion")
# SimpleQA records have no id: they are numbered by position.
_ID_FIELDS = {"cwq": "ID", "webqsp": "QuestionId", "grailqa": "qid", "simpleqa": None}


def detect_tog_format(record: Any, path: str | Path | None = None) -> str:
    """The format key of a file: from ToG's file name when it is one, else from a record's shape."""
    if path is not None and Path(path).name.lower() in TOG_FILES:
        return TOG_FILES[Path(path).name.lower()]
    if isinstance(record, dict):
        if "Parses" in record:
            return "webqsp"
        if isinstance(record.get("answer"), list):
            return "grailqa"
        if isinstance(record.get("answers"), list):
            return "cwq"
        if isinstance(record.get("answer"), str):
            # ToG's SimpleQA records carry the (short) relation name; its CWQ records do not.
            return "simpleqa" if "relation" in record else "cwq"
    raise SchemaError(
        f"{path or '<records>'}: cannot tell the ToG format from the first record; pass fmt=one of {list(TOG_FORMATS)}"
    )


def parse_tog_record(
    record: Any, fmt: str, index: int, file: str | Path = "<records>", split: str = "test"
) -> QAExample | None:
    """One record as a QAExample, or None when its answer list is empty (nothing to score).

    A missing or mistyped field raises SchemaError naming the file, the record index and the field.
    """
    if fmt not in TOG_FORMATS:
        raise ValueError(f"unknown ToG format {fmt!r}; known: {list(TOG_FORMATS)}")
    where = f"{file}: record {index}"
    if not isinstance(record, dict):
        raise SchemaError(f"{where}: expected a JSON object, got {type(record).__name__}")
    source = TOG_FORMATS[fmt]
    question = next((record[f] for f in QUESTION_FIELDS if f in record), None)
    if question is None:
        raise SchemaError(f"{where}: missing field 'question' (or {', '.join(QUESTION_FIELDS[1:])})")
    if not isinstance(question, str) or not question.strip():
        raise SchemaError(f"{where}: field 'question' must be a non-empty string")
    topics = _topics(record_field(record, "topic_entity", dict, where), where)
    gold_paths: tuple[tuple[str, ...], ...] = ()
    if fmt == "cwq":
        answers = cwq_answers(record, where)
    elif fmt == "webqsp":
        answers, gold_paths = webqsp_answers(record, where)
    elif fmt == "grailqa":
        answers = _grailqa_answers(record, where)
    else:
        answers = _single_answer(record, where)
    if not answers:
        return None
    raw_id = record.get(_ID_FIELDS[fmt]) if _ID_FIELDS[fmt] else None
    return QAExample(
        id=str(raw_id) if raw_id not in (None, "") else f"{source}-{index:06d}",
        question=question.strip(),
        topic_entities=topics,
        answers=tuple(answers),
        gold_paths=gold_paths,
        hops=min((len(p) for p in gold_paths), default=0),
        source=source,
        split=split,
    )


def load_tog_json(path: str | Path, fmt: str | None = None, split: str = "test") -> list[QAExample]:
    """Every answerable record of a ToG JSON file (a list, or WebQSP's `{"Questions": [...]}`)."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as handle:
            data = load_json(handle)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
    except DuplicateKeyError as err:
        raise SchemaError(f"{path}: {err}") from None
    if isinstance(data, dict) and isinstance(data.get("Questions"), list):
        data = data["Questions"]
    if not isinstance(data, list):
        raise SchemaError(f"{path}: expected a JSON array of records, got {type(data).__name__}")
    if not data:
        return []
    fmt = fmt or detect_tog_format(data[0], path)
    examples, unanswered = [], []
    for index, record in enumerate(data):
        example = parse_tog_record(record, fmt, index, path, split)
        if example is None:
            unanswered.append(index)
        else:
            examples.append(example)
    if unanswered:
        logger.warning(
            "%s: skipped %d record(s) with no answers (first: record %d)", path, len(unanswered), unanswered[0]
        )
    return examples


def record_field(record: dict, name: str, kind: type, where: str) -> Any:
    """`record[name]`; a missing field or one that is not a `kind` raises SchemaError naming `where` and the field."""
    if name not in record:
        raise SchemaError(f"{where}: missing field '{name}'")
    if not isinstance(record[name], kind):
        raise SchemaError(f"{where}: field '{name}' must be a {kind.__name__}, got {type(record[name]).__name__}")
    return record[name]


def _topics(mapping: dict, where: str) -> tuple[TopicEntity, ...]:
    if not mapping:
        raise SchemaError(f"{where}: field 'topic_entity' is empty")
    topics = []
    for mid, name in mapping.items():
        if not mid or not (name is None or isinstance(name, str)):
            raise SchemaError(f"{where}: field 'topic_entity' must map ids to names, got {mid!r}: {name!r}")
        topics.append(TopicEntity(id=mid, name=name or mid))
    return tuple(topics)


def _entity_or_value(argument: Any, name: Any, where: str, field: str) -> Answer:
    """An entity answer (id + name) or, with no name, a value answer with a literal id."""
    if not isinstance(argument, (str, int, float)) or argument == "":
        raise SchemaError(f"{where}: field '{field}' must be a non-empty string, got {argument!r}")
    argument = str(argument)
    if isinstance(name, str) and name:
        return Answer(id=argument, name=name)
    return Answer(id=make_literal(argument), name=argument)


def _dedup(answers: list[Answer]) -> list[Answer]:
    """First occurrence of each id: WebQSP parses repeat the same answers."""
    first: dict[str, Answer] = {}
    for answer in answers:
        first.setdefault(answer.id, answer)
    return list(first.values())


def cwq_answers(record: dict, where: str) -> list[Answer]:
    """A CWQ record's answers: the release's `answers` list (ids, names, aliases), else ToG's one `answer` name."""
    if "answers" in record and "answer" not in record:
        answers = []
        for i, item in enumerate(record_field(record, "answers", list, where)):
            field = f"answers[{i}]"
            if not isinstance(item, dict) or not isinstance(item.get("answer"), str) or not item["answer"]:
                raise SchemaError(f"{where}: field '{field}.answer' must be a non-empty string")
            aliases = item.get("aliases") or []
            if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
                raise SchemaError(f"{where}: field '{field}.aliases' must be a list of strings")
            answers.append(
                Answer(id=str(item.get("answer_id") or item["answer"]), name=item["answer"], aliases=tuple(aliases))
            )
        return _dedup(answers)
    return _single_answer(record, where)


def _single_answer(record: dict, where: str) -> list[Answer]:
    """ToG's CWQ and SimpleQA give one answer name and no id: the name is the id."""
    name = record_field(record, "answer", str, where)
    return [Answer(id=name, name=name)] if name else []


def webqsp_answers(record: dict, where: str) -> tuple[list[Answer], tuple[tuple[str, ...], ...]]:
    """A WebQSP record's answers over all its parses and the distinct inferential chains (gold relation paths)."""
    answers: list[Answer] = []
    paths: list[tuple[str, ...]] = []
    for p, parse in enumerate(record_field(record, "Parses", list, where)):
        if not isinstance(parse, dict):
            raise SchemaError(f"{where}: field 'Parses[{p}]' must be an object")
        for a, item in enumerate(record_field(parse, "Answers", list, f"{where}: Parses[{p}]")):
            field = f"Parses[{p}].Answers[{a}]"
            if not isinstance(item, dict) or "AnswerArgument" not in item:
                raise SchemaError(f"{where}: missing field '{field}.AnswerArgument'")
            answers.append(
                _entity_or_value(item["AnswerArgument"], item.get("EntityName"), where, f"{field}.AnswerArgument")
            )
        chain = parse.get("InferentialChain")
        if chain is not None:
            if not isinstance(chain, list) or not all(isinstance(r, str) and r for r in chain):
                raise SchemaError(f"{where}: field 'Parses[{p}].InferentialChain' must be a list of relation strings")
            if chain and tuple(chain) not in paths:
                paths.append(tuple(chain))
    return _dedup(answers), tuple(paths)


def _grailqa_answers(record: dict, where: str) -> list[Answer]:
    answers = []
    for a, item in enumerate(record_field(record, "answer", list, where)):
        field = f"answer[{a}]"
        if not isinstance(item, dict) or "answer_argument" not in item:
            raise SchemaError(f"{where}: missing field '{field}.answer_argument'")
        answers.append(
            _entity_or_value(item["answer_argument"], item.get("entity_name"), where, f"{field}.answer_argument")
        )
    return _dedup(answers)
