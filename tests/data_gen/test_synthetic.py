"""The synthetic KG + QA generator: sizes, answers reproduced from the written files, determinism."""

import hashlib
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from data_gen.synthetic import (
    JOINT_PATTERNS,
    MAX_ANSWERS,
    PATTERNS,
    XSD_DATE,
    XSD_GYEAR,
    XSD_INTEGER,
    JointPattern,
    generate,
    literal_aliases,
    load_patterns,
    make_mids,
    write_synthetic,
)
from kgreasoner.kg.base import execute_path
from kgreasoner.kg.memory import MemoryKG, read_names
from kgreasoner.records.ids import is_literal_id, make_literal
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import read_jsonl, write_jsonl
from kgreasoner.records.splits import assign_splits, group_key, overlap_stats

MEDIATOR_KINDS = (
    "people.marriage",
    "education.education",
    "film.performance",
    "award.award_honor",
    "sports.sports_team_roster",
)
MID = re.compile(r"^m\.0[0-9bcdfghjklmnpqrstvwxyz_]{5}$")
LITERAL = re.compile(r'^"[^"\\]*"\^\^<http://www\.w3\.org/2001/XMLSchema#(date|gYear|integer)>$')


@pytest.fixture(scope="module")
def data():
    return generate(seed=0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("synthetic") / "seed0", seed=0)


@pytest.fixture(scope="module")
def kg(folder):
    """The KG as every consumer loads it: from the written kb.tsv (names.tsv picked up beside it)."""
    return MemoryKG.from_file(folder / "kb.tsv")


@pytest.fixture(scope="module")
def examples(folder):
    return read_jsonl(folder / "questions.jsonl")


def test_world_size_guarantees(kg, data):
    named = kg.names()
    assert len(named) >= 2000
    assert len(kg.relation_types) >= 30
    hub_degrees = sorted((kg.degree(x) for x in data.nodes_by_type["country"]), reverse=True)
    assert hub_degrees[0] >= 200
    assert max(kg.degree(x) for x in data.nodes_by_type["language"]) >= 200
    literals = [x for x in kg.entities if is_literal_id(x)]
    kinds = Counter(LITERAL.match(x).group(1) for x in literals)
    assert set(kinds) == {"date", "gYear", "integer"}
    assert all(kinds[k] >= 100 for k in kinds)


def test_mediators_are_unnamed_nodes_between_named_ones(kg, data, folder):
    listed = read_names(folder / "names.tsv")
    for kind in MEDIATOR_KINDS:
        nodes = data.nodes_by_type[kind]
        assert len(nodes) >= 100, kind
        for node in nodes[:50]:
            assert kg.is_unnamed(node) and node not in listed
            assert kg.label(node) == node
            assert kg.degree(node) >= 2
    marriage = data.nodes_by_type["people.marriage"][0]
    spouses = [e for e in kg.neighbors(marriage, "out") if e.relation == "people.marriage.spouse"]
    assert len(spouses) == 2 and all(not e.object_unnamed for e in spouses)
    assert all(e.subject_unnamed for e in spouses)


def test_files_use_mids_and_ntriples_literals(folder):
    names = read_names(folder / "names.tsv")
    assert all(MID.match(node) for node in names)
    with open(folder / "kb.tsv", encoding="utf-8") as handle:
        rows = [line.rstrip("\n").split("\t") for line in handle]
    assert all(len(row) == 3 for row in rows)
    assert len({tuple(row) for row in rows}) == len(rows)  # no triple twice
    assert all(MID.match(s) for s, _, _ in rows)
    assert all(MID.match(o) or LITERAL.match(o) for _, _, o in rows)
    assert all(re.match(r"^[a-z_]+(\.[a-z_]+){2}$", r) for _, r, _ in rows)
    assert make_literal("1987-03-02", XSD_DATE) == '"1987-03-02"^^<http://www.w3.org/2001/XMLSchema#date>'


def test_namesakes_exist_but_no_topic_is_ambiguous(kg, folder, examples):
    names = read_names(folder / "names.tsv")
    by_name = defaultdict(list)
    for node, label in names.items():
        by_name[normalize_answer(label)].append(node)
    shared = {n for n, ids in by_name.items() if len(ids) > 1}
    assert len(shared) >= 20
    for example in examples:
        topic = example.topic_entities[0]
        assert normalize_answer(topic.name) not in shared
        assert kg.resolve(topic.name) == [topic.id]


def test_every_gold_path_reproduces_its_answers_on_the_written_kg(kg, examples):
    assert len(examples) == 3000
    for example in examples:
        if example.intersect:
            continue
        topic = example.topic_entities[0]
        assert len(example.topic_entities) == 1 and len(example.gold_paths) == 1
        reached = execute_path(kg, topic.id, example.gold_paths[0])
        reached.discard(topic.id)
        assert {a.id for a in example.answers} == reached, example.id
        assert 1 <= len(example.answers) <= MAX_ANSWERS
        assert topic.name == kg.label(topic.id) and topic.name in example.question
        for answer in example.answers:
            assert answer.name == kg.label(answer.id)
            assert not kg.is_unnamed(answer.id)


