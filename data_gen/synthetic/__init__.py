"""A synthetic Freebase-like KG with 1-, 2- and 3-hop questions: the embedded default dataset.

The world (deterministic per seed) has named entities of about twenty types (persons, cities,
countries, films, characters, organisations, universities, sports teams, awards, languages,
time zones, ...), 48 relations named the Freebase way (`people.person.nationality`,
`location.location.containedby`, `film.film.directed_by`, ...), hub nodes (genders, countries,
languages, continents: degree 200+ by default, thousands at benchmark sizes), unnamed mediator
(CVT) nodes (`people.marriage`, `education.education`, `film.performance`,
`award.award_honor`, `sports.sports_team_roster`) and literal values (dates, years, integers) in
N-Triples form. Ids are Freebase-style mids (`m.0b7x_q`); names repeat on purpose (namesakes:
people, cities, characters and films sharing a name), so resolving a name is not trivial, but no
question's topic entity shares its name (exactly or after `normalize_answer`) with another entity.

Questions come from a catalogue of relation paths (`PATTERNS`, read from `patterns.yaml` in this
package), each with several paraphrase templates. Conventions:
- `gold_paths` holds one path of relation ids; `^rel` walks an edge backwards (object to
  subject), as in `kgreasoner.kg.base`. About a fifth of all steps are backwards.
- `hops` is the number of relations in the path, i.e. the number of edges a search walks.
  Passing a mediator costs two: "who is X married to" is
  [`people.person.spouse_s`, `people.marriage.spouse`], a 2-hop question.
- The answer set is what executing the path on the KG returns (`execute_path` on a `MemoryKG`
  of the triples), minus the topic entity itself: through a marriage, `people.marriage.spouse`
  leads back to both spouses. A (topic, path) with no answer or more than `MAX_ANSWERS` is not
  asked. Each (topic, path) group gets one to three paraphrases.
- Literal answers are named by their value (`1987-03-02`, `42`) with aliases for other common
  spellings (`March 2, 1987`, `2 March 1987`; `1,234,567`).
- Splits are pre-assigned with the seeded `grouped` scheme (no (topic, path) group on two sides).
- Multi-topic questions (`multi_topic_share` of them, 10% by default) come from `JOINT_PATTERNS`:
  two topic entities, one path from each (one hop or more), `intersect: true` and as answers what
  both paths reach ("Which people born in {a} are citizens of {b}?"). A pair is asked only when the
  intersection is narrower than each path's own answers, so neither search alone answers it; its
  `hops` is the longer path's length.

Files written by `write_synthetic` (the dataset-folder layout of the README):
`kb.tsv` (`subject \\t relation \\t object`, ids), `names.tsv` (`id \\t label`, named entities
only; mediators are absent, hence unnamed) and `questions.jsonl` (our QA schema).

    python -m data_gen.synthetic --out DIR --seed 0 [--target-triples N]

The package, one job per module (each imports only the ones above it):
- `ontology`: relation ids and literal datatypes;
- `names`: the name generator and its vocabularies;
- `world`: sizes per scale, mids, and the world's entities and edges (`build_world`);
- `questions` (+ `patterns.yaml`): the question patterns and the questions asked of a world;
- `dataset`: `generate`, `SyntheticData`, `write_synthetic`, `write_data`;
- `cli`: the command line.
"""

from __future__ import annotations

from data_gen.synthetic.cli import main
from data_gen.synthetic.dataset import (
    DEFAULT_MULTI_TOPIC_SHARE,
    DEFAULT_QUESTIONS,
    SyntheticData,
    generate,
    write_data,
    write_synthetic,
)
from data_gen.synthetic.ontology import (
    RELATIONS,
    XSD,
    XSD_DATE,
    XSD_GYEAR,
    XSD_INTEGER,
    inverse,
)
from data_gen.synthetic.questions import (
    JOINT_PATTERNS,
    MAX_ANSWERS,
    PATTERNS,
    SOURCE,
    JointPattern,
    PathPattern,
    literal_aliases,
    load_patterns,
)
from data_gen.synthetic.world import (
    MIN_NAMED_ENTITIES,
    TYPE_SIZES,
    TypeSize,
    make_mids,
    named_entity_count,
    scale_for,
    type_counts,
)

__all__ = [
    "XSD",
    "XSD_DATE",
    "XSD_GYEAR",
    "XSD_INTEGER",
    "RELATIONS",
    "inverse",
    "MIN_NAMED_ENTITIES",
    "TYPE_SIZES",
    "TypeSize",
    "make_mids",
    "named_entity_count",
    "scale_for",
    "type_counts",
    "JOINT_PATTERNS",
    "MAX_ANSWERS",
    "PATTERNS",
    "SOURCE",
    "JointPattern",
    "PathPattern",
    "literal_aliases",
    "load_patterns",
    "DEFAULT_MULTI_TOPIC_SHARE",
    "DEFAULT_QUESTIONS",
    "SyntheticData",
    "generate",
    "write_data",
    "write_synthetic",
    "main",
]
