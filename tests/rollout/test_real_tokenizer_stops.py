"""Stop tags with the real Qwen3 and Llama-3.1 tokenizers, whose byte-level BPE merges a closing
tag with the text before it (`D.C.</search>` -> `.</` `search` `>`).

The tokenizers are the published ones from the shared models folder (found like the data folder:
`<repo>/../shared/models` or `../shared/models` from the current directory). What the model
"chooses" to write is scripted: `ScriptedLogits` forces token ids on a tiny random model behind
the real hf backend, and a stub server replays ids for the vllm backend. That is the only test
double; tokenisation, decoding, stop detection and tool insertion are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kgreasoner.protocol import ANSWER_CLOSE, SEARCH_CLOSE, build_prompt, check_format, format_tool_block
from kgreasoner.records.paths import repo_root
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams
from kgreasoner.rollout.hf_backend import HFBackend
from kgreasoner.rollout.vllm_backend import VLLMBackend

from .conftest import ScriptedLogits, ScriptedSession, build_model


def _models_dir() -> Path | None:
    for root in (repo_root().parent / "shared" / "models", Path.cwd() / ".." / "shared" / "models"):
        if (root / "qwen3" / "tokenizer.json").is_file() and (root / "llama3.1" / "tokenizer.json").is_file():
            return root
    return None


MODELS = _models_dir()
pytestmark = pytest.mark.skipif(
    MODELS is None,
    reason="the shared models folder (../shared/models with qwen3/ and llama3.1/ tokenizers) is not on this machine",
)

TABLE = {
    "Washington D.C.": ["(Washington D.C., capital of, United States)"],
    "Barack Obama (born 1961)": ["(Barack Obama, born in, Honolulu)"],
    '"Hello"': ['("Hello", performed by, Adele)'],
    "Apollo 11": ["(Apollo 11, launch year, 1969)"],
}

# Per row: the model-written turns (a tool block follows each but the last), the queries the tool
# must receive, the answers; the last turn may run on past `</answer>` with tokens never consumed.
ROWS = [
    (
        ["<think> x <search>Washington D.C.</search>", " capital. </think>\n<answer>1987</answer>"],
        ["Washington D.C."],
        ["1987"],
    ),
    (
        [
            "<think> who <search>Barack Obama (born 1961)</search>",
            ' and <search>"Hello"</search>',
            " so </think>\n<answer>Washington D.C.</answer>",
        ],
        ["Barack Obama (born 1961)", '"Hello"'],
        ["Washington D.C."],
    ),
    # `</search>\n`: the token completing the tag is `>\n`; its newline stays in the model text.
    (["<think> y <search>Apollo 11</search>\n", '</think>\n<answer>"Hello"</answer>'], ["Apollo 11"], ['"Hello"']),
    (["<think> direct </think>\n<answer>Obama (born 1961)</answer>"], [], ["Obama (born 1961)"]),
]
AFTER_ANSWER = " and more words"


@pytest.fixture(scope="module", params=["qwen3", "llama3.1"])
def real_tokenizer(request):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODELS / request.param)  # its name_or_path: that folder


def _encode(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _merged_with_text_before(tokenizer, turn, tag):
    """The turn's ids do not end with the tag's own ids (alone or after a space): a matcher on the
    tag's token ids would miss this stop."""
    ids = _encode(tokenizer, turn)
    return all(tuple(ids[-len(v) :]) != tuple(v) for v in (_encode(tokenizer, tag), _encode(tokenizer, " " + tag)))


def _expected(tokenizer, turns, queries):
    """Completion ids, env_mask, text and tool spans the engine must produce for one row."""
    ids, mask, text, spans = [], [], "", []
    for k, turn in enumerate(turns):
        turn_ids = _encode(tokenizer, turn)
        ids += turn_ids
        mask += [1] * len(turn_ids)
        text += turn
        if k < len(queries):
            block = format_tool_block("\n".join(TABLE[queries[k]]))
            block_ids = _encode(tokenizer, block)
            ids += block_ids
            mask += [0] * len(block_ids)
            spans.append((len(text), len(text) + len(block)))
            text += block
    return ids, mask, text, spans


