"""The question-conditioned graph-attention ranker (paper, Section 4.2) and its inputs.

For a question q and a candidate neighbour c of the searched entity, with c's own one-hop
context {(r_i, t_i)} (relations and neighbours of c, the edge back to the searched entity left
out) and h the candidate's own embedding:

    s_i = a(W_q q ; W_c (t_i ⊙ r_i))             attention logit of context edge i
    α_i = softmax_i(s_i)                         over c's context edges only
    ĥ   = σ(W_h [h ‖ Σ_i α_i t_i])               σ = ELU; an empty context sums to 0
    ŷ   = softmax(W_2 σ(W_1 ĥ + b_1) + b_2)      σ = ReLU; score = ŷ[1] ∈ (0, 1)

Trained with cross-entropy on relevant / irrelevant labels. Our choices where the paper is silent:
- Inputs are frozen text embeddings e(·) of dimension d (MiniLM: 384), conditioned on the
  question by φ_q(v) = [v ‖ q ⊙ v] (the second half sums to cos(q, v)):
  t_i = φ_q(e("relation_i neighbour_i")), r_i = φ_q(e("relation_i")),
  h = [φ_q(e(relation to c)) ‖ φ_q(e(label of c))].
- a(x ; y) = w_aᵀ LeakyReLU(A [x ‖ y ‖ x ⊙ y]). A linear `a` over the concatenation alone
  would add the same question term to every s_i, which softmax cancels (GATv1's static
  attention); the product term makes the weights depend on the question.
- W_q (d → k) and W_c (2d → k) are separate because their inputs differ in size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, TypedDict, overload

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import softmax as segment_softmax

from kgreasoner.retrieval.encoder import EncoderFields


@dataclass
class RankerModelConfig:
    """Sizes of the ranker network."""

    dim: int = field(default=384, metadata={"help": "text embedding size d (MiniLM: 384)"})
    hidden: int = field(default=128, metadata={"help": "attention and ĥ size k"})
    head_hidden: int = field(default=64, metadata={"help": "hidden size of the MLP head (W_1)"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on ĥ and the head's hidden layer"})
    negative_slope: float = field(default=0.2, metadata={"help": "LeakyReLU slope inside a(·)"})

    def __post_init__(self) -> None:
        if min(self.dim, self.hidden, self.head_hidden) < 1:
            raise ValueError("ranker model sizes must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ranker dropout must be in [0, 1), got {self.dropout}")


@dataclass
class RankerInputs:
    """A batch of candidates of one or more questions, as tensors of text embeddings.

    question: [Q, d]; cand_question: [C] index of each candidate's question;
    cand_relation / cand_entity: [C, d] embeddings of the relation text leading to the candidate
    and of its label; ctx_value / ctx_relation: [N, d] embeddings of each context edge's text
    ("relation neighbour") and of its relation; ctx_target: [N] the candidate each context edge
    belongs to (candidates may have none).
    """

    question: torch.Tensor
    cand_question: torch.Tensor
    cand_relation: torch.Tensor
    cand_entity: torch.Tensor
    ctx_value: torch.Tensor
    ctx_relation: torch.Tensor
    ctx_target: torch.Tensor

    @property
    def num_candidates(self) -> int:
        return int(self.cand_question.shape[0])


def condition(v: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """φ_q(v) = [v ‖ q ⊙ v]."""
    return torch.cat([v, q * v], dim=-1)


class QuestionConditionedAttention(MessagePassing):  # type: ignore[misc]  # torch_geometric ships no types
    """The attention layer: context edges (sources) -> candidates (targets), conditioned on q.

    Computes ĥ = σ(W_h [h ‖ Σ_i α_i t_i]) with the α_i of the module docstring. Like PyG's `GATConv`,
    the layer keeps no state between calls: pass `return_attention_weights=True` to get the α_i back.
    """

    def __init__(self, dim: int, hidden: int, negative_slope: float = 0.2) -> None:
        super().__init__(aggr="add", node_dim=0)
        self.W_q = nn.Linear(dim, hidden, bias=False)
        self.W_c = nn.Linear(2 * dim, hidden, bias=False)
        self.A = nn.Linear(3 * hidden, hidden)
        self.w_a = nn.Linear(hidden, 1, bias=False)
        self.W_h = nn.Linear(4 * dim + 2 * dim, hidden)
        self.negative_slope = negative_slope
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for layer in (self.W_q, self.W_c, self.A, self.w_a, self.W_h):
            layer.reset_parameters()

    @overload
    def forward(
        self,
        q_cand: torch.Tensor,
        h: torch.Tensor,
        t: torch.Tensor,
        r: torch.Tensor,
        ctx_target: torch.Tensor,
        return_attention_weights: Literal[False] = False,
    ) -> torch.Tensor: ...

    @overload
    def forward(
        self,
        q_cand: torch.Tensor,
        h: torch.Tensor,
        t: torch.Tensor,
        r: torch.Tensor,
        ctx_target: torch.Tensor,
        return_attention_weights: Literal[True],
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self,
        q_cand: torch.Tensor,
        h: torch.Tensor,
        t: torch.Tensor,
        r: torch.Tensor,
        ctx_target: torch.Tensor,
        return_attention_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """ĥ [C, k] from q_cand [C, d] the question per candidate, h [C, 4d], t and r [N, d], ctx_target [N];
        with `return_attention_weights`, also α [N]: each context edge's weight, summing to 1 over the
        edges of one candidate (a candidate without context has no edge and pools nothing)."""
        num_ctx, num_cand = t.shape[0], h.shape[0]
        edge_index = torch.stack([torch.arange(num_ctx, device=t.device), ctx_target])
        q_edge = q_cand[ctx_target]
        t_i, r_i = condition(t, q_edge), condition(r, q_edge)
        x, y = self.W_q(q_edge), self.W_c(t_i * r_i)
        s = self.w_a(F.leaky_relu(self.A(torch.cat([x, y, x * y], dim=-1)), self.negative_slope))
        alpha = segment_softmax(s, ctx_target, num_nodes=num_cand)
        pooled = self.propagate(edge_index, x=(t_i, None), alpha=alpha, size=(num_ctx, num_cand))
        out = F.elu(self.W_h(torch.cat([h, pooled], dim=-1)))
        return (out, alpha.squeeze(-1)) if return_attention_weights else out

    def message(self, x_j: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        return alpha * x_j

    def folded(self, inputs: RankerInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """ĥ and α of `forward` for scoring, with each question's terms folded into the weights.

        With u = t ⊙ r, t_i ⊙ r_i = [u ‖ q² ⊙ u], so W_c (t_i ⊙ r_i) = u M_q with
        M_q = W_c1ᵀ + diag(q²) W_c2ᵀ; likewise A [x ‖ y ‖ x ⊙ y] = x A_1ᵀ + y (A_2ᵀ + diag(x) A_3ᵀ) + b,
        Σ α_i t_i = [Σ α_i t ‖ q ⊙ Σ α_i t], and each [v ‖ q ⊙ v] block of W_h folds the same way.
        The per-edge work drops from 2d·k + 3k·k to d·k + k·k multiply-adds and no [N, 2d] or [N, 3k]
        concatenation is built; the weights depend on q only, so they are built once per question.
        """
        d, k = self.W_q.in_features, self.W_q.out_features
        question, cand_question, ctx_target = inputs.question, inputs.cand_question, inputs.ctx_target
        num_questions, num_cand = question.shape[0], inputs.num_candidates
        # Folded weights stay in nn.Linear's [out, in] layout: views of it need no copy.
        x = F.linear(question, self.W_q.weight)  # [Q, k]
        w_c = self.W_c.weight.view(k, 2, d)
        m = w_c[:, 0] + (question * question).unsqueeze(1) * w_c[:, 1]  # [Q, k, d]
        w_a = self.A.weight.view(k, 3, k)
        n = w_a[:, 1] + x.unsqueeze(1) * w_a[:, 2]  # [Q, k, k]
        const = F.linear(x, w_a[:, 0], self.A.bias)  # [Q, k]
        u = inputs.ctx_value * inputs.ctx_relation
        edge_question = cand_question[ctx_target]
        pre = u.new_empty((u.shape[0], k))
        for j, rows in _rows_by_question(edge_question, num_questions):
            pre[rows] = F.linear(F.linear(u[rows], m[j]), n[j], const[j])
        s = F.linear(F.leaky_relu(pre, self.negative_slope), self.w_a.weight)
        alpha = segment_softmax(s, ctx_target, num_nodes=num_cand)
        pooled = u.new_zeros((num_cand, d)).index_add_(0, ctx_target, alpha * inputs.ctx_value)
        # W_h's input is [rel ‖ q⊙rel ‖ ent ‖ q⊙ent ‖ Σαt ‖ q⊙Σαt]: three (v, q ⊙ v) pairs of blocks
        w_h = self.W_h.weight.view(k, 3, 2, d)
        g = (w_h[:, :, 0] + question.view(num_questions, 1, 1, d) * w_h[:, :, 1]).view(num_questions, k, 3 * d)
        parts = torch.cat([inputs.cand_relation, inputs.cand_entity, pooled], dim=-1)
        out = u.new_empty((num_cand, k))
        for j, rows in _rows_by_question(cand_question, num_questions):
            out[rows] = F.linear(parts[rows], g[j], self.W_h.bias)
        return F.elu(out), alpha.squeeze(-1)


def _rows_by_question(question_of_row: torch.Tensor, num_questions: int) -> Iterator[tuple[int, slice | torch.Tensor]]:
    """(question, rows) pairs: all rows at once for a single question, else an index per question."""
    if num_questions == 1:
        yield 0, slice(None)
        return
    for j in range(num_questions):
        yield j, (question_of_row == j).nonzero().squeeze(-1)


class GATRanker(nn.Module):
    """Attention layer plus the two-layer head; `forward` gives logits [C, 2], `score` ŷ[1]."""

    def __init__(self, config: RankerModelConfig) -> None:
        super().__init__()
        self.config = config
        self.attention = QuestionConditionedAttention(config.dim, config.hidden, config.negative_slope)
        self.W_1 = nn.Linear(config.hidden, config.head_hidden)
        self.W_2 = nn.Linear(config.head_hidden, 2)
        self.dropout = nn.Dropout(config.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.attention.reset_parameters()
        self.W_1.reset_parameters()
        self.W_2.reset_parameters()

    @overload
    def forward(self, inputs: RankerInputs, return_attention_weights: Literal[False] = False) -> torch.Tensor: ...

    @overload
    def forward(
        self, inputs: RankerInputs, return_attention_weights: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, inputs: RankerInputs, return_attention_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits [C, 2]; with `return_attention_weights`, also α [N] (`QuestionConditionedAttention.forward`)."""
        q_cand = inputs.question[inputs.cand_question]
        h = torch.cat([condition(inputs.cand_relation, q_cand), condition(inputs.cand_entity, q_cand)], dim=-1)
        h_hat, alpha = self.attention(
            q_cand, h, inputs.ctx_value, inputs.ctx_relation, inputs.ctx_target, return_attention_weights=True
        )
        hidden = self.dropout(F.relu(self.W_1(self.dropout(h_hat))))
        logits: torch.Tensor = self.W_2(hidden)
        return (logits, alpha) if return_attention_weights else logits

    @overload
    def score(self, inputs: RankerInputs, return_attention_weights: Literal[False] = False) -> torch.Tensor: ...

    @overload
    def score(
        self, inputs: RankerInputs, return_attention_weights: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def score(
        self, inputs: RankerInputs, return_attention_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """ŷ[1] per candidate without dropout, whatever the module's mode (`QuestionConditionedAttention.folded`);
        with `return_attention_weights`, also α [N] as `forward` gives it."""
        if inputs.num_candidates == 0:
            empty = inputs.question.new_zeros(0)
            return (empty, inputs.ctx_value.new_zeros(0)) if return_attention_weights else empty
        with torch.inference_mode():
            h_hat, alpha = self.attention.folded(inputs)
            hidden = F.relu(F.linear(h_hat, self.W_1.weight, self.W_1.bias))
            scores = torch.softmax(F.linear(hidden, self.W_2.weight, self.W_2.bias), dim=-1)[:, 1]
        return (scores, alpha) if return_attention_weights else scores


class RankerModelFields(TypedDict):
    """`RankerModelConfig` as `ranker.json` records it."""

    dim: int
    hidden: int
    head_hidden: int
    dropout: float
    negative_slope: float


class TrainedOn(TypedDict):
    """The data a ranker was trained on, as the trainer records it."""

    data: str
    split_scheme: str
    split_seed: int
    train_questions: int
    train_groups: int


class _RankerMetaModel(TypedDict):
    model: RankerModelFields


class RankerMeta(_RankerMetaModel, total=False):
    """`ranker.json`: `model` always (written by `save_ranker`), the rest as the trainer records it
    (a ranker saved by other code may record less): the encoder's fields, the context edges per
    candidate, and how training went (per split, method and metric)."""

    encoder: EncoderFields
    max_context: int
    trained_on: TrainedOn
    best_epoch: int
    train_seconds: float
    dev: dict[str, dict[str, float]]
    test: dict[str, dict[str, float]]


MODEL_FILE = "model.safetensors"
CONFIG_FILE = "ranker.json"


def save_ranker(model: GATRanker, folder: str | Path, meta: Mapping[str, object]) -> Path:
    """Weights as safetensors plus `ranker.json` (model config and whatever `meta` records)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / MODEL_FILE))
    (folder / CONFIG_FILE).write_text(
        json.dumps({"model": asdict(model.config), **meta}, indent=2) + "\n", encoding="utf-8"
    )
    return folder


def load_ranker(folder: str | Path) -> tuple[GATRanker, RankerMeta]:
    """A saved ranker in eval mode, and its `ranker.json` contents."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for needed in (MODEL_FILE, CONFIG_FILE):
        if not (folder / needed).is_file():
            raise FileNotFoundError(
                f"{folder}: missing {needed}; train one with `python train/ranker.py --config configs/ranker.yaml`"
            )
    meta: RankerMeta = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    try:
        config = RankerModelConfig(**meta["model"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"{folder / CONFIG_FILE}: field 'model' is missing or malformed ({err})") from err
    model = GATRanker(config)
    model.load_state_dict(load_file(str(folder / MODEL_FILE)))
    model.eval()
    return model, meta
