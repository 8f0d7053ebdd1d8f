"""vLLM as a turn backend: offline `vllm.LLM`, or a vLLM server's `/v1/completions`, from token ids.

Each turn sends every active row's prompt + completion ids (vLLM's prefix cache makes the repeated
prefix cheap) and gets back the sampled ids and their logprobs up to `</search>`/`</answer>`.
A tag stop is a `stop` string, not stop token ids: a real tokenizer merges the tag with the text
before it (`.</` `search` `>`), which only the decoded text shows. vLLM cuts its output *text*
after the stop string (`include_stop_str_in_output`) but returns every sampled id, the one that
completed the tag included, even when that token carries characters past the tag; the engine
feeds the ids through the same decoded-text stop check as the other backends and drops anything
after the stop. Sampled ids are used as returned, never re-tokenised. A turn also stops at every
EOS id (`stop_token_ids`): the generation config's, from `model_dir` (by default the tokenizer's
folder), and the tokenizer's, whatever EOS the engine or server was started with.

- Offline: `VLLMBackend(tokenizer, llm=vllm.LLM(...))`: `llm.generate` with `TokensPrompt`s and
  one `SamplingParams` per row (seeded per row and turn).
- Offline inside a tensor-parallel group (TRL's colocated vLLM with `vllm_tensor_parallel_size` > 1,
  `tp_group=`): the ranks of a group drive one engine together, so every rank must make the same
  `generate` calls with the same requests. Each turn, the ranks gather their rows' requests
  (`all_gather_object` over the group), all generate the concatenation, and each keeps its own
  slice, as TRL's single-turn path does; a rank whose rows are all finished keeps joining the
  turns (with no rows) until every rank of the group is done (`group_active`). Only object
  collectives go over the group: TRL's group is NCCL, which takes CUDA tensors only, and torch
  moves an object collective's buffers to the rank's current CUDA device itself.
- Server: `VLLMBackend(tokenizer, base_url="http://host:8000/v1", model=NAME)`: a token-id
  `prompt`, `return_token_ids` (vLLM >= 0.10) with `return_tokens_as_token_ids` as a fallback,
  `logprobs: 0` (the sampled token's logprob only), `skip_special_tokens: false`. Start the
  server with `--logprobs-mode processed_logprobs` so logprobs include temperature (TRL does the
  same for its importance-sampling correction). Requests go through `kgreasoner.records.http.JSONEndpoint`
  (transient failures tried `retries` more times); a request that still fails ends its row with an error.

This module imports without vLLM installed: `vllm` is imported when an offline backend is built.
Constrained decoding is vLLM's structured output (vLLM >= 0.12): each row's turn carries the regex of
`constraints.turn_regex` over the entities its session has shown (`structured_outputs: {regex}` in a
request, `StructuredOutputsParams(regex=...)` offline), so sampled tokens and their logprobs come
from the constrained distribution, as with the hf backend's token-level mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kgreasoner.protocol import STOP_TAGS
from kgreasoner.records.http import JSONEndpoint
from kgreasoner.rollout.hf_backend import eos_token_ids as _model_eos_ids
from kgreasoner.rollout.openai_backend import JSONObject, first_choice, row_seed, run_concurrently
from kgreasoner.rollout.types import SamplingParams, TurnBackend, TurnOutput

if TYPE_CHECKING:
    import torch.distributed
    import vllm
    from transformers import PreTrainedTokenizerBase

Request = tuple[list[int], JSONObject, str | None]
"""One row's turn as plain data a tensor-parallel group can gather: (ids, `sampling_kwargs`, regex)."""

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM spells tokens with `return_tokens_as_token_ids`: `token_id:1234`."""


def sampling_kwargs(
    sampling: SamplingParams, budget: int, seed: int | None, eos_ids: Sequence[int] = ()
) -> JSONObject:
    """Keyword arguments of `vllm.SamplingParams` for one row's turn; it stops at every id of `eos_ids` too."""
    return {
        "n": 1,
        "max_tokens": budget,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "seed": seed,
        "logprobs": 0,
        "stop": list(STOP_TAGS),
        "stop_token_ids": list(eos_ids),
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
    }


