"""CandidateScorer.order_batch: the orders of `order`, with the texts of all requests encoded in two calls."""

from __future__ import annotations

import pytest
import torch

from kgreasoner.retrieval.candidates import gather_candidates
from kgreasoner.retrieval.encoder import CachedEncoder, HashingEncoder
from kgreasoner.retrieval.ranker import GATRanker, RankerModelConfig
from kgreasoner.retrieval.ranking import CandidateScorer


class CountingEncoder(HashingEncoder):
    def __init__(self):
        super().__init__(16)
        self.calls: list[list[str]] = []

    def encode(self, texts):
        self.calls.append(list(texts))
        return super().encode(texts)


@pytest.mark.parametrize("method", ["gat", "embedding", "none"])
def test_batch_orders_equal_one_by_one_orders_with_two_encoder_calls(utah_kg, method):
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig(dim=16, hidden=8, head_hidden=4, dropout=0.0)).eval()
    requests = [
        ("what time zone is utah in?", gather_candidates(utah_kg, "m.utah"), None),  # 6 candidates: a hub at pool 3
        ("who holds office in utah?", gather_candidates(utah_kg, "m.cvt"), None),
        ("where is salt lake city?", gather_candidates(utah_kg, "m.slc"), None),
        ("nothing here", [], None),
    ]

    def scorer(encoder):
        return CandidateScorer(
            method,
            utah_kg,
            encoder=CachedEncoder(encoder) if method != "none" else None,
            model=model if method == "gat" else None,
            rerank_pool=3,
        )

    single_encoder, batch_encoder = CountingEncoder(), CountingEncoder()
    single = [scorer(single_encoder).order(q, c, kg) for q, c, kg in requests]
    batched = scorer(batch_encoder).order_batch(requests)
    assert batched == single
    assert [len(order) for order in batched] == [6, 3, 2, 0]
    if method == "none":
        assert batched == [list(range(6)), list(range(3)), list(range(2)), []]
    else:
        assert len(batch_encoder.calls) == 2 and len(single_encoder.calls) > 2
        # the first call holds the questions and the hub's relation texts, the second all the rest
        assert batch_encoder.calls[0][:3] == [q for q, _, _ in requests[:3]]
        assert sorted(sum(batch_encoder.calls, [])) == sorted(set(sum(single_encoder.calls, [])))
