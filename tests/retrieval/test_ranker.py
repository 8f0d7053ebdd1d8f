"""The GAT ranker's equations: shapes, attention normalisation, empty contexts, a hand-computed case."""

from __future__ import annotations

import math

import pytest
import torch

from kgreasoner.retrieval.ranker import GATRanker, RankerInputs, RankerModelConfig, load_ranker, save_ranker


def random_inputs(d=8, seed=0) -> RankerInputs:
    g = torch.Generator().manual_seed(seed)
    return RankerInputs(
        question=torch.randn(2, d, generator=g),
        cand_question=torch.tensor([0, 0, 0, 1, 1]),
        cand_relation=torch.randn(5, d, generator=g),
        cand_entity=torch.randn(5, d, generator=g),
        ctx_value=torch.randn(7, d, generator=g),
        ctx_relation=torch.randn(7, d, generator=g),
        # candidate 1 and 4 have no context
        ctx_target=torch.tensor([0, 0, 0, 2, 3, 3, 3]),
    )


def test_shapes_and_attention_sums_to_one_per_candidate():
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig(dim=8, hidden=6, head_hidden=4, dropout=0.0))
    inputs = random_inputs()
    logits, alpha = model(inputs, return_attention_weights=True)
    assert logits.shape == (5, 2)
    assert alpha.shape == (7,)
    sums = torch.zeros(5).index_add_(0, inputs.ctx_target, alpha)
    assert torch.allclose(sums, torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]))
    assert torch.equal(model(inputs), logits)  # asked or not, the same logits
    scores, folded_alpha = model.score(inputs, return_attention_weights=True)
    assert scores.shape == (5,) and bool(((scores > 0) & (scores < 1)).all())
    assert torch.allclose(scores, torch.softmax(logits, -1)[:, 1])
    assert torch.allclose(folded_alpha, alpha, atol=1e-6)
    assert torch.equal(model.score(inputs), scores)


def test_attention_weights_are_returned_not_stored():
    """Like PyG's GATConv: the weights come back when asked and the module keeps nothing of a call."""
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig(dim=8, hidden=6, head_hidden=4, dropout=0.0))
    inputs = random_inputs()
    before = {name: value for name, value in vars(model.attention).items() if not name.startswith("_")}
    model(inputs)
    model.score(inputs, return_attention_weights=True)
    after = {name: value for name, value in vars(model.attention).items() if not name.startswith("_")}
    assert after.keys() == before.keys()
    assert not any(isinstance(value, torch.Tensor) for value in after.values())
    h_hat, alpha = model.attention(
        inputs.question[inputs.cand_question],
        torch.zeros(5, 32),
        inputs.ctx_value,
        inputs.ctx_relation,
        inputs.ctx_target,
        return_attention_weights=True,
    )
    assert h_hat.shape == (5, 6) and alpha.shape == (7,) and bool((alpha > 0).all())


def test_attention_depends_on_the_question():
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig(dim=8, hidden=6, head_hidden=4, dropout=0.0))
    inputs = random_inputs()
    _, first = model(inputs, return_attention_weights=True)
    inputs.question = torch.flip(inputs.question, dims=[0]) * 3
    _, second = model(inputs, return_attention_weights=True)
    assert not torch.allclose(first, second)


def test_candidates_are_scored_independently_of_batching():
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig(dim=8, hidden=6, head_hidden=4, dropout=0.0))
    inputs = random_inputs()
    together = model.score(inputs)
    alone = RankerInputs(
        question=inputs.question[1:],
        cand_question=torch.tensor([0, 0]),
        cand_relation=inputs.cand_relation[3:],
        cand_entity=inputs.cand_entity[3:],
        ctx_value=inputs.ctx_value[4:],
        ctx_relation=inputs.ctx_relation[4:],
        ctx_target=torch.tensor([0, 0, 0]),
    )
    assert torch.allclose(model.score(alone), together[3:], atol=1e-6)


def set_weights(model: GATRanker) -> None:
    """All-ones projections, zero biases, w_a = 1, W_1 = 1, W_2 = [[0], [0.1]]."""
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        att = model.attention
        for layer in (att.W_q, att.W_c, att.A, att.w_a, att.W_h):
            layer.weight.fill_(1.0)
        model.W_1.weight.fill_(1.0)
        model.W_2.weight.copy_(torch.tensor([[0.0], [0.1]]))


