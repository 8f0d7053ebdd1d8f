"""Training the ranker on synthetic data: it must beat the no-context baseline, fast. Training length is a count
of epochs, never a clock, so the figures are the same on a busy machine."""

from __future__ import annotations

import numpy as np
import pytest

from data_gen.synthetic import write_synthetic
from kgreasoner.config import ConfigError, load_config
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import read_jsonl
from kgreasoner.retrieval.encoder import EncoderConfig
from kgreasoner.retrieval.ranker import RankerModelConfig
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.retrieval.training import (
    RankerTrainConfig,
    evaluate_saved,
    format_table,
    ranking_metrics,
    train_ranker,
)


def test_ranking_metrics_by_hand():
    scores = [np.array([0.1, 0.9, 0.5]), np.array([1.0, 1.0, 0.0])]
    labels = [np.array([0, 0, 1]), np.array([0, 1, 0])]
    # Group 1: the positive ranks 2nd. Group 2: a tie keeps KG order, so the positive ranks 2nd too.
    assert ranking_metrics(scores, labels, [1, 3]) == {"recall@1": 0.0, "recall@3": 1.0, "mrr": 0.5, "groups": 2.0}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("synthetic"), seed=0)


@pytest.fixture(scope="module")
def trained(synthetic, tmp_path_factory):
    config = RankerTrainConfig(
        data=str(synthetic),
        encoder=EncoderConfig(kind="hashing", hashing_dim=128),
        model=RankerModelConfig(hidden=32, head_hidden=16, dropout=0.0),
        max_context=8,
        max_train_questions=600,
        max_eval_questions=150,
        epochs=15,
        patience=3,
        batch_groups=32,
        lr=0.003,
        out_dir=str(tmp_path_factory.mktemp("ranker")),
    )
    return config, train_ranker(config)


@pytest.mark.slow
def test_ranker_trained_on_synthetic_beats_embedding_baseline(trained):
    config, result = trained
    gat, embedding = result.test["gat"], result.test["embedding"]
    print(format_table(result.test, config.eval_ks, result.description))
    assert gat["recall@3"] > embedding["recall@3"] + 0.1
    assert gat["mrr"] > embedding["mrr"]
    assert result.test["none"]["groups"] == gat["groups"] > 100
    assert (result.out_dir / "model.safetensors").is_file() and (result.out_dir / "ranker.json").is_file()
    # A saved ranker evaluates to the same figures.
    _, again = evaluate_saved(config, result.out_dir)
    assert again["gat"] == pytest.approx(gat)


def test_the_budget_is_epochs_so_training_runs_them_all(trained):
    """15 epochs with patience 3: dev MRR improves often enough that every epoch runs, however long each takes."""
    config, result = trained
    assert (result.epochs_run, config.epochs) == (15, 15)


def test_tool_with_trained_ranker_is_deterministic_and_ranks_gold_first_more_often(trained, synthetic):
    config, result = trained
    kg = MemoryKG.from_file(synthetic / "kb.tsv")
    test = [e for e in read_jsonl(synthetic / "questions.jsonl") if e.split == "test"]
    tools = {
        m: KGSearchTool(
            kg,
            ToolConfig(
                ranking=m,
                ranker_path=str(result.out_dir),
                top_k=1,
                encoder=EncoderConfig(kind="hashing", hashing_dim=128),
            ),
        )
        for m in ("gat", "embedding")
    }
    first_hit = {m: 0 for m in tools}
    for example in test:
        for method, tool in tools.items():
            edges = (
                tool.session(example.question, list(example.topic_entities)).call(example.topic_entities[0].id).edges
            )
            first_hit[method] += edges[0].path_relation == example.gold_paths[0][0]
    for example in test[:40]:
        texts = {
            tools["gat"]
            .session(example.question, list(example.topic_entities))
            .call(example.topic_entities[0].name)
            .text
            for _ in range(2)
        }
        assert len(texts) == 1
    print(f"gold relation first, of {len(test)} test questions: {first_hit}")
    # measured 167 against 107 of 300; the bar asks for half that gap
    assert len(test) == 300 and first_hit["gat"] >= first_hit["embedding"] + 30


def test_a_time_budget_is_refused_naming_the_budget_to_set(tmp_path):
    with pytest.raises(ConfigError, match=r"max_train_seconds was removed .*bound training with epochs"):
        load_config(RankerTrainConfig, None, ["data=PQ-2H", "max_train_seconds=45"])
    recipe = tmp_path / "ranker.yaml"
    recipe.write_text("data: PQ-2H\nepochs: 5\nmax_train_seconds: 30\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{recipe}: max_train_seconds was removed"):
        load_config(RankerTrainConfig, recipe)


def test_shipped_configs_parse():
    for path in ("configs/ranker.yaml", "configs/ranker-tiny.yaml"):
        config = load_config(RankerTrainConfig, path)
        assert config.data and config.out_dir
