"""The rollout-backend factory: one spec in, the backend eval and serving run, its name and closer."""

import pytest

from kgreasoner.llm import HFClient, ScriptedLLM, open_backend, rollout_backend
from kgreasoner.rollout.hf_backend import HFBackend
from kgreasoner.rollout.openai_backend import OpenAIBackend
from kgreasoner.rollout.vllm_backend import VLLMBackend


def test_hf_checkpoint_becomes_an_hf_backend_named_after_its_folder(tiny_checkpoint):
    backend, name, close = open_backend(f"hf:{tiny_checkpoint}")
    assert isinstance(backend, HFBackend) and name == "final"
    assert next(backend.model.parameters()).device.type == "cpu" and backend.tokenizer.padding_side == "left"
    close()


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'nope'} is not a checkpoint directory$"):
        open_backend(f"hf:{tmp_path / 'nope'}")
    with pytest.raises(FileNotFoundError, match="is not a checkpoint directory"):
        open_backend(f"vllm:{tmp_path / 'nope'}")


def test_openai_endpoint_becomes_a_text_backend_with_the_models_chat_template(models_server, tiny_checkpoint):
    backend, name, close = open_backend(f"openai:{models_server}", str(tiny_checkpoint), workers=3, timeout=7.0)
    assert isinstance(backend, OpenAIBackend) and name == "served-model" and backend.model == "served-model"
    assert backend.url == f"{models_server}/completions"
    assert (backend.timeout, backend.max_concurrency) == (7.0, 3)
    assert backend.tokenizer.chat_template  # prompts rendered as the checkpoint was trained
    close()
    backend, name, _ = open_backend(f"openai:{models_server}#other")
    assert name == "other" and getattr(backend, "tokenizer", None) is None


def test_vllm_endpoint_becomes_a_token_id_backend(models_server, tiny_checkpoint):
    backend, name, close = open_backend(f"vllm:{models_server}", str(tiny_checkpoint), workers=5, timeout=9.0)
    assert isinstance(backend, VLLMBackend) and backend.llm is None and name == "served-model"
    assert backend.url == f"{models_server}/completions" and (backend.timeout, backend.max_concurrency) == (9.0, 5)
    assert backend.tokenizer.name_or_path == str(tiny_checkpoint)
    close()
    assert open_backend(f"vllm:{models_server}#other", str(tiny_checkpoint))[1] == "other"
    with pytest.raises(ValueError, match="vllm:URL sends token ids and needs `tokenizer`"):
        open_backend(f"vllm:{models_server}")


def test_an_unreachable_server_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="http://127.0.0.1:9/v1/models"):
        open_backend("vllm:http://127.0.0.1:9/v1", "unused")


def test_a_client_already_open_shares_its_model(tiny_checkpoint):
    client = HFClient.load(tiny_checkpoint, device="cpu")
    backend = rollout_backend(client)
    assert isinstance(backend, HFBackend) and backend.model is client.model and backend.tokenizer is client.tokenizer
    assert rollout_backend(backend) is backend
    with pytest.raises(ValueError, match="the kgreasoner method needs --llm hf:PATH or openai:URL"):
        rollout_backend(ScriptedLLM([]))
