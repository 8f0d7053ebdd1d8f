"""CWQ's topic entities, named by mid only in the release, get Freebase's names from a real SPARQL endpoint."""

from pathlib import Path

import pytest

from kgreasoner.data import load_dataset
from kgreasoner.data.entity_names import with_kg_names
from kgreasoner.kg import sparql as sparql_module
from kgreasoner.kg.open import open_kg
from kgreasoner.protocol import build_prompt

FIXTURES = Path(__file__).parent / "fixtures"
NS = "http://rdf.freebase.com/ns/"
# The fixtures' topic entities as Freebase holds them: Provo (m.0ghkd) has no name here.
FREEBASE = f"""
<{NS}m.06w2sn5> <{NS}type.object.name> "Justin Bieber"@en .
<{NS}m.06w2sn5> <{NS}type.object.name> "Justin Bieber (chanteur)"@fr .
<{NS}m.06w2sn5> <{NS}people.person.sibling_s> <{NS}m.0gxnnwc> .
<{NS}m.0gxnnwc> <{NS}people.sibling_relationship.sibling> <{NS}m.0gxnnwq> .
<{NS}m.0gxnnwq> <{NS}type.object.name> "Jaxon Bieber"@en .
<{NS}m.0gxnnwq> <{NS}people.person.gender> <{NS}m.05zppz> .
<{NS}m.05zppz> <{NS}type.object.name> "Gender male" .
<{NS}m.05zppz> <{NS}type.object.name> "Male"@en .
<{NS}m.05zppz> <{NS}type.object.name> "Masculin"@fr .
<{NS}m.0f2r6> <{NS}type.object.name> "Salt Lake City"@en-US .
<{NS}m.02hczc> <{NS}type.object.name> "Mountain Time Zone"@en .
<{NS}m.02hczc> <{NS}type.object.name> "Heure des Rocheuses"@fr .
<{NS}m.0ghkd> <{NS}location.location.containedby> <{NS}m.0f2r6> .
<{NS}m.0hostile> <{NS}type.object.name> "Say \\"hi\\" }} ; DROP ALL >"@en .
<{NS}m.0hostile> <{NS}location.location.containedby> <{NS}m.0f2r6> .
"""


@pytest.fixture(scope="module")
def freebase_spec(oxigraph_server):
    return f"sparql+freebase:{oxigraph_server(raw_ntriples=FREEBASE)}"


def test_cwq_prompts_show_the_freebase_names(freebase_spec):
    dataset = load_dataset("cwq-official", root=FIXTURES)
    assert [t.name for t in dataset.split("train")[0].topic_entities] == ["m.06w2sn5", "m.05zppz"]
    kg = open_kg(freebase_spec)
    named = with_kg_names(dataset.examples, kg)
    assert kg.queries_sent == 1  # every question's names in one request
    assert [[(t.id, t.name) for t in e.topic_entities] for e in named] == [
        [("m.06w2sn5", "Justin Bieber"), ("m.05zppz", "Male")],  # English over French and untagged
        [("m.0f2r6", "Salt Lake City")],  # en-US is English
        [("m.02hczc", "Mountain Time Zone"), ("m.0ghkd", "m.0ghkd")],  # no name in the KG: the mid stays
    ]
    justin = next(e for e in named if e.split == "train")
    assert "Topic Entity: Justin Bieber, Male Assistant:" in build_prompt(justin.question, justin.topic_entities)
    assert [(e.id, e.question, e.answers) for e in named] == [(e.id, e.question, e.answers) for e in dataset]


def test_names_the_data_gives_are_kept(freebase_spec):
    """WebQSP's release names its topic entities; a KG name is asked only for an entity named by its id."""
    dataset = load_dataset("webqsp-official", root=FIXTURES)
    kg = open_kg(freebase_spec)
    assert with_kg_names(dataset.examples, kg) == dataset.examples
    assert kg.queries_sent == 0


def test_labels_in_batches_escaped_and_never_from_a_malformed_id(freebase_spec, monkeypatch):
    kg = open_kg(freebase_spec)
    monkeypatch.setattr(sparql_module, "LABEL_BATCH", 2)
    ids = ["m.06w2sn5", "m.05zppz", "m.0ghkd", "m.0hostile", "m.0nothing", '"42"']
    assert kg.labels(ids) == {
        "m.06w2sn5": "Justin Bieber",
        "m.05zppz": "Male",
        "m.0ghkd": "m.0ghkd",
        "m.0hostile": 'Say "hi" } ; DROP ALL >',
        "m.0nothing": "m.0nothing",
        '"42"': "42",
    }
    assert kg.queries_sent == 3  # five ids to ask, two a request; a literal is its own name
    assert kg.labels(ids) == {i: kg.label(i) for i in ids}  # what the search shows of each
    sent = kg.queries_sent
    hostile = "m.0x> } ; DROP ALL ; SELECT * WHERE { ?s ?p ?o"
    # an id no term can name is no node: its own text is its label, and only the good one is asked for
    assert kg.labels(["m.06w2sn5", hostile]) == {"m.06w2sn5": "Justin Bieber", hostile: hostile}
    assert kg.queries_sent == sent + 1
