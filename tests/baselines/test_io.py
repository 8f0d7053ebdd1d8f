"""io and cot through the harness with scripted replies: one call each, prompts, parsing, scoring."""

import pytest

from kgreasoner.evaluation.harness import evaluate_method
from kgreasoner.evaluation.methods import EvalConfig, MethodContext, build_method

from .conftest import gold_llm


def test_io_and_cot_end_to_end(tmp_path, synthetic_data):
    dataset, kg = synthetic_data
    examples = dataset.split("test")
    for name in ("io", "cot"):
        llm = gold_llm(kg, examples, "io")
        method = build_method(name, MethodContext(kg, llm, EvalConfig()))
        records = evaluate_method(method, examples, tmp_path / f"{name}.jsonl", llm=llm, workers=3, progress=False)
        assert [r["id"] for r in records] == [e.id for e in examples]
        assert all(r["llm_calls"] == 1 and r["kg_queries"] == 0 and r["hits1"] == 1.0 for r in records)
        assert all(r["format_valid"] is True for r in records)
        assert llm.usage.calls == len(examples)
        assert all(p.endswith("Reasoning:" if name == "cot" else "Answer:") for p in llm.prompts)


def test_a_method_that_asks_an_llm_and_is_given_none_says_so(synthetic_data):
    from kgreasoner.baselines.io import IOMethod

    dataset, _ = synthetic_data
    with pytest.raises(ValueError, match=r"^method 'cot' needs an LLM client, got None$"):
        IOMethod(chain_of_thought=True).answer(dataset.split("test")[0], None)
