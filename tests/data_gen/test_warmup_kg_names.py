"""The warm-up on questions that name their topic entities by id only (the official CWQ release's
Freebase mids): its records name them as the KG does, as GRPO's and evaluation's prompts do."""

from __future__ import annotations

import json
import re
from pathlib import Path

from data_gen.warmup import WarmupConfig, run
from kgreasoner.data import load_dataset
from kgreasoner.protocol import build_prompt
from kgreasoner.records.trajectories import read_warmup
from kgreasoner.retrieval.tool import ToolConfig

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"
TRIPLE = re.compile(r"^<http://rdf\.freebase\.com/ns/([^>]+)> <http://rdf\.freebase\.com/ns/([^>]+)> (.+) \.$")


def _freebase_folder(out: Path) -> Path:
    """A dataset folder of the release's first training question (topic entities named by their mids, as
    loaded) on the fixture's Freebase triples: `kb.tsv`, and `names.tsv` from `type.object.name`."""
    edges, names = [], []
    for line in (FIXTURES / "cwq-official" / "freebase.nt").read_text().splitlines():
        subject, relation, value = TRIPLE.match(line).groups()
        if relation == "type.object.name":
            names.append(f"{subject}\t{json.loads(value.removesuffix('@en'))}\n")
        else:
            edges.append(f"{subject}\t{relation}\t{value.removeprefix('<http://rdf.freebase.com/ns/').rstrip('>')}\n")
    [example] = load_dataset("cwq-official", root=FIXTURES).split("train")[:1]
    row = example.to_dict() | {
        # the walks SPARQL's pattern makes: the sibling through its mediator, and the gender backwards
        "gold_paths": [["people.person.sibling_s", "people.sibling_relationship.sibling"], ["^people.person.gender"]],
        "intersect": True,
        "hops": 2,
    }
    out.mkdir()
    (out / "kb.tsv").write_text("".join(edges))
    (out / "names.tsv").write_text("".join(names))
    (out / "questions.jsonl").write_text(json.dumps(row) + "\n")
    return out


def test_warm_up_records_name_the_topic_entities_as_the_kg_does(tmp_path):
    data = _freebase_folder(tmp_path / "cwq")
    [loaded] = load_dataset(str(data)).examples
    assert [(t.id, t.name) for t in loaded.topic_entities] == [("m.06w2sn5", "m.06w2sn5"), ("m.05zppz", "m.05zppz")]
    out = tmp_path / "warmup.jsonl"
    for handles in (True, False):
        run(
            WarmupConfig(
                dataset=str(data),
                output=str(out),
                num_examples=None,
                dev_examples=0,
                correction_share=0.0,
                tool=ToolConfig(entity_handles=handles),
                progress=False,
            )
        )
        [record] = read_warmup(out)
        assert [(t.id, t.name) for t in record.topic_entities] == [
            ("m.06w2sn5", "Justin Bieber"),
            ("m.05zppz", "Male"),
        ]
        prompt = build_prompt(record.question, list(record.topic_entities), None)
        assert prompt.endswith("Topic Entity: Justin Bieber, Male Assistant:")
        assert "m.06w2sn5" not in record.completion and "m.05zppz" not in record.completion, record.completion
        assert "Justin Bieber" in record.completion