def test_multi_topic_answers_are_the_intersection_and_narrower_than_either_path(kg, examples):
    multi = [e for e in examples if e.intersect]
    assert len(multi) == 300  # the default share, 10%
    assert {tuple(e.gold_paths) for e in multi} == {p.paths for p in JOINT_PATTERNS}
    for example in multi:
        assert len(example.topic_entities) == len(example.gold_paths) == 2
        assert example.hops == max(map(len, example.gold_paths))
        reached = [execute_path(kg, t.id, p) - {t.id} for t, p in zip(example.topic_entities, example.gold_paths)]
        assert {a.id for a in example.answers} == reached[0] & reached[1], example.id
        assert all(len(example.answers) < len(r) for r in reached)
        assert all(t.name in example.question and kg.resolve(t.name) == [t.id] for t in example.topic_entities)
    assert not any(
        e.intersect for e in generate(seed=0, num_entities=300, num_questions=30, multi_topic_share=0.0).examples
    )


def test_hops_balanced_with_backward_and_mediator_steps(examples):
    single = [e for e in examples if not e.intersect]
    assert Counter(e.hops for e in single) == {1: 900, 2: 900, 3: 900}
    examples = single
    assert all(e.hops == len(e.gold_paths[0]) for e in examples)
    steps = [r for e in examples for r in e.gold_paths[0]]
    backward = sum(r.startswith("^") for r in steps) / len(steps)
    assert 0.12 <= backward <= 0.3
    paths = Counter(e.gold_paths[0] for e in examples)
    assert paths[("people.person.spouse_s", "people.marriage.spouse")] > 0
    assert paths[("^film.performance.character", "film.performance.actor", "people.person.nationality")] > 0
    assert set(paths) == {p.path for p in PATTERNS}


def test_paraphrases_share_a_group_and_differ_in_wording(examples):
    assert all(len(p.templates) >= 2 for p in PATTERNS)
    assert len({(p.start, p.path) for p in PATTERNS}) == len(PATTERNS)
    groups = defaultdict(set)
    for example in examples:
        groups[group_key(example)].add(example.question)
    sizes = Counter(len(texts) for texts in groups.values())
    assert sizes[1] > 0 and sizes[2] > 0 and sizes[3] > 0
    assert sum(len(t) for t in groups.values()) == len(examples)  # no repeated wording in a group


def test_patterns_come_from_the_package_yaml_in_file_order():
    assert load_patterns() == (PATTERNS, JOINT_PATTERNS)
    assert (len(PATTERNS), len(JOINT_PATTERNS)) == (126, 7)
    assert PATTERNS[0].path == ("people.person.nationality",) and PATTERNS[0].start == "person"
    assert JOINT_PATTERNS[-1].paths == (
        ("^film.film.production_companies",),
        ("^film.performance.actor", "^film.film.starring"),
    )


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            "{start: person, path: [people.person.nickname], templates: ['Who is {e}?']}",
            "patterns.yaml: single[0]: unknown relation 'people.person.nickname' (`^` before a relation walks it "
            "backwards)",
        ),
        (
            "{start: planet, path: [people.person.gender], templates: ['Who is {e}?']}",
            "patterns.yaml: single[0]: unknown entity type 'planet'; types: gender, continent",
        ),
        (
            "{start: person, path: [people.person.gender], templates: ['Who is it?']}",
            "patterns.yaml: single[0]: template 'Who is it?' must name {e}",
        ),
        (
            "{start: person, path: [people.person.gender], templates: ['Is {e} {x}?']}",
            "patterns.yaml: single[0]: template 'Is {e} {x}?' has an unknown slot 'x'; slots: e",
        ),
        (
            "{start: person, path: [], templates: ['Who is {e}?']}",
            "patterns.yaml: single[0]: a path is a non-empty list of relation ids",
        ),
        (
            "{start: person, path: [people.person.gender]}",
            "patterns.yaml: single[0]: a pattern has exactly the keys start, path, templates",
        ),
    ],
)
def test_a_bad_pattern_is_named_with_what_is_wrong(entry, message):
    with pytest.raises(ValueError) as raised:
        load_patterns(f"single:\n  - {entry}\njoint: []\n")
    assert str(raised.value).startswith(message)