def test_the_cases_are_the_merged_ones(real_tokenizer):
    for turn, tag in [
        (ROWS[0][0][0], SEARCH_CLOSE),
        (ROWS[1][0][0], SEARCH_CLOSE),
        (ROWS[1][0][1], SEARCH_CLOSE),
        (ROWS[2][0][1], ANSWER_CLOSE),
        (ROWS[3][0][0], ANSWER_CLOSE),
    ]:
        assert _merged_with_text_before(real_tokenizer, turn, tag), turn
    last = real_tokenizer.decode(_encode(real_tokenizer, ROWS[2][0][0])[-1:])
    assert last == ">\n"  # the stop token carries a character past the tag


def test_hf_engine_stops_where_the_decoded_text_completes_the_tag(real_tokenizer):
    model = build_model(real_tokenizer)
    scripts = {
        i: sum((_encode(real_tokenizer, t) for t in turns), []) + _encode(real_tokenizer, AFTER_ANSWER)
        for i, (turns, _, _) in enumerate(ROWS)
    }
    backend = HFBackend(model, real_tokenizer, logits_processors=[ScriptedLogits(scripts)])
    engine = RolloutEngine(backend, None, RolloutConfig(max_turns=4, max_turn_tokens=64, max_tool_tokens=128))
    sessions = [ScriptedSession(TABLE) for _ in ROWS]
    prompts = [build_prompt(f"question {i}", ["Utah"], real_tokenizer) for i in range(len(ROWS))]
    trajectories = engine.run(prompts, sessions, SamplingParams(temperature=0.7, seed=5))

    for trajectory, (turns, queries, answers), session in zip(trajectories, ROWS, sessions):
        ids, mask, text, spans = _expected(real_tokenizer, turns, queries)
        assert session.queries == queries
        assert [call.query for call in trajectory.tool_calls] == queries
        assert trajectory.completion_ids == ids
        assert trajectory.env_mask == mask
        assert len(trajectory.logprobs) == len(ids)
        assert trajectory.logprobs == [0.0] * len(ids)  # tool tokens 0.0; forced tokens have p = 1
        assert trajectory.text == text
        assert trajectory.tool_spans == spans
        assert trajectory.finish_reason == "answer"
        assert trajectory.answers == answers
        assert check_format(trajectory.text, trajectory.tool_spans).valid, check_format(trajectory.text).errors
        assert [c.num_tokens for c in trajectory.tool_calls] == [
            len(_encode(real_tokenizer, format_tool_block(TABLE[q][0]))) for q in queries
        ]


def _vllm_reply(ids, logprobs):
    return {
        "choices": [
            {
                "index": 0,
                "text": "",
                "token_ids": ids,
                "finish_reason": "stop",
                "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": logprobs},
            }
        ]
    }


def test_vllm_turns_keep_sampled_ids_and_logprobs_and_drop_tokens_past_the_stop(real_tokenizer, stub):
    turns, queries, answers = ROWS[1]
    turn_ids = [_encode(real_tokenizer, t) for t in turns]
    # A server that ignored the stop string would go on; the engine must cut at the stop token.
    extra = _encode(real_tokenizer, " <search>Apollo 11</search>")
    sent = [[-(k + 1) / 64 for k in range(len(ids) + len(extra))] for ids in turn_ids]

    def reply(body):
        turn = len(server.bodies) - 1  # one row: its requests come one turn after the other
        return 200, _vllm_reply(turn_ids[turn] + extra, sent[turn])

    server = stub(reply)
    backend = VLLMBackend(real_tokenizer, base_url=server.base_url, model="real")
    engine = RolloutEngine(backend, None, RolloutConfig(max_turns=4, max_turn_tokens=64, max_tool_tokens=128))
    session = ScriptedSession(TABLE)
    [trajectory] = engine.run([build_prompt("q", ["Utah"], real_tokenizer)], [session], SamplingParams(seed=2))

    ids, mask, text, spans = _expected(real_tokenizer, turns, queries)
    assert session.queries == queries
    assert trajectory.completion_ids == ids and trajectory.env_mask == mask
    expected_logprobs = []
    for k, turn in enumerate(turn_ids):
        expected_logprobs += sent[k][: len(turn)]
        if k < len(queries):
            expected_logprobs += [0.0] * len(_encode(real_tokenizer, format_tool_block(TABLE[queries[k]][0])))
    assert trajectory.logprobs == expected_logprobs
    assert trajectory.text == text and trajectory.tool_spans == spans
    assert trajectory.finish_reason == "answer" and trajectory.answers == answers
    assert len(server.bodies) == len(turns)
    assert server.bodies[0]["stop"] == [SEARCH_CLOSE, ANSWER_CLOSE]
    assert server.bodies[0]["stop_token_ids"] == GENERATION_EOS[Path(real_tokenizer.name_or_path).name]


