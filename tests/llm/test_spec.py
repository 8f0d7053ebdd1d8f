"""The one LLM spec grammar: every accepted form, and the message for anything else."""

import pytest

from kgreasoner.llm import SPEC_FORMS, LLMSpec, check_backend_spec, parse_llm_spec

UNKNOWN = r"expected hf:PATH, vllm:PATH, vllm:URL\[#MODEL\] or openai:URL\[#MODEL\]$"


@pytest.mark.parametrize(
    "spec, parsed",
    [
        ("hf:/ckpt/final", LLMSpec("hf", "/ckpt/final")),
        ("hf:checkpoints/run#3", LLMSpec("hf", "checkpoints/run#3")),  # a path keeps its '#'
        ("vllm:/ckpt/final", LLMSpec("vllm", "/ckpt/final")),
        ("vllm:http://127.0.0.1:8000/v1", LLMSpec("vllm", "http://127.0.0.1:8000/v1")),
        ("vllm:https://h/v1#qwen3-8b", LLMSpec("vllm", "https://h/v1", "qwen3-8b")),
        ("openai:http://h:8000/v1", LLMSpec("openai", "http://h:8000/v1")),
        ("openai:http://h:8000/v1#served", LLMSpec("openai", "http://h:8000/v1", "served")),
        ("openai:https://h/v1#", LLMSpec("openai", "https://h/v1")),  # an empty name: the server's first
    ],
)
def test_every_accepted_form(spec, parsed):
    assert parse_llm_spec(spec) == parsed
    assert parse_llm_spec(parsed) is parsed
    assert str(parsed) == spec.rstrip("#")
    assert parsed.is_url == spec.split(":", 1)[1].startswith("http")


def test_the_accepted_forms_are_the_four_documented():
    assert SPEC_FORMS == ("hf:PATH", "vllm:PATH", "vllm:URL[#MODEL]", "openai:URL[#MODEL]")


@pytest.mark.parametrize(
    "spec",
    [
        "gpt:thing",
        "nothing",
        "hf:",
        "vllm:",
        "openai:",
        ":/ckpt",
        "HF:/ckpt",
        "hf:http://h:8000/v1",  # a server is not a checkpoint for transformers
        "openai:/ckpt",  # an OpenAI-compatible client needs a server URL
    ],
)
def test_an_unknown_spec_names_every_accepted_form(spec):
    with pytest.raises(ValueError, match=rf"^unknown LLM spec {spec!r}: {UNKNOWN}"):
        parse_llm_spec(spec)


def test_a_backend_spec_also_needs_what_its_backend_needs():
    assert check_backend_spec("vllm:http://h/v1", tokenizer="/tok") == LLMSpec("vllm", "http://h/v1")
    assert check_backend_spec("openai:http://h/v1") == LLMSpec("openai", "http://h/v1")
    with pytest.raises(ValueError, match="^vllm:URL sends token ids and needs `tokenizer`"):
        check_backend_spec("vllm:http://h/v1")
    with pytest.raises(ValueError, match=UNKNOWN):
        check_backend_spec("gpt:thing", tokenizer="/tok")