def test_a_joint_pattern_needs_two_topics_and_both_slots():
    good = "{starts: [city, country], paths: [[^people.person.place_of_birth], [^people.person.nationality]], "
    assert load_patterns(f"single: []\njoint:\n  - {good}templates: ['{{a}} and {{b}}?']}}\n") == (
        (),
        (
            JointPattern(
                ("city", "country"),
                (("^people.person.place_of_birth",), ("^people.person.nationality",)),
                ("{a} and {b}?",),
            ),
        ),
    )
    with pytest.raises(ValueError, match=r"joint\[0\]: template 'Born in \{a\}\?' must name \{a\} and \{b\}"):
        load_patterns(f"single: []\njoint:\n  - {good}templates: ['Born in {{a}}?']}}\n")
    with pytest.raises(ValueError, match=r"joint\[0\]: `starts` and `paths` hold two entries each"):
        load_patterns(
            "single: []\njoint:\n  - {starts: [city], paths: [[people.person.gender]], templates: ['{a}{b}']}\n"
        )


def test_literal_answers_carry_aliases(examples):
    assert literal_aliases(make_literal("1987-03-02", XSD_DATE)) == ("March 2, 1987", "2 March 1987")
    assert literal_aliases(make_literal("1234567", XSD_INTEGER)) == ("1,234,567",)
    assert literal_aliases(make_literal("42", XSD_INTEGER)) == ()
    assert literal_aliases(make_literal("2004", XSD_GYEAR)) == ()
    dated = [a for e in examples for a in e.answers if a.id.endswith(f"<{XSD_DATE}>")]
    assert dated and all(len(a.aliases) == 2 for a in dated)
    assert all(a.aliases == () for e in examples for a in e.answers if not is_literal_id(a.id))


def test_schema_round_trip_and_grouped_splits(folder, examples):
    copy = folder.parent / "copy.jsonl"
    write_jsonl(examples, copy)
    assert copy.read_bytes() == (folder / "questions.jsonl").read_bytes()
    assert {e.source for e in examples} == {"synthetic"}
    assert len({e.id for e in examples}) == len(examples)
    sizes = Counter(e.split for e in examples)
    assert set(sizes) == {"train", "dev", "test"} and 250 <= sizes["test"] <= 350
    sides = defaultdict(set)
    for example in examples:
        sides[group_key(example)].add(example.split)
    assert all(len(s) == 1 for s in sides.values())
    stats = overlap_stats(examples)
    assert stats.test_seen == 0 and stats.dev_seen == 0
    resplit = assign_splits([e.with_split("") for e in examples], "grouped", seed=0)
    assert [e.split for e in resplit] == [e.split for e in examples]


@pytest.mark.slow
def test_same_seed_gives_identical_files_in_fresh_processes(folder, tmp_path):
    """Byte-identical across processes with different string-hash seeds (no set-order leaks); CLI too."""
    for hash_seed in ("1", "2"):
        out = tmp_path / hash_seed
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-m", "data_gen.synthetic", "--out", str(out), "--seed", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "questions_by_hops: {1: 1063, 2: 1037, 3: 900}" in done.stdout
        for name in ("kb.tsv", "names.tsv", "questions.jsonl"):
            assert (out / name).read_bytes() == (folder / name).read_bytes(), name


def test_the_default_dataset_is_pinned_byte_for_byte(folder):
    """The seed-0 files of the default settings, as digests: any change to what the generator draws or writes
    shows here (update the digests only for an intended change of the dataset)."""
    digests = {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()[:16]
        for name in ("kb.tsv", "names.tsv", "questions.jsonl")
    }
    assert digests == {
        "kb.tsv": "7bdefc84ab237d88",
        "names.tsv": "deae0ab702a20592",
        "questions.jsonl": "abdb1d5799bceaf4",
    }


def test_other_seed_gives_another_graph(data):
    other = generate(seed=1, num_questions=30)
    assert set(other.triples()) != set(data.triples())
    assert set(other.names.values()) != set(data.names.values())
    assert [e.question for e in other.examples] != [e.question for e in data.examples[:30]]


def test_target_triples_scales_the_graph_and_its_hubs():
    big = generate(seed=0, target_triples=200_000, num_questions=30)
    assert big.num_triples >= 200_000
    stats = big.stats()
    assert stats["max_degree"] >= 2000
    assert stats["named_entities"] >= 25_000
    assert Counter(e.hops for e in big.examples if not e.intersect) == {1: 9, 2: 9, 3: 9}
    assert sum(e.intersect for e in big.examples) == 3


def test_num_entities_and_bad_sizes():
    small = generate(seed=0, num_entities=500, num_questions=60)
    assert 485 <= len(small.names) <= 500
    assert len(small.examples) == 60
    with pytest.raises(ValueError, match="num_entities must be at least 100"):
        generate(num_entities=10)
    with pytest.raises(ValueError, match="target_triples must be positive"):
        generate(target_triples=0)
    with pytest.raises(ValueError, match="num_questions must be >= 0"):
        generate(num_questions=-1)


def test_mids_are_distinct_and_well_formed():
    mids = make_mids(50_000, offset=12345)
    assert len(set(mids.tolist())) == 50_000
    assert all(MID.match(m) for m in mids[:1000])
    assert make_mids(3, offset=0).tolist() != make_mids(3, offset=1).tolist()
