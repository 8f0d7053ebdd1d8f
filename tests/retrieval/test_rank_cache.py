"""CandidateScorer's caches: a repeated search is answered without the graph or the ranker, with
its own cursor state, and a cached ranking does not keep a question's graph alive."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import torch

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.sparql import CONTEXT_BATCH, SparqlKG
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.candidates import candidate_context, gather_candidates
from kgreasoner.retrieval.encoder import EncoderConfig, build_encoder
from kgreasoner.retrieval.ranker import GATRanker, RankerModelConfig
from kgreasoner.retrieval.ranking import CandidateScorer, context_texts
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig


class CountingKG(MemoryKG):
    calls: list

    def neighbors(self, entity, direction="out", relations=None, limit=None):
        self.calls.append(entity)
        return super().neighbors(entity, direction, relations, limit)


def graph() -> CountingKG:
    triples = [
        ("fr", "country.capital", "paris"),
        ("fr", "country.river", "seine"),
        ("paris", "city.mayor", "anne"),
        ("seine", "river.mouth", "havre"),
    ] + [(f"p{i}", "person.nationality", "fr") for i in range(40)]
    kg = CountingKG.from_triples(triples)
    kg.calls = []
    return kg


class CountingRanker(GATRanker):
    scored = 0

    def score(self, inputs):
        CountingRanker.scored += 1
        return super().score(inputs)


def test_a_repeated_search_reads_neither_graph_nor_ranker_and_shows_the_same_lines():
    torch.manual_seed(0)
    kg = graph()
    tool = KGSearchTool(
        kg,
        ToolConfig(
            ranking="gat",
            top_k=3,
            relation_first=20,
            rerank_pool=5,
            encoder=EncoderConfig(kind="hashing", hashing_dim=32),
        ),
        ranker=CountingRanker(RankerModelConfig(dim=32, hidden=8, head_hidden=4, dropout=0.0)).eval(),
    )
    first = tool.session("what is the capital", [TopicEntity("fr", "fr")])
    pages = [first.call("fr").text, first.call("fr").text]
    calls, scored = len(kg.calls), CountingRanker.scored
    assert calls > 0 and scored == 1
    again = tool.session("what is the capital", [TopicEntity("fr", "fr")])
    assert again.call("fr").text == pages[0]
    assert (len(kg.calls), CountingRanker.scored, tool.timings.cached) == (calls, scored, 1)
    # the second session has its own cursor: its next page is the first session's second page
    assert again.call("fr").text == pages[1]
    # another question ranks again, but reads the candidates' contexts from the cache
    other = tool.session("who is a national", [TopicEntity("fr", "fr")])
    other.call("fr")
    assert CountingRanker.scored == scored + 1
    # its pool shares citizens with the first one's: their contexts are not fetched again
    assert {"p0", "p1"} <= set(kg.calls[:calls]) and {"p0", "p1"}.isdisjoint(kg.calls[calls:])
    assert "p3" in kg.calls[calls:]


def test_a_cached_ranking_does_not_keep_its_graph_alive():
    tool = KGSearchTool(
        MemoryKG.from_triples([("x", "r", "y")]),
        ToolConfig(
            ranking="embedding",
            relation_first=20,
            rerank_pool=5,
            encoder=EncoderConfig(kind="hashing", hashing_dim=32),
        ),
    )
    view = graph()
    session = tool.session("q", [TopicEntity("fr", "fr")])
    session._kg = view  # a question's own graph, as `subgraph` gives
    assert session.call("fr").error is None and tool.scorer.timings.cached == 0
    assert len(tool.scorer._caches) == 1
    alive = weakref.ref(view)
    del view, session
    gc.collect()
    assert alive() is None and len(tool.scorer._caches) == 0


def test_caches_hold_at_most_their_capacity_in_candidates():
    from kgreasoner.retrieval.encoder import CachedEncoder, HashingEncoder
    from kgreasoner.retrieval.ranking import CandidateScorer

    kg = graph()
    scorer = CandidateScorer(
        "embedding",
        kg,
        encoder=CachedEncoder(HashingEncoder(32)),
        relation_first=None,
        rank_cache=10,
        candidate_cache=10,
    )
    scorer.rank("q1", "fr")
    scorer.rank("q1", "fr")  # 42 candidates weigh more than either cache holds: fetched and ranked again
    assert kg.calls == ["fr", "fr"] and scorer.timings.cached == 0
    scorer.rank("q1", "paris")
    scorer.rank("q1", "paris")  # 2 candidates: the ranking is cached
    scorer.rank("q2", "paris")  # another question: ranked again, from the cached candidates
    assert kg.calls == ["fr", "fr", "paris"] and scorer.timings.cached == 1
    # an entry weighs its candidates + 1: paris 3, seine 3, havre 2, anne 2 fill the 10 exactly, paris stays
    for entity in ("seine", "havre", "anne"):
        scorer.rank("q1", entity)
    scorer.rank("q3", "paris")
    assert kg.calls[-1] == "anne"
    scorer.rank("q1", "p0")
    scorer.rank("q1", "p1")  # 2 + 2 more: the least recently used go first (seine, havre), paris was just read
    scorer.rank("q4", "paris")
    scorer.rank("q2", "seine")
    assert kg.calls[-3:] == ["p0", "p1", "seine"]


def test_over_sparql_the_contexts_of_a_search_come_in_few_requests_and_score_as_fetched_one_by_one(oxigraph_server):
    torch.manual_seed(0)
    memory = graph()
    sparql = SparqlKG(oxigraph_server(list(memory.triples())))
    model = GATRanker(RankerModelConfig(dim=32, hidden=8, head_hidden=4, dropout=0.0)).eval()
    encoder = build_encoder(EncoderConfig(kind="hashing", hashing_dim=32))
    scorer = CandidateScorer("gat", sparql, encoder, model, max_context=1)
    candidates = gather_candidates(sparql, "fr") + gather_candidates(sparql, "paris")  # "fr" twice, as a target
    one_by_one = [candidate_context(sparql, c, 1) for c in candidates]
    assert sum(map(len, one_by_one)) == 3  # paris, seine and fr have an edge beside the one they came by
    sparql._unnamed_without_label()
    before = sparql.queries_sent
    assert scorer._contexts(sparql, candidates) == [[context_texts(e) for e in context] for context in one_by_one]
    targets = len({c.target for c in candidates})
    assert targets == 44 and sparql.queries_sent == before + -(-targets // CONTEXT_BATCH)
    memory_scorer = CandidateScorer("gat", memory, encoder, model, max_context=1)
    assert np.allclose(
        scorer.scores("the capital?", candidates),
        memory_scorer.scores("the capital?", candidates),
        rtol=0.0,
        atol=1e-6,
    )
    assert sparql.queries_sent == before + -(-targets // CONTEXT_BATCH)  # the contexts are cached
