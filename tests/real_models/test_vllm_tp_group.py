"""The colocated vLLM backend inside a tensor-parallel group: two real gloo ranks, the real engine and
the real Qwen3 tokenizer. vLLM itself cannot run here, so `FakeTPEngine` stands in for it (a test
double): like vLLM's tensor-parallel workers it makes every `generate` a collective of the group,
so a rank that skips a turn or sends other requests blocks or fails the test.

TRL's tensor-parallel group is NCCL in a real run, and NCCL cannot run here either:
`_stand_in_for_nccl` (the other test double) makes the gloo group refuse CPU tensors as NCCL does.
"""

from __future__ import annotations

import multiprocessing
import socket
import sys
import types
from datetime import timedelta

import pytest

from .conftest import MODELS

# Random-weight models of the real architectures through whole stages: `make test` runs them,
# `make test-fast` does not.
pytestmark = pytest.mark.slow

REPLIES = {  # first prompt word -> the turns that row writes
    "alpha": [
        "<think> I search Utah. <search>Utah</search>",
        "So it is X. </think>\n<answer>Mountain Time Zone</answer>",
    ],
    "beta": ["<think> direct </think>\n<answer>Paris</answer>"],
    "gamma": ["<think> direct </think>\n<answer>Euro</answer>"],
}
ROWS = {0: ["alpha"], 1: ["beta", "gamma"]}


class FakeTPEngine:
    """Replies from REPLIES; every call is checked to be the same call on every rank of the group."""

    def __init__(self, tokenizer, group):
        self.tokenizer, self.group, self.calls, self.turns = tokenizer, group, [], {}

    def generate(self, prompts, params, use_tqdm=False):
        import torch.distributed as dist

        ids = [p["prompt_token_ids"] for p in prompts]
        seen = [None, None]
        dist.all_gather_object(seen, ids, group=self.group)  # the collective a TP engine makes
        assert seen[0] == seen[1], "the ranks of a tensor-parallel group sent different requests"
        self.calls.append(len(ids))
        results = []
        for prompt in ids:
            word = self.tokenizer.decode(prompt[:1]).strip()
            turn = self.turns.get(prompt[0], 0)
            self.turns[prompt[0]] = turn + 1
            reply = list(self.tokenizer(REPLIES[word][turn], add_special_tokens=False)["input_ids"])
            logprobs = [{token: types.SimpleNamespace(logprob=-0.5)} for token in reply]
            results.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=reply, logprobs=logprobs)]))
        return results


def _fake_vllm_modules():
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kwargs: kwargs
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    sys.modules["vllm"], sys.modules["vllm.inputs"] = vllm, inputs


NCCL_CPU_ERROR = "No backend type associated with device type cpu"
"""What c10d raises when a CPU tensor goes into a collective of an NCCL process group."""
TENSOR_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)


def _stand_in_for_nccl(group) -> None:
    """Make the gloo `group` look like NCCL to its callers: a test double, since NCCL needs GPUs.

    `torch.distributed.get_backend(group)` says "nccl", and its tensor collectives, called through
    `torch.distributed`, raise NCCL's error (`NCCL_CPU_ERROR`) on a CPU tensor, the only kind there is
    here. Its object collectives work as they are: on a real NCCL group torch moves their buffers to
    the rank's CUDA device itself (torch's own internal calls do not go through the names replaced here).
    """
    import torch
    import torch.distributed as dist

    def refusing_cpu(collective):
        def call(*args, **kwargs):
            values = [*args, *kwargs.values()]
            tensors = [
                t for v in values for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)
            ]
            if any(v is group for v in values) and any(t.device.type == "cpu" for t in tensors):
                raise RuntimeError(NCCL_CPU_ERROR)
            return collective(*args, **kwargs)

        return call

    for name in TENSOR_COLLECTIVES:
        setattr(dist, name, refusing_cpu(getattr(dist, name)))
    get_backend = dist.get_backend
    dist.get_backend = lambda g=None: "nccl" if g is group else get_backend(g)


def _rank(rank: int, port: int, queue, nccl: bool) -> None:
    try:
        import torch.distributed as dist
        from rollout.conftest import ScriptedSession
        from transformers import AutoTokenizer

        from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams
        from kgreasoner.rollout.vllm_backend import VLLMBackend

        _fake_vllm_modules()
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
        )
        group = dist.new_group([0, 1])
        if nccl:
            _stand_in_for_nccl(group)
        tokenizer = AutoTokenizer.from_pretrained(MODELS / "qwen3")
        engine_double = FakeTPEngine(tokenizer, group)
        backend = VLLMBackend(tokenizer, llm=engine_double, tp_group=group)
        engine = RolloutEngine(backend, None, RolloutConfig(max_turn_tokens=32, max_tool_tokens=64))
        prompts = [f"{word} question" for word in ROWS[rank]]
        sessions = [ScriptedSession({"Utah": ["(Utah, time zone, Mountain Time Zone)"]}) for _ in prompts]
        trajectories = engine.run(prompts, sessions, SamplingParams(seed=rank))
        queue.put((rank, engine_double.calls, [(t.answers, t.finish_reason, len(t.tool_calls)) for t in trajectories]))
        dist.destroy_process_group()
    except BaseException as err:  # report it to the parent instead of dying silently
        queue.put((rank, "error", repr(err)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("nccl", [False, True], ids=["gloo", "nccl-stand-in"])
def test_ranks_of_a_tp_group_generate_together_and_keep_their_own_rows(nccl):
    context = multiprocessing.get_context("spawn")
    queue, port = context.Queue(), _free_port()
    processes = [context.Process(target=_rank, args=(rank, port, queue, nccl)) for rank in (0, 1)]
    for process in processes:
        process.start()
    results = dict((r[0], r[1:]) for r in (queue.get(timeout=240) for _ in processes))
    for process in processes:
        process.join(timeout=60)
    assert all(result[0] != "error" for result in results.values()), results
    # turn 1: all three rows of the group in one call; turn 2: rank 0's searching row, and rank 1,
    # whose rows are done, still joins the call
    assert results[0][0] == results[1][0] == [3, 1], results
    assert results[0][1] == [(["Mountain Time Zone"], "answer", 1)]
    assert results[1][1] == [(["Paris"], "answer", 0), (["Euro"], "answer", 0)]
