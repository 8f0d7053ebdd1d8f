"""The weights TRL's sync sends to vLLM: a shrunk Qwen3-MoE of the released architecture (the
Qwen3-30B-A3B config.json with a small body), random weights, real transformers modeling.

vLLM cannot run here. What its Qwen3-MoE loader takes is pinned below from its source, and
`RecordingLLM` (a test double) stands in for the engine TRL loads the weights into.
"""

from __future__ import annotations

import copy
import json
import types

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from kgreasoner.records.paths import repo_root
from kgreasoner.training.trl_internals import send_unfused_experts
from kgreasoner.training.vllm_weights import vllm_named_weights

MODELS = repo_root().parent / "shared" / "models"
pytestmark = pytest.mark.skipif(
    not (MODELS / "qwen3" / "configs").is_dir(),
    reason=f"the shared models folder {MODELS} (released Qwen3 configs) is not here",
)
SHRUNK = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 256,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
LAYERS, HIDDEN, MOE_INTERMEDIATE, EXPERTS = 2, 32, 16, 4


def vllm_expert_params_mapping(num_experts: int) -> list[tuple[str, str, int, str]]:
    """vLLM's `FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", num_experts)`, as
    `Qwen3MoeModel.get_expert_mapping` calls it: (param_name, weight_name, expert_id, shard_id).

    Read from vllm-project/vllm, vllm/model_executor/models/qwen3_moe.py (`Qwen3MoeModel.load_weights`,
    `get_expert_mapping`) and vllm/model_executor/layers/fused_moe/layer.py, at commit 2e0831b0ab95,
    the newest copy available here, for the vLLM 0.22-0.31 that TRL 1.16 supports. These per-expert names
    are the released Qwen3-30B-A3B checkpoint's, which every vLLM version loads. The loader picks the
    first entry whose `weight_name` is in the sent name; its weight loader copies a [I, H] tensor into
    the gate (w1) or up (w3) half of the expert's w13 and a [H, I] one into its w2 (`nn.Linear` layout,
    no transpose; tensor parallelism narrows dim 0 of w1/w3 and dim 1 of w2).
    """
    return [
        (
            "experts.w13_" if name in ("gate_proj", "up_proj") else "experts.w2_",
            f"experts.{expert}.{name}.",
            expert,
            shard,
        )
        for expert in range(num_experts)
        for shard, name in [("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")]
    ]


SHARD_SHAPES = {"w1": (MOE_INTERMEDIATE, HIDDEN), "w3": (MOE_INTERMEDIATE, HIDDEN), "w2": (HIDDEN, MOE_INTERMEDIATE)}
PINNED_EXPERT_WEIGHTS = [  # the shrunk model's experts as they must be sent: per layer, gate and up of each
    # expert (from the fused gate_up_proj), then down of each (from down_proj)
    (f"model.layers.{layer}.mlp.experts.{expert}.{name}.weight", shape)
    for layer in range(LAYERS)
    for projections in ([("gate_proj", (16, 32)), ("up_proj", (16, 32))], [("down_proj", (32, 16))])
    for expert in range(EXPERTS)
    for name, shape in projections
]


def vllm_dispatch(name: str) -> tuple[str, int, str] | None:
    """Where vLLM's Qwen3-MoE loader puts an expert weight: (parameter, expert, shard); None for the rest."""
    if "mlp.experts" not in name:
        return None
    for param_name, weight_name, expert, shard in vllm_expert_params_mapping(EXPERTS):
        if weight_name in name:
            return name.replace(weight_name, param_name), expert, shard
    raise AssertionError(f"{name}: vLLM's Qwen3-MoE loader has no mapping for this expert weight")


def build(config_name: str, seed: int = 0):
    config = AutoConfig.from_pretrained(MODELS / "qwen3" / "configs" / config_name, **SHRUNK)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


@pytest.fixture(scope="module")
def moe():
    return build("Qwen3-30B-A3B")


def test_transformers_keeps_the_released_qwen3_moe_experts_fused():
    raw = json.loads((MODELS / "qwen3" / "configs" / "Qwen3-30B-A3B" / "config.json").read_text())
    config = AutoConfig.from_pretrained(MODELS / "qwen3" / "configs" / "Qwen3-30B-A3B", num_hidden_layers=1)
    with torch.device("meta"):  # one layer of the released sizes
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters() if ".layers.0.mlp." in name}
    experts, hidden, inner = raw["num_experts"], raw["hidden_size"], raw["moe_intermediate_size"]
    assert shapes == {
        "model.layers.0.mlp.experts.gate_up_proj": (experts, 2 * inner, hidden),
        "model.layers.0.mlp.experts.down_proj": (experts, hidden, inner),
        "model.layers.0.mlp.gate.weight": (experts, hidden),
    }
    assert shapes["model.layers.0.mlp.experts.gate_up_proj"] == (128, 1536, 2048)