def test_tiny_case_computed_by_hand():
    model = GATRanker(RankerModelConfig(dim=1, hidden=1, head_hidden=1, dropout=0.0))
    set_weights(model)
    inputs = RankerInputs(
        question=torch.tensor([[2.0]]),
        cand_question=torch.tensor([0, 0]),
        cand_relation=torch.tensor([[1.0], [1.0]]),
        cand_entity=torch.tensor([[1.0], [1.0]]),
        ctx_value=torch.tensor([[1.0], [3.0]]),
        ctx_relation=torch.tensor([[1.0], [0.5]]),
        ctx_target=torch.tensor([0, 0]),
    )
    # φ_q(v) = [v, 2v]. Edge 1: t⊙r = [1,2]⊙[1,2] = [1,4] -> y = 5, x = W_q q = 2,
    # s = 2 + 5 + 10 = 17. Edge 2: [3,6]⊙[0.5,1] = [1.5,6] -> y = 7.5, s = 2 + 7.5 + 15 = 24.5.
    a1 = 1.0 / (1.0 + math.exp(7.5))
    # h = [1,2,1,2] sums to 6; Σα t = a1·[1,2] + (1-a1)·[3,6] sums to 9 - 6·a1. ELU of a positive is itself.
    h_hat = 6 + 9 - 6 * a1
    expected_first = 1 / (1 + math.exp(-0.1 * h_hat))
    # Candidate 2 has no context: ĥ = ELU(6) = 6.
    expected_second = 1 / (1 + math.exp(-0.6))
    scores, alpha = model.score(inputs, return_attention_weights=True)
    assert alpha.tolist() == pytest.approx([a1, 1 - a1], rel=1e-4)
    assert model(inputs, return_attention_weights=True)[1].tolist() == pytest.approx([a1, 1 - a1], rel=1e-4)
    assert scores.tolist() == pytest.approx([expected_first, expected_second], rel=1e-5)


def test_save_load_round_trip_and_reset(tmp_path):
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig(dim=8, hidden=6, head_hidden=4))
    inputs = random_inputs()
    save_ranker(model, tmp_path / "r", {"encoder": {"kind": "hashing"}})
    loaded, meta = load_ranker(tmp_path / "r")
    assert meta["encoder"] == {"kind": "hashing"} and meta["model"]["hidden"] == 6
    assert torch.equal(loaded.score(inputs), model.score(inputs))
    before = model.W_2.weight.clone()
    model.reset_parameters()
    assert not torch.equal(before, model.W_2.weight)
    with pytest.raises(FileNotFoundError, match="missing model.safetensors"):
        load_ranker(tmp_path)


def unit_rows(g: torch.Generator, n: int, d: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=-1)


@pytest.mark.parametrize("questions, candidates, edges", [(1, 64, 1024), (3, 40, 300), (2, 6, 0)])
def test_score_equals_the_forward_pass_in_eval_mode(questions, candidates, edges):
    """`score` folds each question into the weights; it must give what `forward` gives without dropout,
    in either mode, and leave the mode as it found it."""
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig())
    g = torch.Generator().manual_seed(1)
    d = model.config.dim
    inputs = RankerInputs(
        question=unit_rows(g, questions, d),
        cand_question=torch.randint(0, questions, (candidates,), generator=g),
        cand_relation=unit_rows(g, candidates, d),
        cand_entity=unit_rows(g, candidates, d),
        ctx_value=unit_rows(g, edges, d),
        ctx_relation=unit_rows(g, edges, d),
        ctx_target=torch.randint(0, candidates, (edges,), generator=g),
    )
    model.eval()
    with torch.no_grad():
        logits, expected_attention = model(inputs, return_attention_weights=True)
        expected = torch.softmax(logits, dim=-1)[:, 1]
    model.train()
    scores, attention = model.score(inputs, return_attention_weights=True)
    assert model.training
    assert (scores - expected).abs().max().item() <= 1e-6
    assert torch.allclose(attention, expected_attention, rtol=0.0, atol=1e-6)


def _on(inputs: RankerInputs, device: str) -> RankerInputs:
    return RankerInputs(**{name: value.to(device) for name, value in vars(inputs).items()})


def test_score_allocates_on_the_device_of_its_inputs():
    """A ranker on a GPU scores inputs on that GPU. The meta device stands in for it: a CPU buffer filled
    from meta tensors fails ("Cannot copy out of meta tensor"), as one filled from CUDA tensors does. One
    question, because splitting rows per question reads their values, which meta tensors do not have."""
    torch.manual_seed(0)
    model = GATRanker(RankerModelConfig(dim=8, hidden=6, head_hidden=4, dropout=0.0))
    inputs = random_inputs()
    one = RankerInputs(
        question=inputs.question[:1],
        cand_question=torch.zeros(3, dtype=torch.long),
        cand_relation=inputs.cand_relation[:3],
        cand_entity=inputs.cand_entity[:3],
        ctx_value=inputs.ctx_value[:4],
        ctx_relation=inputs.ctx_relation[:4],
        ctx_target=torch.tensor([0, 0, 0, 2]),
    )
    model.to("meta")
    scores = model.score(_on(one, "meta"))
    assert (scores.device.type, scores.shape, scores.dtype) == ("meta", (3,), torch.float32)
    empty = model.score(
        _on(
            RankerInputs(
                question=one.question,
                cand_question=torch.zeros(0, dtype=torch.long),
                cand_relation=torch.zeros(0, 8),
                cand_entity=torch.zeros(0, 8),
                ctx_value=torch.zeros(0, 8),
                ctx_relation=torch.zeros(0, 8),
                ctx_target=torch.zeros(0, dtype=torch.long),
            ),
            "meta",
        )
    )
    assert (empty.device.type, empty.shape) == ("meta", (0,))
