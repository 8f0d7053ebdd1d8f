import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    Qwen3ForCausalLM,
)

from kgreasoner.config import ConfigError, load_config
from kgreasoner.models import (
    TinyModelConfig,
    build_tiny,
    build_tiny_model,
    ensure_pad_token,
    load_model_and_tokenizer,
    main,
    parameter_counts,
)
from kgreasoner.protocol import ANSWER_CLOSE
from kgreasoner.tokenizer import EOS_TOKEN, PAD_TOKEN, TokenizerConfig, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["what timezone is Utah in", "Utah", "Mountain Time Zone", "time zone", "Salt Lake City"]
SAMPLE = "<think> <search>Utah</search>\n<triples>\n(E1 Utah, time zone, E2 Mountain Time Zone)\n</triples>"


def small(**changes) -> TinyModelConfig:
    base = TinyModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=256,
        tokenizer=TokenizerConfig(num_handles=16),
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, TokenizerConfig(num_handles=16))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    model, tokenizer = build_tiny(small(), TEXTS, out)
    return out, model, tokenizer


def test_saved_checkpoint_loads_with_auto_classes_and_same_logits(saved):
    out, model, tokenizer = saved
    assert (out / "model.safetensors").is_file() and not (out / "pytorch_model.bin").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    loaded_tok = AutoTokenizer.from_pretrained(out)
    assert isinstance(loaded, Qwen3ForCausalLM)
    ids = tokenizer.encode(SAMPLE, add_special_tokens=False)
    assert loaded_tok.encode(SAMPLE, add_special_tokens=False) == ids
    assert loaded_tok.decode(ids) == SAMPLE
    assert loaded_tok.chat_template == tokenizer.chat_template
    batch = torch.tensor([ids])
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(batch).logits, loaded(batch).logits)
    assert loaded.generation_config.eos_token_id == [
        tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        tokenizer.convert_tokens_to_ids(ANSWER_CLOSE),
    ]
    assert loaded.generation_config.pad_token_id == tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    assert loaded.config.vocab_size == len(tokenizer)
    recipe = yaml.safe_load((out / "tiny_model.yaml").read_text())
    assert recipe["head_dim"] == 32 and recipe["tokenizer"]["num_handles"] == 16


def test_load_model_and_tokenizer_from_a_local_path(saved):
    out, _, tokenizer = saved
    model, loaded_tok = load_model_and_tokenizer(out, dtype="bfloat16", padding_side="left")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert not model.training
    assert loaded_tok.padding_side == "left"
    assert loaded_tok.pad_token == PAD_TOKEN and model.config.pad_token_id == loaded_tok.pad_token_id
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model_and_tokenizer(out, dtype="float8")
    with pytest.raises(FileNotFoundError, match="cannot load model .*no-such-model"):
        load_model_and_tokenizer(out.parent / "no-such-model")


def test_ensure_pad_token_prefers_a_reserved_token_over_eos():
    backend = train_tokenizer(["x"], TokenizerConfig(num_handles=0)).backend_tokenizer
    fast = type(train_tokenizer(["x"], TokenizerConfig(num_handles=0)))
    no_pad = fast(tokenizer_object=backend, eos_token=EOS_TOKEN)
    assert no_pad.pad_token is None
    assert ensure_pad_token(no_pad).pad_token == PAD_TOKEN
    # the only candidate is the eos itself: fall back to eos
    assert ensure_pad_token(fast(tokenizer_object=backend, eos_token=PAD_TOKEN)).pad_token == PAD_TOKEN
    assert ensure_pad_token(fast(tokenizer_object=backend)).pad_token == PAD_TOKEN  # no eos at all
    bare = fast(tokenizer_object=Tokenizer(WordLevel({"a": 0, "b": 1}, unk_token="a")))
    with pytest.raises(ValueError, match="has neither a pad nor an eos token"):
        ensure_pad_token(bare)


def test_seeded_build_is_deterministic(tokenizer):
    first = build_tiny_model(small(seed=3), tokenizer).state_dict()
    second = build_tiny_model(small(seed=3), tokenizer).state_dict()
    other = build_tiny_model(small(seed=4), tokenizer).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_forward_backward_step(tokenizer):
    model = build_tiny_model(small(), tokenizer)
    ids = torch.tensor([tokenizer.encode(SAMPLE, add_special_tokens=False)])
    loss = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_llama_architecture(tokenizer):
    model = build_tiny_model(small(architecture="llama", tie_word_embeddings=False), tokenizer)
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.head_dim == 32 and model.config.bos_token_id is None
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, len(tokenizer))


def test_parameter_counts_of_the_tiny_cpu_recipe(tokenizer):
    config = load_config(TinyModelConfig, REPO / "configs/tiny-cpu/model.yaml")
    assert (
        config.architecture,
        config.hidden_size,
        config.num_layers,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.intermediate_size,
    ) == ("qwen3", 256, 4, 4, 2, 64, 768)
    counts = parameter_counts(build_tiny_model(config, tokenizer))
    # per layer: q 256x256, k and v 256x128, o 256x256, MLP 3x256x768, norms 2x256 + 2x64; final norm 256
    assert counts["non_embedding"] == 4 * (65536 + 2 * 32768 + 65536 + 3 * 196608 + 512 + 128) + 256
    assert counts["embeddings"] == len(tokenizer) * 256  # tied: counted once
    assert counts["total"] == counts["non_embedding"] + counts["embeddings"]


