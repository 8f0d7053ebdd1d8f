"""Relation-first ranking at hubs: the exact path's top-k where the relation decides, every candidate
still reachable, the tail built only when read, and the exact path below the threshold."""

from __future__ import annotations

import gc

import pytest
import torch

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.candidates import gather_candidates
from kgreasoner.retrieval.encoder import CachedEncoder, EncoderConfig, HashingEncoder
from kgreasoner.retrieval.ranker import GATRanker, RankerModelConfig
from kgreasoner.retrieval.ranking import CandidateScorer
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

QUESTION = "which club is based in freedonia"


def hub() -> MemoryKG:
    """Freedonia: 150 citizens, 12 clubs, 90 rivers and 40 mediators (each a treaty with two partners)."""
    triples = [(f"p{i}", "people.person.nationality", "fr") for i in range(150)]
    triples += [("fr", "geography.country.rivers", f"r{i}") for i in range(60)]
    triples += [(f"c{i}", "sports.club.based_in", "fr") for i in range(12)]
    triples += [("fr", "geography.country.rivers", f"r{i}") for i in range(60, 90)]
    triples += [("fr", "law.country.treaties", f"t{i}") for i in range(40)]
    triples += [(f"t{i}", "law.treaty.partner", f"k{(i + j) % 7}") for i in range(40) for j in (0, 1)]
    names = {
        "fr": "Freedonia",
        **{f"p{i}": f"person {i}" for i in range(150)},
        **{f"c{i}": f"club {i} fc" if i % 3 == 0 else f"team {i}" for i in range(12)},
        **{f"r{i}": f"river {i}" for i in range(90)},
        **{f"k{i}": f"kingdom {i}" for i in range(7)},
    }
    return MemoryKG.from_triples(triples, names)


def scorer(kg, method="embedding", relation_first=50, rerank_pool=20, model=None) -> CandidateScorer:
    return CandidateScorer(
        method,
        kg,
        encoder=CachedEncoder(HashingEncoder(256)),
        model=model,
        rerank_pool=rerank_pool,
        relation_first=relation_first,
    )


def test_top_k_equals_exact_scoring_when_the_relation_decides():
    kg = hub()
    assert kg.degree("fr") == 292
    exact = scorer(kg, relation_first=None, rerank_pool=None).rank(QUESTION, "fr")
    first = scorer(kg).rank(QUESTION, "fr")
    top = [c.key for c in exact[:10]]
    assert all(key[0][0] == "^sports.club.based_in" for key in top)  # the relation decides the exact top 10
    assert [c.key for c in first.after(0)][:10] == top
    # the pool held the 12 clubs and the first 8 edges of the next-closest relation; clubs named "club"
    # (closer to the question) lead
    assert [c.target for c in first.built[:4]] == ["c0", "c3", "c6", "c9"]


def test_through_the_tool_the_first_page_is_the_exact_one():
    encoder = EncoderConfig(kind="hashing", hashing_dim=256)
    pages = []
    for relation_first, pool in ((None, None), (50, 20)):
        tool = KGSearchTool(
            hub(),
            ToolConfig(ranking="embedding", encoder=encoder, top_k=5, relation_first=relation_first, rerank_pool=pool),
        )
        session = tool.session(QUESTION, [TopicEntity("fr", "Freedonia")])
        pages.append(session.call("Freedonia").text.splitlines())
    assert pages[0][:5] == pages[1][:5]
    assert pages[0][:2] == [
        "(club 0 fc, sports.club.based_in, Freedonia)",
        "(club 3 fc, sports.club.based_in, Freedonia)",
    ]


@pytest.mark.parametrize("method", ["embedding", "gat"])
def test_every_candidate_stays_reachable_and_the_tail_is_built_when_read(method):
    torch.manual_seed(0)
    model = (
        GATRanker(RankerModelConfig(dim=256, hidden=8, head_hidden=4, dropout=0.0)).eval() if method == "gat" else None
    )
    kg = hub()
    ranked = scorer(kg, method, model=model).rank(QUESTION, "fr")
    # before anything is read past the first page, only the pool is built: 20 edges' candidates
    assert ranked.has(9) and len(ranked.built) == 20
    assert sum(n for _, _, n in ranked.pending_counts()) == 292 - 20
    every = gather_candidates(kg, "fr")
    assert len(every) == 332 and len(ranked) == 332  # len() builds the rest; 40 treaties are 80 candidates
    assert sorted(c.key for c in ranked) == sorted(c.key for c in every)
    # the tail comes relation by relation, KG order within one; mediators expanded as on the exact path
    tail = [c for c in ranked][20:]
    treaties = [c for c in tail if c.edges[0].relation == "law.country.treaties"]
    assert [c.edges[-1].neighbor for c in treaties] == [f"k{(i + j) % 7}" for i in range(40) for j in (0, 1)]
    assert all(len(c.edges) == 2 for c in treaties)


