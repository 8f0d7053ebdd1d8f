"""Topic entity names from the KG, for questions whose data names them only by id.

The official CWQ release gives its topic entities as Freebase mids only (`m.06w2sn5`), so the
prompt would name them to the model as mids (`m.06w2sn5, m.05zppz`). The KG the questions run on
knows their names (Freebase's English `type.object.name` over SPARQL), and its search results
show the same names, so the prompt names each topic entity as the search will.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.records.schema import QAExample, TopicEntity


def with_kg_names(examples: Sequence[QAExample], kg: KnowledgeGraph) -> list[QAExample]:
    """The examples, each topic entity named by its id (the data gave no name) renamed to the KG's
    label of it (`kg.labels`, fetched for all examples together); one the KG cannot name either
    keeps its id, and named ones are left as they are."""
    unnamed = list(dict.fromkeys(t.id for e in examples for t in e.topic_entities if t.name == t.id))
    names = kg.labels(unnamed) if unnamed else {}
    out = []
    for example in examples:
        topics = tuple(TopicEntity(t.id, names[t.id]) if t.name == t.id else t for t in example.topic_entities)
        out.append(example if topics == example.topic_entities else replace(example, topic_entities=topics))
    return out