# Every EOS id of the released generation_config.json (its order), then the tokenizer's EOS if not among them.
GENERATION_EOS = {"qwen3": [151645, 151643], "llama3.1": [128001, 128008, 128009]}


def test_vllm_turns_stop_at_every_eos_id_of_the_generation_config(real_tokenizer, stub):
    """Qwen3 and Llama 3.1 stop at ids besides the tokenizer's EOS (Qwen3's <|endoftext|>, Llama's
    <|end_of_text|> and <|eom_id|>): the request asks vLLM to stop at each, and the engine ends the
    row there whichever one the server stopped at, keeping the EOS id out of the text."""
    eos_ids = GENERATION_EOS[Path(real_tokenizer.name_or_path).name]
    written = "<think> no idea </think>"
    for eos in eos_ids:
        sent = _encode(real_tokenizer, written) + [eos] + _encode(real_tokenizer, " more")
        server = stub(lambda body, sent=sent: (200, _vllm_reply(sent, [-0.5] * len(sent))))
        backend = VLLMBackend(real_tokenizer, base_url=server.base_url, model="real")
        assert backend.eos_token_ids == eos_ids
        engine = RolloutEngine(backend, None, RolloutConfig(max_turn_tokens=64))
        [trajectory] = engine.run(
            [build_prompt("q", ["Utah"], real_tokenizer)], [ScriptedSession(TABLE)], SamplingParams(seed=2)
        )
        assert server.bodies[0]["stop_token_ids"] == eos_ids
        assert trajectory.finish_reason == "eos", eos
        assert trajectory.completion_ids == _encode(real_tokenizer, written) + [eos]
        assert trajectory.text == written


def test_eos_ids_come_from_the_model_folder_when_the_tokenizer_has_none(bpe_tokenizer):
    """A tokenizer made in memory has no folder: only its own EOS, unless the model folder is named."""
    assert VLLMBackend(bpe_tokenizer, base_url="http://127.0.0.1:9/v1", model="m").eos_token_ids == [
        bpe_tokenizer.eos_token_id
    ]
    backend = VLLMBackend(
        bpe_tokenizer, base_url="http://127.0.0.1:9/v1", model="m", model_dir=str(MODELS / "llama3.1")
    )
    assert backend.eos_token_ids == [128001, 128008, 128009, bpe_tokenizer.eos_token_id]


def test_qwen3_think_token_is_text_the_format_check_reads():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODELS / "qwen3")
    script = _encode(tokenizer, "<think> x </think>\n<answer>D.C.</answer>")
    assert script[0] == 151667 and 151668 in script  # Qwen3's own <think> and </think> tokens
    engine = RolloutEngine(
        HFBackend(build_model(tokenizer), tokenizer, [ScriptedLogits({0: script})]),
        None,
        RolloutConfig(max_turn_tokens=32),
    )
    [trajectory] = engine.run([build_prompt("q", ["Utah"], tokenizer)], [ScriptedSession(TABLE)])
    assert trajectory.completion_ids == script
    assert trajectory.text == "<think> x </think>\n<answer>D.C.</answer>"
    assert check_format(trajectory.text, trajectory.tool_spans).valid
    assert trajectory.finish_reason == "answer" and trajectory.answers == ["D.C."]
