"""Export for `vllm serve`: a LoRA adapter merged into its base gives the adapted model's logits."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from kgreasoner.cli import main
from kgreasoner.protocol import ANSWER_CLOSE, TAGS
from kgreasoner.serving.export import export_checkpoint


@pytest.fixture(scope="module")
def adapter(checkpoint, tmp_path_factory):
    """A LoRA adapter with random (non-zero) weights on the tiny checkpoint, saved with its tokenizer."""
    out = tmp_path_factory.mktemp("adapter")
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    model = get_peft_model(
        base,
        LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "down_proj"],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    )
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(out)
    return out


def _logits(path, ids):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_adapter_is_merged_into_a_servable_directory(adapter, checkpoint, tmp_path):
    out = tmp_path / "exported"
    manifest = export_checkpoint(adapter, out)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "export.json"} <= names
    assert not any(name.startswith("adapter_") for name in names)
    assert manifest["merged_adapter"] and manifest["base"] == str(checkpoint)
    assert manifest["probe_max_logit_difference"] < 1e-4
    assert manifest["single_token_tags"] == {tag: True for tag in TAGS}

    tokenizer = AutoTokenizer.from_pretrained(out)
    stops = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert stops == [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids(ANSWER_CLOSE)]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["head_dim"] >= 32

    ids = tokenizer("<think><search>E1</search>", add_special_tokens=False, return_tensors="pt")["input_ids"]
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32), adapter)
    with torch.no_grad():
        expected = adapted.eval()(input_ids=ids).logits
    exported = _logits(out, ids)
    assert torch.allclose(exported, expected, atol=1e-4)
    assert not torch.allclose(exported, _logits(checkpoint, ids), atol=1e-3)  # the adapter changed the model


def test_export_command_copies_a_full_checkpoint_and_refuses_bad_targets(checkpoint, tmp_path, capsys):
    out = tmp_path / "copy"
    assert main(["export", str(checkpoint), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"export: {checkpoint} -> {out} (copied checkpoint); stop ids [")
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(_logits(out, ids), _logits(checkpoint, ids))
    capsys.readouterr()  # transformers' loading bars

    assert main(["export", str(checkpoint), "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"kgreasoner export: error: {out} exists and is not empty; choose a new --out\n"
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "x"), "--base", str(checkpoint)]) == 1
    assert "--base is only for LoRA adapters" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "y")]) == 1
    assert "is not a checkpoint directory" in capsys.readouterr().err
