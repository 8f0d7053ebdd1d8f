"""A full fine-tune outside DeepSpeed keeps float32 master weights under bf16 autocast (mixed precision), in
SFT and GRPO alike, whatever dtype the checkpoint was saved in; training all weights in bfloat16 with no
master copy is refused, naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kgreasoner.config import ConfigError, load_config
from kgreasoner.records.trajectories import write_warmup
from kgreasoner.training.common import policy_dtype
from kgreasoner.training.grpo import GRPORecipe
from kgreasoner.training.sft import SFTRecipe, train_sft

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def bf16_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny model saved in bfloat16, as the released checkpoints are."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bf16") / "model"
    AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(out)
    return out


@pytest.mark.parametrize(
    ("choice", "bf16", "deepspeed", "lora", "loaded"),
    [
        ("auto", True, None, False, "float32"),  # full fine-tune, no DeepSpeed: float32 masters
        ("auto", True, "zero3.json", False, "bfloat16"),  # DeepSpeed keeps the masters
        ("auto", True, None, True, "bfloat16"),  # LoRA: a frozen base, float32 adapters
        ("auto", False, "zero3.json", False, "float32"),
        ("float32", True, "zero3.json", False, "float32"),
        ("bfloat16", True, None, True, "bfloat16"),
    ],
)
def test_the_dtype_the_policy_loads_in(choice, bf16, deepspeed, lora, loaded):
    assert policy_dtype(choice, bf16, deepspeed, lora) == loaded


@pytest.mark.parametrize("recipe", [GRPORecipe, SFTRecipe])
def test_training_every_weight_in_bfloat16_is_refused_naming_the_setting(recipe):
    fields = ["model=m", "run_dir=o", "dataset=d" if recipe is GRPORecipe else "train_file=t"]
    message = "policy_dtype: bfloat16 trains every weight in bfloat16 with no float32 master .* set policy_dtype: auto"
    with pytest.raises(ConfigError, match=message):
        load_config(recipe, None, [*fields, "trainer.bf16=true", "policy_dtype=bfloat16"])
    with pytest.raises(
        ConfigError, match=r"policy_dtype must be one of \('auto', 'float32', 'bfloat16'\), got 'fp16'"
    ):
        load_config(recipe, None, [*fields, "policy_dtype=fp16"])
    lora = load_config(recipe, None, [*fields, "trainer.bf16=true", "policy_dtype=bfloat16", "lora.enabled=true"])
    assert lora.weights_dtype() == "bfloat16"


@pytest.mark.slow
def test_grpo_under_the_gpu_recipe_without_deepspeed_keeps_float32_masters_and_computes_in_bf16(
    bf16_checkpoint, synthetic_dir, tmp_path
):
    """The Qwen3-8B GRPO recipe (bf16, lr 1e-6, activation checkpointing) without its DeepSpeed JSON, at CPU size,
    on a checkpoint saved in bfloat16: the policy and the optimiser's state are float32, and the loss's forward
    runs its matmuls in bfloat16."""
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
    from kgreasoner.training.grpo import build_trainer

    recipe = load_config(
        GRPORecipe,
        CONFIGS / "qwen3-8b" / "grpo.yaml",
        [
            f"model={bf16_checkpoint}",
            f"dataset={synthetic_dir}",
            f"run_dir={tmp_path / 'run'}",
            "trainer.deepspeed=null",
            "rollout_backend=hf",
            "episodes=[{data: all, max_steps: 1}]",
            "rollout.max_new_tokens=8",
            "rollout.max_turn_tokens=8",
            "rollout.max_turns=1",
            "trainer.num_generations=2",
            "trainer.per_device_train_batch_size=2",
            "trainer.gradient_accumulation_steps=1",
            "trainer.report_to=[]",
        ],
    )
    assert recipe.setting("bf16") and recipe.setting("learning_rate") == 1e-6
    dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
    tool = KGSearchTool(open_dataset_kg(dataset), ToolConfig(entity_handles=True, top_k=5))
    trainer = build_trainer(recipe, 1, recipe.episodes[0], dataset.split("train")[:2], recipe.model, tool)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    computed = []
    projection = trainer.model.model.layers[0].self_attn.q_proj
    projection.register_forward_hook(lambda module, args, out: computed.append((module.weight.dtype, out.dtype)))
    compute_loss = trainer._compute_loss
    in_loss = []

    def recording(model, inputs):
        in_loss.append(len(computed))
        return compute_loss(model, inputs)

    trainer._compute_loss = recording
    trainer.train()
    [start] = in_loss
    assert computed[start:] and set(computed[start:]) == {(torch.float32, torch.bfloat16)}
    states = [t for state in trainer.optimizer.state.values() for t in state.values() if t.dim() > 0]
    assert states and {t.dtype for t in states} == {torch.float32}


@pytest.mark.slow
def test_sft_under_the_gpu_recipe_without_deepspeed_moves_the_weights(bf16_checkpoint, records, tmp_path):
    """The Qwen3-8B SFT recipe (bf16, lr 1e-5) without its DeepSpeed JSON, on a checkpoint saved in bfloat16:
    three steps change most weights. Trained in bfloat16 itself, updates of 1e-5 round away."""
    from safetensors.torch import load_file

    train = [r.__class__(**{**r.__dict__, "id": f"{r.id}-{i}"}) for i in range(4) for r in records]
    recipe = load_config(
        SFTRecipe,
        CONFIGS / "qwen3-8b" / "sft.yaml",
        [
            f"model={bf16_checkpoint}",
            f"train_file={write_warmup(train, tmp_path / 'warmup.jsonl')}",
            f"run_dir={tmp_path / 'sft'}",
            "trainer.deepspeed=null",
            "trainer.max_steps=3",
            "trainer.gradient_accumulation_steps=1",
            "trainer.eval_steps=0",
            "trainer.save_steps=3",
            "trainer.report_to=[]",
        ],
    )
    assert recipe.setting("bf16") and recipe.setting("learning_rate") == 1e-5
    final = train_sft(recipe)
    before, after = load_file(bf16_checkpoint / "model.safetensors"), load_file(final / "model.safetensors")
    assert {t.dtype for t in after.values()} == {torch.float32}
    moved = sum(int((after[k] != before[k].float()).sum()) for k in before)
    assert moved / sum(t.numel() for t in before.values()) > 0.9


MODELS = Path(__file__).resolve().parents[3] / "shared" / "models"


@pytest.mark.skipif(not (MODELS / "qwen3" / "configs" / "Qwen3-8B").is_dir(), reason=f"{MODELS} absent")
def test_preflight_counts_the_float32_masters_outside_deepspeed(tmp_path):
    """The Qwen3-8B SFT recipe on one GPU without DeepSpeed holds its weights in float32: twice the bytes of the
    bf16 weights ZeRO-2 holds (its masters sit in the optimiser row)."""
    from kgreasoner.training.preflight import GIB, Report, check_recipe

    def weights(*overrides: str) -> tuple[float, str]:
        recipe = load_config(SFTRecipe, CONFIGS / "qwen3-8b" / "sft.yaml", [f"run_dir={tmp_path}", *overrides])
        report = Report("sft")
        check_recipe(recipe, "sft", 1, 80 * GIB, MODELS / "qwen3" / "configs" / "Qwen3-8B", report)
        assert report.estimate is not None, report.problems
        [row] = [row for row in report.estimate.rows if row.name == "weights"]
        return row.size, row.note

    zero2, zero2_note = weights()
    alone, alone_note = weights("trainer.deepspeed=null")
    assert alone == 2 * zero2
    assert alone_note.endswith("B x 4 B") and zero2_note.endswith("B x 2 B")
