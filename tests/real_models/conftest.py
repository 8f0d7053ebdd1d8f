"""Real architectures, real vocabularies, random weights: every pipeline stage on Qwen3 and Llama 3.1.

The published tokenizers, chat templates and configs are in the shared models folder
(`<repo>/../shared/models`, beside a fresh clone); the tests skip, saying so, when it is absent.
A model is built from the released `config.json` with the body shrunk (2 layers, hidden 64,
intermediate 128, 2 query heads, 1 key/value head, head_dim 32) and the vocabulary kept whole, so
its embedding and LM head have the real 151,936 (Qwen3) or 128,256 (Llama) rows.

One model per architecture per session: built, then SFT-trained until it writes the two warm-up
trajectories of a four-triple KB by heart (`warm_checkpoint`). Greedy rollouts of that model then
retrace a known trajectory exactly, so GRPO, eval, serve and export are checked on exact ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kgreasoner.records.paths import repo_root

ARCHITECTURES = {"qwen3": "qwen3/configs/Qwen3-0.6B/config.json", "llama3.1": "llama3.1/config.json"}
END_OF_TURN = {"qwen3": ("<|im_end|>", 151645), "llama3.1": ("<|eot_id|>", 128009)}
SHRUNK = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 2048,
}
QWEN3_THINK, QWEN3_THINK_END = 151667, 151668

KB = [
    ("Utah", "time zone", "Mountain Time Zone"),
    ("Utah", "capital", "Salt Lake City"),
    ("France", "capital", "Paris"),
    ("France", "currency", "Euro"),
]
QUESTIONS = [
    ("q1", "what time zone is utah in", "Utah", "Mountain Time Zone"),
    ("q2", "what is the capital of france", "France", "Paris"),
]
TOOL = {"entity_handles": False, "top_k": 5}
SFT_STEPS = 100


def models_dir() -> Path | None:
    root = repo_root().parent / "shared" / "models"
    ok = all((root / name / "tokenizer.json").is_file() for name in ARCHITECTURES)
    return root if ok else None


MODELS = models_dir()


def pytest_collection_modifyitems(config, items):
    if MODELS is not None:
        return
    skip = pytest.mark.skip(
        reason=f"the shared models folder {repo_root().parent / 'shared' / 'models'} "
        "(released Qwen3 and Llama 3.1 tokenizers and configs) is not on this machine"
    )
    for item in items:
        if "real_models" in str(item.fspath):
            item.add_marker(skip)


def tokenizer_of(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODELS / name)


def build_random_checkpoint(name: str, out: Path) -> Path:
    """The released config of `name` with its body shrunk, random weights, the real tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    raw = json.loads((MODELS / ARCHITECTURES[name]).read_text())
    raw.update(SHRUNK)
    raw.pop("torch_dtype", None)
    raw.pop("dtype", None)
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generation = json.loads((MODELS / name / "generation_config.json").read_text())
    model.generation_config = GenerationConfig(
        eos_token_id=generation["eos_token_id"],
        pad_token_id=generation.get("pad_token_id"),
        bos_token_id=generation.get("bos_token_id"),
    )
    model.save_pretrained(out)
    tokenizer_of(name).save_pretrained(out)
    return out


@pytest.fixture(scope="session", params=list(ARCHITECTURES))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> Path:
    """A dataset folder (kb.tsv + questions.jsonl): both questions in train, dev and test."""
    root = tmp_path_factory.mktemp("real_world")
    (root / "kb.tsv").write_text("".join(f"{s}\t{r}\t{o}\n" for s, r, o in KB), encoding="utf-8")
    rows = []
    for split in ("train", "dev", "test"):
        for qid, question, topic, answer in QUESTIONS:
            rows.append(
                {
                    "id": f"{qid}-{split}",
                    "question": question,
                    "topic_entities": [{"id": topic, "name": topic}],
                    "answers": [{"id": answer, "name": answer, "aliases": []}],
                    "gold_paths": [],
                    "hops": 1,
                    "source": "test",
                    "split": split,
                }
            )
    (root / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


def warmup_records(world: Path):
    """One trajectory per question; the tool block is what the real tool prints for its search."""
    from kgreasoner.kg.open import open_kg
    from kgreasoner.protocol import format_tool_block
    from kgreasoner.records.schema import TopicEntity
    from kgreasoner.records.trajectories import Segment, WarmupRecord
    from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

    tool = KGSearchTool(open_kg(f"memory:{world}"), ToolConfig(**TOOL))
    records = []
    for qid, question, topic, answer in QUESTIONS:
        block = format_tool_block(tool.session(question, [TopicEntity(topic, topic)]).call(topic).text)
        records.append(
            WarmupRecord(
                id=f"{qid}-train",
                question=question,
                topic_entities=(TopicEntity(topic, topic),),
                segments=(
                    Segment(f"<think> I search {topic}. <search>{topic}</search>", True),
                    Segment(block, False),
                    Segment(f"So it is {answer}. </think>\n<answer>{answer}</answer>", True),
                ),
                hops=1,
            )
        )
    return records


@pytest.fixture(scope="session")
def random_checkpoint(arch, tmp_path_factory) -> Path:
    return build_random_checkpoint(arch, tmp_path_factory.mktemp(f"random-{arch}"))


@pytest.fixture(scope="session")
def warm_checkpoint(arch, random_checkpoint, world, tmp_path_factory) -> Path:
    """`random_checkpoint` SFT-trained on the two warm-up trajectories until it writes them greedily."""
    from kgreasoner.records.trajectories import write_warmup
    from kgreasoner.training.sft import SFTRecipe, train_sft

    root = tmp_path_factory.mktemp(f"sft-{arch}")
    train_file = write_warmup(warmup_records(world), root / "warmup.jsonl")
    recipe = SFTRecipe(
        model=str(random_checkpoint),
        train_file=str(train_file),
        run_dir=str(root / "out"),
        trainer={
            "learning_rate": 1e-2,
            "max_steps": SFT_STEPS,
            "per_device_train_batch_size": 2,
            "lr_scheduler_type": "constant",
            "warmup_steps": 0.0,
            "eval_steps": 0,
            "save_steps": SFT_STEPS,
            "logging_steps": SFT_STEPS,
            "report_to": [],
            "train_sampling_strategy": "random",
        },
    )
    return train_sft(recipe)
