"""`kgreasoner eval` on the official CWQ release over a Freebase endpoint: prompts name the topic entities."""

import argparse
from pathlib import Path

import pytest

from kgreasoner.evaluation import commands
from kgreasoner.evaluation.harness import read_records

CWQ_TRAIN = Path(__file__).parents[1] / "data" / "fixtures" / "cwq-official" / "ComplexWebQuestions_train.json"
FREEBASE = (CWQ_TRAIN.parent / "freebase.nt").read_text()
"""Freebase triples of the first training question's topic entities, with `type.object.name`s."""


@pytest.mark.slow
def test_eval_prompts_show_freebase_names_not_mids(tmp_path, oxigraph_server, tiny_checkpoint):
    out = tmp_path / "run"
    parser = argparse.ArgumentParser(prog="kgreasoner")
    commands.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "eval",
            "--methods",
            "io,kgreasoner",
            "--dataset",
            str(CWQ_TRAIN),
            "--split",
            "train",
            "--kg",
            f"sparql+freebase:{oxigraph_server(raw_ntriples=FREEBASE)}",
            "--llm",
            f"hf:{tiny_checkpoint}",
            "--out",
            str(out),
            "--no-progress",
            "--set",
            "max_tokens=4",
            "--set",
            "rollout.max_new_tokens=8",
            "--set",
            "rollout.max_turns=1",
            "--set",
            "tool.ranking=none",
        ]
    )
    assert args.func(args) == 0
    [io] = read_records(out / "io.jsonl")
    assert "Topic entities: Justin Bieber, Male\n" in io["trace"]["prompt"]
    [ours] = read_records(out / "kgreasoner.jsonl")
    # The search session knows each topic entity by the same name (id, handle, name).
    assert ours["trace"]["entities"] == [["m.06w2sn5", "", "Justin Bieber"], ["m.05zppz", "", "Male"]]
