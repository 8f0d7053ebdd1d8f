"""Every shipped GPU GRPO recipe names a dataset with training questions, and its KG answers them.

The recipe's dataset is resolved through `$KGREASONER_DATA` against a data root made from the
hand-made fixtures, laid out as the published files are (RoG's `data/*.parquet`).
"""

import dataclasses
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kgreasoner.config import load_config
from kgreasoner.data import load_dataset, open_dataset_kg
from kgreasoner.kg import open_kg
from kgreasoner.records.paths import DATA_ENV
from kgreasoner.retrieval.tool import KGSearchTool
from kgreasoner.training.grpo import GRPORecipe

ROOT = Path(__file__).parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
GPU_RECIPES = ["configs/llama3.1-8b/grpo.yaml", "configs/qwen3-30b-a3b/grpo.yaml", "configs/qwen3-8b/grpo.yaml"]
# The published file names of each JSONL fixture.
PARQUET_NAMES = {
    "train.jsonl": "train-00000-of-00001.parquet",
    "validation.jsonl": "validation-00000-of-00001.parquet",
    "test.jsonl": "test-00000-of-00001.parquet",
}


@pytest.fixture
def data_root(tmp_path, monkeypatch) -> Path:
    for name in ("webqsp-official", "cwq-official"):
        shutil.copytree(FIXTURES / name, tmp_path / name)
    for name in ("rog-webqsp", "rog-cwq"):
        for jsonl in sorted((FIXTURES / name).glob("*.jsonl")):
            rows = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
            out = tmp_path / name / "data" / PARQUET_NAMES[jsonl.name]
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows), out)
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    return tmp_path


def test_the_gpu_recipes_are_these():
    found = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("configs/*/grpo.yaml") if p.parent.name != "tiny-cpu")
    assert found == GPU_RECIPES


@pytest.mark.parametrize("recipe_path", GPU_RECIPES)
def test_recipe_dataset_has_training_questions_its_kg_answers(data_root, recipe_path):
    recipe = load_config(GRPORecipe, ROOT / recipe_path)
    dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
    train = dataset.split("train")
    assert [e.id for e in train] == ["WebQTrn-0_6a4b9d1ba3dbe0fa4f1f0a9e0e7d7f33"]
    assert dataset.split_scheme == "given"
    # The KG as train_grpo opens it (`_open_kg`): the recipe's spec, else the dataset's own.
    kg = open_kg(recipe.kg) if recipe.kg else open_dataset_kg(dataset)
    tool = KGSearchTool(kg, dataclasses.replace(recipe.tool, ranking="none"))  # no trained ranker here
    for example in train:
        session = tool.session(example.question, list(example.topic_entities), example_id=example.id)
        result = session.call(example.topic_entities[0].name)
        assert result.error is None
        assert "(Jaxon Bieber, people.person.gender, Male)" not in result.text  # two hops away
        assert session.call("Jaxon Bieber").text == "(Jaxon Bieber, people.person.gender, Male)"
