"""LLM clients: the scripted double, metering, a real tiny HF model batched from threads, and the
OpenAI-compatible client against a local HTTP server speaking the chat-completions protocol."""

import concurrent.futures

import pytest

from kgreasoner.llm import (
    HFClient,
    OpenAIClient,
    ScriptedLLM,
    cut_at_stop,
    open_llm,
)


def test_scripted_llm_rules_in_order_counts_and_stops():
    llm = ScriptedLLM(
        [lambda p: "first rule" if "a" in p else None, lambda p: "second Observation: hidden"], default="none"
    )
    assert llm.complete("a b").text == "first rule"
    reply = llm.complete("x y z", stop=("Observation:",))
    assert reply.text == "second " and reply.prompt_tokens == 3 and reply.completion_tokens == 1
    assert llm.usage.as_dict() == {"llm_calls": 2, "prompt_tokens": 5, "completion_tokens": 3}
    metered = llm.metered()
    metered.complete("a")
    assert metered.usage.calls == 1 and llm.usage.calls == 3
    assert llm.prompts == ["a b", "x y z", "a"]


def test_cut_at_stop_takes_the_earliest():
    assert cut_at_stop("abc STOP def END", ("END", "STOP")) == ("abc ", True)
    assert cut_at_stop("abc", ("X",)) == ("abc", False)


def test_text_clients_refuse_the_rollout_only_specs():
    for spec in ("vllm:/ckpt", "vllm:http://h:8000/v1"):
        with pytest.raises(
            ValueError,
            match=r"names a rollout backend, not a text client: the pipeline methods "
            r"take hf:PATH or openai:URL\[#MODEL\]",
        ):
            open_llm(spec)
    with pytest.raises(ValueError, match="unknown LLM spec 'nothing'"):
        open_llm("nothing")


def test_hf_client_batches_threads_and_matches_single_calls(tiny_checkpoint):
    llm = open_llm(f"hf:{tiny_checkpoint}", max_tokens=6, batch_size=4)
    assert isinstance(llm, HFClient) and llm.concurrency == 4
    prompts = ["who directed the film", "what is the nationality of", "where was she born", "the capital city"]
    try:
        alone = [llm.complete(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            together = list(pool.map(llm.complete, prompts))
    finally:
        llm.close()
    assert [c.text for c in together] == [c.text for c in alone]
    for prompt, completion in zip(prompts, alone):
        rendered = llm.tokenizer(llm.render(prompt), add_special_tokens=False)["input_ids"]
        assert completion.prompt_tokens == len(rendered)
        assert 1 <= completion.completion_tokens <= 6
    assert llm.usage.calls == 8
    assert llm.usage.completion_tokens == 2 * sum(c.completion_tokens for c in alone)


@pytest.fixture
def chat_server(openai_server):
    """Lists one model; answers a chat request with its first message echoed, then " STOP tail"."""

    def reply(request):
        if request.method == "GET":
            return 200, {"data": [{"id": "served-model"}]}
        text = "echo: " + request.body["messages"][0]["content"] + " STOP tail"
        return 200, {
            "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7},
        }

    return openai_server(reply)


def test_openai_client_over_http(chat_server):
    llm = open_llm(f"openai:{chat_server.base_url}", max_tokens=9)
    assert isinstance(llm, OpenAIClient) and llm.model == "served-model"
    completion = llm.complete("hello", stop=("STOP",))
    assert completion.text == "echo: hello " and completion.prompt_tokens == 11 and completion.completion_tokens == 7
    _, path, _, body = chat_server.requests[-1]
    assert path == "/v1/chat/completions"
    assert body == {
        "model": "served-model",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 9,
        "temperature": 0.0,
        "stop": ["STOP"],
    }
    assert llm.usage.as_dict() == {"llm_calls": 1, "prompt_tokens": 11, "completion_tokens": 7}
    assert open_llm(f"openai:{chat_server.base_url}#named").model == "named"


def test_openai_client_reports_an_unreachable_server():
    with pytest.raises(RuntimeError, match="127.0.0.1:9/v1/chat/completions"):
        OpenAIClient("http://127.0.0.1:9/v1", "m", retries=0, timeout=2).complete("x")


def test_hf_client_stops_at_a_stop_string(tiny_checkpoint):
    llm = HFClient.load(tiny_checkpoint, max_tokens=12, batch_size=2)
    try:
        free = llm.complete("who directed the film")
        assert len(free.text) >= 4 and free.completion_tokens == 12 and free.finish_reason == "length"
        middle = len(free.text) // 2
        stop = free.text[middle : middle + 2]  # the untrained model's text, whatever it is
        cut = llm.complete("who directed the film", stop=(stop,))
    finally:
        llm.close()
    assert cut.text == free.text[: free.text.find(stop)] and cut.finish_reason == "stop"
    assert cut.completion_tokens < free.completion_tokens


def test_kgreasoner_method_over_a_text_endpoint_renders_the_models_chat_template(tiny_checkpoint, synthetic):
    from transformers import AutoTokenizer

    from kgreasoner.llm import rollout_backend
    from kgreasoner.protocol import build_prompt

    client = OpenAIClient("http://127.0.0.1:9/v1", "m", retries=0, timeout=2)
    example = synthetic.examples[0]
    expected = build_prompt(
        example.question, list(example.topic_entities), AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    )
    assert expected.startswith("<|im_start|>system")
    backend = rollout_backend(client, str(tiny_checkpoint))
    assert build_prompt(example.question, list(example.topic_entities), backend.tokenizer) == expected
    assert getattr(rollout_backend(client), "tokenizer", None) is None