def test_small_head_dim_is_a_config_error_naming_the_field(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("head_dim: 16\n")
    with pytest.raises(ConfigError, match=r"model\.yaml: head_dim must be >= 32 .*got 16"):
        load_config(TinyModelConfig, path)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"architecture": "gpt2"}, "architecture must be one of"),
        ({"num_kv_heads": 3}, r"num_kv_heads \(3\) must divide num_heads \(4\)"),
        ({"num_layers": 0}, "num_layers must be >= 1"),
    ],
)
def test_bad_model_settings_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        TinyModelConfig(**changes)


def test_nested_tokenizer_settings_from_yaml(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("tokenizer:\n  kind: bpe\n  vocab_size: 100\n")
    with pytest.raises(ConfigError, match="tokenizer.vocab_size must exceed"):
        load_config(TinyModelConfig, path)
    path.write_text("tokenizer:\n  kind: bpe\n  vocab_size: 500\n")
    assert load_config(TinyModelConfig, path).tokenizer == TokenizerConfig(kind="bpe", vocab_size=500)


def test_cli_builds_a_checkpoint(tmp_path, capsys):
    texts = tmp_path / "names.tsv"
    texts.write_text("m.1\tUtah\nm.2\tMountain Time Zone\n", encoding="utf-8")
    config = tmp_path / "model.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "hidden_size": 64,
                "num_layers": 1,
                "num_heads": 2,
                "num_kv_heads": 1,
                "head_dim": 32,
                "intermediate_size": 64,
            }
        )
    )
    out = tmp_path / "ckpt"
    assert (
        main(
            [
                "build-tiny",
                "--config",
                str(config),
                "--set",
                "tokenizer.num_handles=4",
                "--texts",
                str(texts),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "without embeddings" in printed and f"saved to {out}" in printed
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.convert_ids_to_tokens(tok.encode("(E4 Utah", add_special_tokens=False)) == ["(", "E4", "ĠUtah"]
    assert main(["build-tiny", "--texts", str(tmp_path / "missing.tsv"), "--out", str(out)]) == 1
    assert "training text file not found" in capsys.readouterr().err


def test_generation_stops_right_after_answer_close(saved):
    out, _, tokenizer = saved
    model, tok = load_model_and_tokenizer(out)
    script = tok.encode("<answer>E3</answer> Utah Utah", add_special_tokens=False)

    class Forced(LogitsProcessor):
        """Forces `script`, so the stop is decided by the saved generation config alone."""

        def __call__(self, input_ids, scores):
            step = input_ids.shape[1] - prompt.shape[1]
            forced = torch.full_like(scores, float("-inf"))
            forced[:, script[step]] = 0.0
            return forced

    prompt = torch.tensor(
        [
            tok.apply_chat_template(
                [{"role": "user", "content": "Utah"}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        ]
    )
    generated = model.generate(
        prompt, logits_processor=LogitsProcessorList([Forced()]), max_new_tokens=8, do_sample=False
    )
    assert tok.decode(generated[0, prompt.shape[1] :]) == "<answer>E3</answer>"


def _broken_copy(saved_dir: Path, to: Path, damage: str) -> Path:
    import shutil

    shutil.copytree(saved_dir, to)
    weights = to / "model.safetensors"
    data = weights.read_bytes()
    if damage == "empty":
        weights.write_bytes(b"")
    elif damage == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "not_safetensors":
        weights.write_bytes(b"<html>404</html>" + data)
    return to


BROKEN_WEIGHTS = {
    "empty": "empty (0 bytes); save or copy the checkpoint again",
    "truncated": "truncated: {half:,} bytes where its header describes {whole:,}; save or copy the checkpoint again",
    "not_safetensors": "truncated or not safetensors: {bad:,} bytes, too few for its own header; "
    "save or copy the checkpoint again",
}


@pytest.mark.parametrize("damage", list(BROKEN_WEIGHTS))
@pytest.mark.parametrize("command", ["eval", "serve", "answer", "export"])
def test_a_broken_weight_file_is_refused_naming_it_by_every_command(
    command, damage, saved, synthetic_dir, tmp_path, capsys
):
    from kgreasoner.cli import main as cli

    whole = (saved[0] / "model.safetensors").stat().st_size
    model = _broken_copy(saved[0], tmp_path / "final", damage)
    args = {
        "eval": ["--methods", "kgreasoner", "--dataset", str(synthetic_dir), "--llm", f"hf:{model}"],
        "serve": ["--llm", f"hf:{model}", "--kg", str(synthetic_dir), "--port", "0"],
        "answer": [
            "--model",
            str(model),
            "--kg",
            str(synthetic_dir),
            "--question",
            "where is utah",
            "--topic",
            "Utah",
        ],
        "export": [str(model)],
    }[command]
    out = ["--out", str(tmp_path / "out")] if command in ("eval", "export") else []
    assert cli([command, *args, *out]) == 1
    what = BROKEN_WEIGHTS[damage].format(half=whole // 2, whole=whole, bad=whole + 16)
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"kgreasoner {command}: error: {model / 'model.safetensors'}: {what}"
    )


def test_a_sharded_checkpoint_missing_a_shard_is_refused_naming_it(saved, tmp_path):
    import json

    from kgreasoner.models import CheckpointError, check_weights

    model = _broken_copy(saved[0], tmp_path / "sharded", "none")
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    index = model / "model.safetensors.index.json"
    shards = {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors",
    }
    index.write_text(json.dumps({"weight_map": shards}))
    with pytest.raises(
        CheckpointError, match=f"^{index}: lists model-00002-of-00002.safetensors, which the checkpoint"
    ):
        check_weights(model)
    check_weights(saved[0])  # a whole checkpoint passes