def test_an_entity_with_a_single_relation():
    kg = MemoryKG.from_triples(
        [(f"p{i}", "people.person.nationality", "fr") for i in range(120)],
        {**{f"p{i}": f"team {i}" if i in (5, 17, 30) else f"person {i}" for i in range(120)}},
    )
    ranked = scorer(kg).rank("which team", "fr")
    keys = [c.edges[0].subject for c in ranked]
    # the first 20 edges are scored (the two teams among them lead, KG order among ties), the rest keep KG order
    assert keys[:2] == ["p5", "p17"]
    assert sorted(keys[:20], key=lambda k: int(k[1:])) == [f"p{i}" for i in range(20)]
    assert keys[20:] == [f"p{i}" for i in range(20, 120)]


def test_small_entities_take_the_exact_path():
    kg = hub()
    small = MemoryKG.from_triples([("a", "r", f"b{i}") for i in range(30)] + [("a", "s", "c")])
    for graph, entity in ((small, "a"), (kg, "fr")):
        candidates = gather_candidates(graph, entity)
        exact = scorer(graph, relation_first=1000)
        assert [c.key for c in exact.rank(QUESTION, entity)] == [
            candidates[i].key for i in exact.order(QUESTION, candidates, graph)
        ]
    # at the threshold itself still exact (every candidate built); above it only the pool is
    assert len(scorer(small, relation_first=31, rerank_pool=5).rank("q", "a").built) == 31
    assert len(scorer(small, relation_first=30, rerank_pool=5).rank("q", "a").built) == 5


class Unindexed(KnowledgeGraph):
    """The same graph through the base interface only: a backend without a relation index (as SPARQL)."""

    def __init__(self, kg: MemoryKG) -> None:
        self.kg = kg

    def neighbors(self, entity, direction="out", relations=None, limit=None):
        return self.kg.neighbors(entity, direction, relations, limit)

    def label(self, entity):
        return self.kg.label(entity)

    def resolve(self, name):
        return self.kg.resolve(name)

    def degree(self, entity, direction="both"):
        return self.kg.degree(entity, direction)


@pytest.mark.parametrize("pool", [20, 75])  # 75: the pool ends inside the treaties, whose mediators expand
def test_a_backend_without_the_index_ranks_relation_first_alike(pool):
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig(dim=256, hidden=8, head_hidden=4, dropout=0.0)).eval()
    kg = hub()
    for question in (QUESTION, "treaties", "rivers"):
        indexed = scorer(kg, "gat", model=model, rerank_pool=pool).rank(question, "fr")
        fetched = scorer(Unindexed(kg), "gat", model=model, rerank_pool=pool).rank(question, "fr")
        assert [c.key for c in fetched] == [c.key for c in indexed]
        assert len(indexed) == 332
    # below the threshold both are exact
    assert [c.key for c in scorer(Unindexed(kg), relation_first=300).rank(QUESTION, "fr")] == [
        c.key for c in scorer(kg, relation_first=300).rank(QUESTION, "fr")
    ]


def test_reading_a_ranking_whose_graph_is_gone_says_so():
    """A ranking keeps its question graph only weakly (a cached ranking must not keep it alive): reading the
    unbuilt tail after the graph is gone is an error that says why, not a failure inside the KG code."""
    scorer_ = scorer(hub())
    question_graph = hub()
    ranked = scorer_.rank(QUESTION, "fr", kg=question_graph)
    assert ranked.has(0) and ranked.pending_counts()
    del question_graph
    gc.collect()
    with pytest.raises(RuntimeError, match="the graph fr was ranked in is gone"):
        len(ranked)
