"""GRPO on the official CWQ release over a Freebase endpoint: its prompts name the topic entities."""

from pathlib import Path

import pytest

from kgreasoner.protocol import build_prompt
from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.training import grpo
from kgreasoner.training.grpo import Episode, GRPORecipe

CWQ_TRAIN = Path(__file__).parents[1] / "data" / "fixtures" / "cwq-official" / "ComplexWebQuestions_train.json"
FREEBASE = (CWQ_TRAIN.parent / "freebase.nt").read_text()
"""Freebase triples of the first training question's topic entities, with `type.object.name`s."""


class Built(Exception):
    """Raised by the trainer's stand-in: this test reads what the trainer would be given, not a run."""


def test_train_grpo_hands_the_trainer_named_topic_entities(tmp_path, oxigraph_server, monkeypatch):
    """The trainer stops at its construction (a run is `test_grpo_learning`'s); the episode's rows are
    built from the questions it was handed by the same function the trainer uses."""

    def build_trainer(recipe, number, episode, examples, *rest):
        raise Built(examples)

    monkeypatch.setattr(grpo, "build_trainer", build_trainer)
    recipe = GRPORecipe(
        model="unused",
        dataset=str(CWQ_TRAIN),
        run_dir=str(tmp_path / "run"),
        kg=f"sparql+freebase:{oxigraph_server(raw_ntriples=FREEBASE)}",
        tool=ToolConfig(ranking="none"),
        episodes=[Episode("all", max_steps=1)],
        trainer={"report_to": []},
    )
    with pytest.raises(Built) as built:
        grpo.train_grpo(recipe)
    [example] = built.value.args[0]
    assert [(t.id, t.name) for t in example.topic_entities] == [("m.06w2sn5", "Justin Bieber"), ("m.05zppz", "Male")]
    assert build_prompt(example.question, list(example.topic_entities), None).endswith(
        "Topic Entity: Justin Bieber, Male Assistant:"
    )
