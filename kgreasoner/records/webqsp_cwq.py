"""The official WebQSP and ComplexWebQuestions (CWQ) releases, with their training splits.

- WebQSP (`WebQSP.train.json`, `WebQSP.test.json`): `{"Version", "FreebaseVersion", "Questions":
  [...]}`; each question has `QuestionId`, `RawQuestion` and `Parses`, and each parse a
  `TopicEntityMid` / `TopicEntityName`, an `InferentialChain` (a gold path, or null) and `Answers`
  (`AnswerArgument` a mid, or a value when `AnswerType` is `Value`). The topic entities are the
  distinct topics of the parses; answers and gold paths are the union over the parses.
- CWQ (`ComplexWebQuestions_train.json`, `_dev.json`, `_test.json`): a list of `{ID, question,
  sparql, answers: [{answer, answer_id, aliases}], ...}`. The release names no topic entity, so the
  topic entities are the Freebase constants (`ns:m.…`, `ns:g.…`) of the record's `sparql`, in order
  of first appearance; it gives no names for them either, so each is named by its mid here, and
  by the Freebase KG's name once one is open (`kgreasoner.data.entity_names`). CWQ has no gold
  relation paths.

Each example's split (train/dev/test) comes from its file's name. Records with no answer or no
topic entity cannot be trained or scored: they are skipped, and the count is logged.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from kgreasoner.records.schema import DuplicateKeyError, QAExample, SchemaError, TopicEntity, load_json
from kgreasoner.records.tog_json import cwq_answers, record_field, webqsp_answers

logger = logging.getLogger(__name__)

# Words of a release file's name -> the split its records are in.
SPLIT_WORDS = {"train": "train", "dev": "dev", "validation": "dev", "valid": "dev", "val": "dev", "test": "test"}
# A Freebase constant in a SPARQL query: `ns:m.0abc` (or a newer `ns:g.…` id).
_FREEBASE_CONSTANT = re.compile(r"\bns:([mg]\.[0-9A-Za-z_]+)")


def split_from_filename(path: str | Path) -> str:
    """`train`, `dev` or `test`, from the words of a file name (`WebQSP.train.json`, `validation-0.parquet`).

    Raises ValueError when the name has none of them, or more than one split.
    """
    words = re.split(r"[^a-z]+", Path(path).name.lower())
    found = {SPLIT_WORDS[w] for w in words if w in SPLIT_WORDS}
    if len(found) != 1:
        what = "no split word" if not found else f"several splits ({', '.join(sorted(found))})"
        raise ValueError(f"{path}: the file name has {what}; name it with one of train, dev (or validation), test")
    return found.pop()


def is_webqsp_release(data: Any) -> bool:
    """True for the official WebQSP file's top level (ToG's WebQSP.json adds `topic_entity` to each question)."""
    if not isinstance(data, dict) or not isinstance(data.get("Questions"), list):
        return False
    first = data["Questions"][0] if data["Questions"] else {}
    return isinstance(first, dict) and "topic_entity" not in first


def is_cwq_release(data: Any) -> bool:
    """True for the official CWQ file (a list of records with `sparql` and no `topic_entity`)."""
    return (
        isinstance(data, list)
        and bool(data)
        and isinstance(data[0], dict)
        and "sparql" in data[0]
        and "topic_entity" not in data[0]
    )


def read_json(path: str | Path) -> Any:
    """The parsed file; invalid JSON raises SchemaError naming the file and line."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as handle:
            return load_json(handle)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
    except DuplicateKeyError as err:
        raise SchemaError(f"{path}: {err}") from None


def load_webqsp(path: str | Path, split: str | None = None, data: Any = None) -> list[QAExample]:
    """Every usable question of an official WebQSP file; `split` defaults to the file name's.

    `data` is the already parsed file, when the caller has read it.
    """
    path = Path(path)
    split = split or split_from_filename(path)
    data = read_json(path) if data is None else data
    if not is_webqsp_release(data):
        raise SchemaError(
            f'{path}: expected the WebQSP release\'s top level {{"Version", "FreebaseVersion", "Questions": [...]}}'
        )
    return _parse_all(data["Questions"], parse_webqsp_question, path, split)