def test_fused_experts_go_out_under_the_names_and_shapes_of_vllms_qwen3_moe_loader(moe):
    sent = list(vllm_named_weights(moe.named_parameters(), moe.config.model_type))
    experts = [(name, tuple(tensor.shape)) for name, tensor in sent if "mlp.experts" in name]
    assert experts == PINNED_EXPERT_WEIGHTS
    for name, shape in experts:
        param, expert, shard = vllm_dispatch(name)
        assert param.endswith(("mlp.experts.w13_weight", "mlp.experts.w2_weight"))
        assert f".experts.{expert}." in name and shape == SHARD_SHAPES[shard]
    # everything else goes as it is, the same tensors
    fused = {"gate_up_proj", "down_proj"}
    rest = [(name, p) for name, p in moe.named_parameters() if name.rsplit(".", 1)[-1] not in fused]
    assert [(n, t) for n, t in sent if "mlp.experts" not in n] == rest


def test_unfused_experts_reassemble_to_the_fused_ones_exactly(moe):
    sent = dict(vllm_named_weights(moe.named_parameters(), moe.config.model_type))
    for layer in range(LAYERS):
        experts = moe.model.layers[layer].mlp.experts
        at = f"model.layers.{layer}.mlp.experts"
        gate_up = torch.stack(
            [torch.cat([sent[f"{at}.{e}.gate_proj.weight"], sent[f"{at}.{e}.up_proj.weight"]]) for e in range(EXPERTS)]
        )
        down = torch.stack([sent[f"{at}.{e}.down_proj.weight"] for e in range(EXPERTS)])
        assert torch.equal(gate_up, experts.gate_up_proj) and torch.equal(down, experts.down_proj)


def test_the_gate_half_is_what_the_forward_gates_with(moe):
    """The first half of each expert's gate_up rows goes through the activation, so it is the gate_proj."""
    experts = copy.deepcopy(moe.model.layers[0].mlp.experts).float()  # bf16 as released; float for the check
    at = "model.layers.0.mlp.experts"
    sent = dict(vllm_named_weights([(f"{at}.{n}", p) for n, p in experts.named_parameters()], "qwen3_moe"))
    x = torch.randn(3, HIDDEN)
    with torch.no_grad():
        fused = experts(x, torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1))  # every token to expert 0
        gate, up, down = (sent[f"{at}.0.{name}.weight"] for name in ("gate_proj", "up_proj", "down_proj"))
        unfused = torch.nn.functional.linear(experts.act_fn(x @ gate.T) * (x @ up.T), down)
    torch.testing.assert_close(fused, unfused)


def test_what_is_sent_is_the_checkpoint_save_pretrained_writes(moe, tmp_path):
    """The released checkpoints' layout, which vLLM loads from disk: the same names, shapes and values."""
    moe.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    sent = dict(vllm_named_weights(moe.named_parameters(), moe.config.model_type))
    assert sorted(sent) == sorted(saved)
    assert all(torch.equal(sent[name], saved[name]) for name in saved)


def test_a_model_without_fused_experts_goes_as_it_is():
    dense = build("Qwen3-0.6B")
    params = list(dense.named_parameters())
    assert list(vllm_named_weights(params, dense.config.model_type)) == params


def test_fused_experts_of_an_unknown_layout_are_refused():
    tensor = torch.zeros(2, 8, 4)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts.gate_up_proj: model type 'other_moe' keeps"):
        list(vllm_named_weights([("model.layers.0.mlp.experts.gate_up_proj", tensor)], "other_moe"))


class RecordingLLM:
    """Stands in for `vllm.LLM` (a test double: vLLM cannot run here) where TRL's colocated sync loads weights:
    `llm_engine.model_executor.driver_worker.model_runner.model.load_weights` records each (name, copy)."""

    def __init__(self):
        self.loaded: list[tuple[str, torch.Tensor]] = []
        model = types.SimpleNamespace(load_weights=lambda pairs: self.loaded.extend((n, t.clone()) for n, t in pairs))
        runner = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=model))
        self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(driver_worker=runner))
        self.prefix_cache_resets = 0

    def reset_prefix_cache(self):
        self.prefix_cache_resets += 1