class VLLMBackend(TurnBackend):
    """Offline `vllm.LLM` or a vLLM OpenAI-compatible server, generating one turn from token ids."""

    supports_constraints = True

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        llm: vllm.LLM | None = None,
        base_url: str | None = None,
        model: str | None = None,
        eos_ids: Sequence[int] | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 600.0,
        max_concurrency: int = 64,
        tp_group: torch.distributed.ProcessGroup | None = None,
        retries: int = 2,
        backoff: float = 0.5,
        model_dir: str | None = None,
    ) -> None:
        if (llm is None) == (base_url is None):
            raise ValueError("give exactly one of llm (offline vllm.LLM) or base_url (a vLLM server)")
        if base_url is not None and not model:
            raise ValueError("server mode needs the served model name (model=...)")
        self.tokenizer = tokenizer
        self.llm = llm
        self.endpoint = (
            None
            if base_url is None
            else JSONEndpoint(base_url, api_key_env, timeout=timeout, retries=retries, backoff=backoff)
        )
        self.url = None if self.endpoint is None else self.endpoint.base_url + "/completions"
        self.model = model
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        if eos_ids is None:  # the generation config in model_dir (by default the tokenizer's folder)
            eos_ids = _model_eos_ids(None, tokenizer, model_dir)
        self.eos_token_ids = list(eos_ids)
        self.tp_group = tp_group

    def group_active(self, active: bool) -> bool:
        """True while any rank of the tensor-parallel group still has rows (just `active` without a group)."""
        if self.tp_group is None:
            return active
        import torch.distributed as dist

        # An object collective, not a tensor one: TRL's group is NCCL, which takes no CPU tensors, and torch
        # puts an object collective's buffers on the device the group's backend takes (for NCCL the rank's
        # current CUDA device, which accelerate sets).
        flags: list[object] = [None] * dist.get_world_size(group=self.tp_group)
        dist.all_gather_object(flags, bool(active), group=self.tp_group)
        return any(flags)

    @classmethod
    def offline(cls, model_path: str, tokenizer: PreTrainedTokenizerBase, **llm_kwargs: object) -> VLLMBackend:
        """Build `vllm.LLM(model_path, **llm_kwargs)`; vLLM is imported only here."""
        import vllm

        return cls(tokenizer, llm=vllm.LLM(model=model_path, **llm_kwargs), model_dir=model_path)

    # ------------------------------------------------------------------ server mode
    def request_body(
        self, prompt_ids: list[int], budget: int, sampling: SamplingParams, seed: int | None, regex: str | None = None
    ) -> JSONObject:
        body: JSONObject = {
            key: value
            for key, value in sampling_kwargs(sampling, budget, seed, self.eos_token_ids).items()
            if key not in ("n", "seed") or value is not None
        }
        body.update(
            {
                "model": self.model,
                "prompt": list(prompt_ids),
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            }
        )
        if regex is not None:
            body["structured_outputs"] = {"regex": regex}
        return body

    @staticmethod
    def parse(reply: JSONObject) -> TurnOutput:
        """Sampled ids and logprobs from a `/v1/completions` reply (one choice)."""
        choice = first_choice(reply)
        logprobs = choice.get("logprobs") or {}
        if not isinstance(logprobs, dict):
            return TurnOutput([], [], f"the server's logprobs are not an object: {str(logprobs)[:200]}")
        listed = logprobs.get("token_logprobs") or []
        if not isinstance(listed, list):
            return TurnOutput([], [], f"the server's token_logprobs are not a list: {str(listed)[:200]}")
        values = [float("nan") if v is None else float(v) for v in listed]
        returned = choice.get("token_ids")
        if isinstance(returned, list):
            ids = [int(t) for t in returned]
        else:
            tokens = logprobs.get("tokens") or []
            if not isinstance(tokens, list) or not all(
                isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens
            ):
                return TurnOutput([], [], "the server returned no token ids (needs vLLM with return_token_ids)")
            ids = [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
        if len(values) != len(ids):
            return TurnOutput([], [], f"the server returned {len(ids)} token ids but {len(values)} logprobs")
        return TurnOutput(ids, values)

    # ------------------------------------------------------------------ the turn
    def complete(
        self,
        prompts: Sequence[list[int]],
        budgets: Sequence[int],
        sampling: SamplingParams,
        turn: int,
        indices: Sequence[int],
        regexes: Sequence[str] | None = None,
    ) -> list[TurnOutput]:
        """One turn per row; `regexes[i]` (constrained decoding) is the structured-output pattern of row i."""
        seeds = [row_seed(sampling, index, turn) for index in indices]
        patterns = list(regexes) if regexes is not None else [None] * len(prompts)
        if self.llm is not None:
            return self._complete_offline(self.llm, prompts, budgets, sampling, seeds, patterns)
        endpoint = self.endpoint
        assert endpoint is not None  # __init__ takes exactly one of llm and base_url

        def job(ids: list[int], budget: int, seed: int | None, regex: str | None) -> Callable[[], TurnOutput]:
            def run() -> TurnOutput:
                if budget <= 0:
                    return TurnOutput([], [])
                try:
                    return self.parse(
                        endpoint.post("/completions", self.request_body(ids, budget, sampling, seed, regex))
                    )
                except Exception as err:  # a network or server fault ends this row, not the batch
                    return TurnOutput([], [], f"vLLM request failed: {err}")

            return run

        jobs = [job(p, b, s, r) for p, b, s, r in zip(prompts, budgets, seeds, patterns)]
        return run_concurrently(jobs, self.max_concurrency)

    def _complete_offline(
        self,
        llm: vllm.LLM,
        prompts: Sequence[list[int]],
        budgets: Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int | None],
        patterns: Sequence[str | None],
    ) -> list[TurnOutput]:
        import vllm
        from vllm.inputs import TokensPrompt

        outputs: list[TurnOutput] = [TurnOutput([], []) for _ in prompts]
        todo = [i for i, budget in enumerate(budgets) if budget > 0]
        requests: list[Request] = []  # plain data, so a tensor-parallel group can gather it
        for i in todo:
            kwargs = sampling_kwargs(sampling, budgets[i], seeds[i], self.eos_token_ids)
            requests.append((list(prompts[i]), kwargs, patterns[i]))
        everything, offset = self._gather(requests)
        if not everything:
            return outputs
        params = []
        for _, kwargs, pattern in everything:
            if pattern is not None:
                from vllm.sampling_params import StructuredOutputsParams

                kwargs = {**kwargs, "structured_outputs": StructuredOutputsParams(regex=pattern)}
            params.append(vllm.SamplingParams(**kwargs))
        try:
            results = llm.generate(
                [TokensPrompt(prompt_token_ids=ids) for ids, _, _ in everything], params, use_tqdm=False
            )
        except Exception as err:  # the engine records it per row
            return [TurnOutput([], [], f"vLLM generate failed: {err}") for _ in prompts]
        for i, result in zip(todo, results[offset : offset + len(requests)]):
            completion = result.outputs[0]
            ids = list(completion.token_ids)
            values = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], ids)]
            outputs[i] = (
                TurnOutput(ids, values)
                if len(values) == len(ids)
                else TurnOutput([], [], "vLLM returned no logprobs for the sampled tokens")
            )
        return outputs

    def _gather(self, requests: list[Request]) -> tuple[list[Request], int]:
        """Every request of the tensor-parallel group in rank order, and where this rank's start."""
        if self.tp_group is None:
            return requests, 0
        import torch.distributed as dist

        gathered: list[list[Request]] = [[] for _ in range(dist.get_world_size(group=self.tp_group))]
        dist.all_gather_object(gathered, requests, group=self.tp_group)
        rank = dist.get_rank(group=self.tp_group)
        return [r for part in gathered for r in part], sum(len(part) for part in gathered[:rank])