def _parse_all(records: list, parse, path: Path, split: str) -> list[QAExample]:
    """Every record parsed; the ones `parse` skips (None) are counted in one warning."""
    examples, skipped = [], []
    for index, record in enumerate(records):
        example = parse(record, index, path, split)
        if example is None:
            skipped.append(index)
        else:
            examples.append(example)
    _log_skipped(path, skipped)
    return examples


def parse_webqsp_question(record: Any, index: int, path: str | Path, split: str) -> QAExample | None:
    """One WebQSP question, or None when no parse has a topic entity or an answer."""
    where = f"{path}: Questions[{index}]"
    if not isinstance(record, dict):
        raise SchemaError(f"{where}: expected a JSON object, got {type(record).__name__}")
    qid = record_field(record, "QuestionId", str, where)
    question = record_field(record, "RawQuestion", str, where)
    if not question.strip():
        raise SchemaError(f"{where}: field 'RawQuestion' is empty")
    answers, gold_paths = webqsp_answers(record, where)
    topics: dict[str, TopicEntity] = {}
    for p, parse in enumerate(record["Parses"]):
        mid = parse.get("TopicEntityMid")
        if mid is None:
            continue  # an annotator found no topic for this parse
        if not isinstance(mid, str) or not mid:
            raise SchemaError(
                f"{where}: field 'Parses[{p}].TopicEntityMid' must be a non-empty string or null, got {mid!r}"
            )
        name = parse.get("TopicEntityName")
        if name is not None and not isinstance(name, str):
            raise SchemaError(f"{where}: field 'Parses[{p}].TopicEntityName' must be a string or null")
        topics.setdefault(mid, TopicEntity(id=mid, name=name or mid))
    if not topics or not answers:
        return None
    return QAExample(
        id=qid,
        question=question.strip(),
        topic_entities=tuple(topics.values()),
        answers=tuple(answers),
        gold_paths=gold_paths,
        hops=min((len(p) for p in gold_paths), default=0),
        source="WebQSP",
        split=split,
    )


def load_cwq(path: str | Path, split: str | None = None, data: Any = None) -> list[QAExample]:
    """Every usable question of an official CWQ file; `split` defaults to the file name's."""
    path = Path(path)
    split = split or split_from_filename(path)
    data = read_json(path) if data is None else data
    if not isinstance(data, list):
        raise SchemaError(f"{path}: expected the CWQ release's JSON array of questions, got {type(data).__name__}")
    return _parse_all(data, parse_cwq_question, path, split)


def parse_cwq_question(record: Any, index: int, path: str | Path, split: str) -> QAExample | None:
    """One CWQ question, or None when it has no answer or its SPARQL names no Freebase entity."""
    where = f"{path}: record {index}"
    if not isinstance(record, dict):
        raise SchemaError(f"{where}: expected a JSON object, got {type(record).__name__}")
    qid = record_field(record, "ID", str, where)
    question = record_field(record, "question", str, where)
    if not question.strip():
        raise SchemaError(f"{where}: field 'question' is empty")
    sparql = record_field(record, "sparql", str, where)
    answers = cwq_answers(record, where)
    mids = dict.fromkeys(_FREEBASE_CONSTANT.findall(sparql))
    if not mids or not answers:
        return None
    return QAExample(
        id=qid,
        question=question.strip(),
        topic_entities=tuple(TopicEntity(id=m, name=m) for m in mids),
        answers=tuple(answers),
        source="CWQ",
        split=split,
    )


def _log_skipped(path: Path, skipped: list[int]) -> None:
    if skipped:
        logger.warning(
            "%s: skipped %d question(s) with no answer or no topic entity (first: index %d)",
            path,
            len(skipped),
            skipped[0],
        )
