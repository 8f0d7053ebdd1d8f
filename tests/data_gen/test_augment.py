"""Question augmentations of the warm-up: paraphrase mixing and name dropout."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from data_gen.augment import AugmentConfig, QuestionAugmenter
from data_gen.warmup import WarmupConfig, WarmupGenerator, generate_records, load_templates
from kgreasoner.config import load_config
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import Answer, QAExample, TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool


def question(qid: str, text: str, topic: str, path=("spouse", "nationality"), split: str = "train") -> QAExample:
    return QAExample(
        id=qid,
        question=text,
        topic_entities=(TopicEntity(topic, topic),),
        split=split,
        answers=(Answer("x", "x"),),
        gold_paths=(path,),
        hops=len(path),
    )


EXAMPLES = [
    question("a1", "which nationality is ann 's couple ?", "ann"),
    question("a2", "what is the nation of ann 's couple ?", "ann"),
    question("b1", "the nation of the wife of bob ?", "bob"),
    question("c1", "what is the gender of cy 's mom ?", "cy", path=("parents", "gender")),
    question("d1", "ann met ann ?", "ann"),
]


def test_paraphrase_mixing_takes_wordings_of_the_same_path_from_other_topics():
    augment = QuestionAugmenter(EXAMPLES, AugmentConfig(paraphrase_mixing=1.0), seed=0)
    assert augment(EXAMPLES[0]).question == "the nation of the wife of ann ?"
    assert augment(EXAMPLES[2]).question in {
        "which nationality is bob 's couple ?",
        "what is the nation of bob 's couple ?",
    }
    # No other topic asks for `parents, gender`; a name occurring twice is left alone.
    assert augment(EXAMPLES[3]) is EXAMPLES[3]
    assert augment(EXAMPLES[4]) is EXAMPLES[4]
    assert augment.stats == Counter({"paraphrase_mixed": 2, "augment_skipped:topic_name_not_once": 1})


def test_name_dropout_renames_the_topic_but_keeps_its_id_and_other_splits_untouched():
    augment = QuestionAugmenter(EXAMPLES, AugmentConfig(name_dropout=1.0), seed=0)
    renamed = augment(EXAMPLES[0])
    new = renamed.topic_entities[0]
    assert new.id == "ann" and new.name in {"bob", "cy"}
    assert renamed.question == f"which nationality is {new.name} 's couple ?"
    assert renamed.gold_paths == EXAMPLES[0].gold_paths and renamed.answers == EXAMPLES[0].answers
    dev = question("e1", "what is the nation of ann 's couple ?", "ann", split="dev")
    assert augment(dev) is dev
    # Seeded per question: the same rewrite every time.
    assert QuestionAugmenter(EXAMPLES, AugmentConfig(name_dropout=1.0), seed=0)(EXAMPLES[0]) == renamed


def test_shares_are_validated():
    with pytest.raises(ValueError, match=r"augment.name_dropout must be in \[0, 1\]"):
        AugmentConfig(name_dropout=1.5)


def test_warm_up_records_carry_the_new_name_in_prompt_and_tool_blocks(tmp_path):
    kg = MemoryKG(
        *zip(
            *[
                ("ann", "spouse", "bob"),
                ("bob", "nationality", "france"),
                ("cy", "spouse", "dee"),
                ("dee", "nationality", "peru"),
            ]
        )
    )
    examples = [
        QAExample(
            id="q1",
            question="what is the nationality of ann 's couple ?",
            topic_entities=(TopicEntity("ann", "ann"),),
            answers=(Answer("france", "france"),),
            gold_paths=(("spouse", "nationality"),),
            hops=2,
            split="train",
        ),
        QAExample(
            id="q2",
            question="the nation of the wife of cy ?",
            topic_entities=(TopicEntity("cy", "cy"),),
            answers=(Answer("peru", "peru"),),
            gold_paths=(("spouse", "nationality"),),
            hops=2,
            split="train",
        ),
    ]
    templates = tmp_path / "plan.yaml"
    templates.write_text((Path(__file__).parents[2] / "configs/tiny-cpu/templates-plan.yaml").read_text())
    config = load_config(
        WarmupConfig,
        None,
        [
            "dataset=unused",
            f"output={tmp_path / 'w.jsonl'}",
            "progress=false",
            f"templates={templates}",
            "tool.entity_handles=true",
            "correction_share=0",
            "augment.name_dropout=1.0",
            "augment.paraphrase_mixing=1.0",
        ],
    )
    generator = WarmupGenerator(kg, KGSearchTool(kg, config.tool), config, load_templates(config.templates))
    records, skipped = generate_records(generator, examples, None)
    by_id = {r.id: r for r in records}
    assert not skipped and generator.stats["name_dropped"] == 2 and generator.stats["paraphrase_mixed"] == 2
    first = by_id["q1"]
    assert first.question == "the nation of the wife of cy ?" and first.topic_entities[0].name == "cy"
    # The tool shows ann's own triples under the new name; the answer is still ann's spouse's nationality.
    assert "(E1 cy, spouse, E2 bob)" in first.completion and first.completion.endswith("<answer>E3</answer>")
