"""PathQuestion (Zhou, Huang and Zhu, COLING 2018): PQ-2H, PQ-3H, PQL-2H, PQL-3H(_more).

A line: `question \\t primary(ans1/ans2/) \\t topic#r1#e1#r2#...#primary[#<end>#primary]`.
PQL lines start with a space. The third column is one instance of the gold path: relations at
the odd positions, entities at the even ones; `<end>` closes it (PQ repeats the answer after it).
Entity names contain parentheses (`PG_(USA)(PG_(USA)/)`), so the answer column is split where the
text before a `(` is one of the answers listed inside it. Ids are the KB's names; there is no
names file, so ids are also the labels.
"""

from __future__ import annotations

from pathlib import Path

from kgreasoner.records.paths import find_data_dir
from kgreasoner.records.schema import Answer, QAExample, SchemaError, TopicEntity

END = "<end>"

# set name -> (questions file, KB file), as the data's readme pairs them.
PATHQUESTION_FILES: dict[str, tuple[str, str]] = {
    "PQ-2H": ("PQ-2H.txt", "2H-kb.txt"),
    "PQ-3H": ("PQ-3H.txt", "3H-kb.txt"),
    "PQL-2H": ("PQL-2H.txt", "PQL2-KB.txt"),
    "PQL-3H": ("PQL-3H.txt", "PQL3-KB.txt"),
    "PQL-3H_more": ("PQL-3H_more.txt", "PQL3-KB.txt"),
}
# The four sets published results report; PQL-3H_more is a larger variant of PQL-3H.
PATHQUESTION_SETS: tuple[str, ...] = ("PQ-2H", "PQ-3H", "PQL-2H", "PQL-3H")

_BY_KEY = {name.lower().replace("_", "-"): name for name in PATHQUESTION_FILES}


def pathquestion_set_name(name: str) -> str | None:
    """The canonical set name for `name` in any case (`pq-2h` -> `PQ-2H`), or None."""
    return _BY_KEY.get(name.strip().lower().replace("_", "-"))


def parse_pathquestion_line(line: str, source: str, number: int, file: str | Path = "<string>") -> QAExample:
    """One line as a QAExample with id `{source}-{number:06d}` (`number` is the 1-based line).

    Raises SchemaError naming `file`, the line and the column that is malformed.
    """
    where = f"{file}:{number}"
    # Only spaces and the line end: a tab is a column separator even at the edges.
    columns = line.rstrip("\r\n").strip(" ").split("\t")
    if len(columns) != 3:
        raise SchemaError(f"{where}: expected 3 tab-separated columns (question, answer, path), got {len(columns)}")
    question, answer_column, path_column = (c.strip() for c in columns)
    if not question:
        raise SchemaError(f"{where}: column 'question' is empty")
    nodes = path_column.split("#")
    if END in nodes:
        nodes = nodes[: nodes.index(END)]
    if len(nodes) < 3 or len(nodes) % 2 == 0 or not all(nodes):
        raise SchemaError(
            f"{where}: column 'path' must be 'topic#relation#entity#...#answer' "
            f"(an odd number >= 3 of non-empty '#'-separated parts before {END}), got {path_column!r}"
        )
    entities, relations = nodes[0::2], nodes[1::2]
    primary, answers = _split_answer_column(answer_column, where)
    if entities[-1] not in answers:
        raise SchemaError(f"{where}: column 'path' ends at {entities[-1]!r}, which is not in the answer set {answers}")
    ordered = [primary] + [a for a in answers if a != primary]
    return QAExample(
        id=f"{source}-{number:06d}",
        question=question,
        topic_entities=(TopicEntity(id=entities[0], name=entities[0]),),
        answers=tuple(Answer(id=a, name=a) for a in ordered),
        gold_paths=(tuple(relations),),
        hops=len(relations),
        source=source,
        # One witness chain topic -> ... -> answer: lets trajectory builders name each hop's entity.
        extra={"path_entities": entities},
    )


def _split_answer_column(text: str, where: str) -> tuple[str, list[str]]:
    """`primary(a/b/)` -> (primary, [a, b]); the split is the `(` after which `primary` is listed."""
    if text.endswith("/)"):
        for i, char in enumerate(text):
            if char == "(" and i > 0:
                primary, listed = text[:i], text[i + 1 : -2].split("/")
                if primary in listed and all(listed):
                    return primary, list(dict.fromkeys(listed))
    raise SchemaError(
        f"{where}: column 'answer' must be 'answer(answer1/answer2/.../)' listing the answer, got {text!r}"
    )


def read_pathquestion(path: str | Path, source: str) -> list[QAExample]:
    """Every non-blank line of a PathQuestion file, in file order."""
    path = Path(path)
    examples = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                examples.append(parse_pathquestion_line(line, source, number, path))
    return examples


def load_pathquestion(name: str, root: str | Path | None = None) -> tuple[list[QAExample], Path]:
    """The questions of one set (`PQ-2H`, `pql-3h`, ...) and the path of its KB file.

    `root` is the PathQuestion folder or a data root holding `pathquestion/`; without it the
    folder is looked up as `kgreasoner.records.paths.find_data_dir` describes.
    """
    canonical = pathquestion_set_name(name)
    if canonical is None:
        raise ValueError(f"unknown PathQuestion set {name!r}; known: {', '.join(PATHQUESTION_FILES)}")
    folder = find_data_dir("pathquestion", root)
    questions_file, kb_file = PATHQUESTION_FILES[canonical]
    for needed in (questions_file, kb_file):
        if not (folder / needed).is_file():
            raise FileNotFoundError(f"{folder}: missing {needed} (needed by {canonical})")
    return read_pathquestion(folder / questions_file, canonical), folder / kb_file