def trl_generation(model, monkeypatch):
    """TRL's own `VLLMGeneration` (colocate mode) on the model, its vLLM start-up skipped (no vLLM here)."""
    from accelerate import Accelerator
    from trl.generation.vllm_generation import VLLMGeneration

    monkeypatch.setattr(VLLMGeneration, "_init_vllm", lambda self: None)
    generation = VLLMGeneration(model=model, accelerator=Accelerator(cpu=True), processing_class=None, mode="colocate")
    generation.llm = RecordingLLM()
    return generation


def test_trls_sync_sends_the_experts_unfused_once_hooked(moe, monkeypatch):
    generation = trl_generation(moe, monkeypatch)
    generation.sync_weights()  # TRL as it is: the fused names, which vLLM's loader has no mapping for
    assert "model.layers.0.mlp.experts.gate_up_proj" in [name for name, _ in generation.llm.loaded]

    generation = trl_generation(moe, monkeypatch)
    send_unfused_experts(types.SimpleNamespace(vllm_generation=generation))
    generation.sync_weights()
    loaded = generation.llm.loaded
    assert [(n, tuple(t.shape)) for n, t in loaded if "mlp.experts" in n] == PINNED_EXPERT_WEIGHTS
    expected = dict(vllm_named_weights(moe.named_parameters(), moe.config.model_type))
    assert [name for name, _ in loaded] == list(expected)
    assert all(torch.equal(tensor, expected[name]) for name, tensor in loaded)
    assert generation.llm.prefix_cache_resets == 1


def test_the_hook_refuses_fused_experts_it_cannot_unfuse(moe, monkeypatch):
    generation = trl_generation(moe, monkeypatch)
    monkeypatch.setattr(moe.config, "model_type", "other_moe")
    with pytest.raises(ValueError, match="model type 'other_moe' keeps its experts fused"):
        send_unfused_experts(types.SimpleNamespace(vllm_generation=generation))


class CountingLLM(RecordingLLM):
    """`RecordingLLM` that keeps, per `load_weights` call, only the names it was given (no copies): the released
    30B-A3B layout on the meta device has no values to copy."""

    def __init__(self):
        super().__init__()
        self.calls: list[list[str]] = []
        self.llm_engine.model_executor.driver_worker.model_runner.model.load_weights = lambda pairs: self.calls.append(
            [name for name, _ in pairs]
        )


def test_a_colocated_sync_loads_one_trainer_tensor_a_call(moe, monkeypatch):
    """Each `load_weights` call rebuilds vLLM's parameter map: the pairs of one trainer tensor go in one call,
    the same pairs, in the same order, as TRL's own sync sends one at a time."""
    generation = trl_generation(moe, monkeypatch)
    send_unfused_experts(types.SimpleNamespace(vllm_generation=generation))
    generation.llm = CountingLLM()
    generation.sync_weights()
    calls = generation.llm.calls
    assert len(calls) == len(list(moe.named_parameters()))
    at = "model.layers.0.mlp.experts"
    assert [f"{at}.{e}.{p}.weight" for e in range(EXPERTS) for p in ("gate_proj", "up_proj")] in calls
    assert [f"{at}.{e}.down_proj.weight" for e in range(EXPERTS)] in calls
    assert [name for call in calls for name in call] == [
        n for n, _ in vllm_named_weights(moe.named_parameters(), "qwen3_moe")
    ]
    assert generation.llm.prefix_cache_resets == 1


def test_the_released_30b_a3b_layout_syncs_in_531_calls_not_18867(monkeypatch):
    """Qwen3-30B-A3B as released (48 layers of 128 experts; the meta device: shapes, no weights): 531 trainer
    tensors, 18,867 names once its experts are unfused. TRL's sync made one call a name."""
    config = AutoConfig.from_pretrained(MODELS / "qwen3" / "configs" / "Qwen3-30B-A3B")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    generation = trl_generation(model, monkeypatch)
    hooked = types.SimpleNamespace(vllm_generation=generation)
    names = [name for name, _ in vllm_named_weights(model.named_parameters(), config.model_type)]
    assert (
        len(names) == 48 * (128 * 3 + 9) + 3 == 18_867
    )  # per layer: experts, 4 projections, 2 norms, q/k norms, router
    send_unfused_experts(hooked)
    generation.llm = CountingLLM()
    generation.sync_weights()
    assert len(generation.llm.calls) == 48 * 11 + 3 == 531
    assert [name for call in generation.llm.calls for name in call] == names
