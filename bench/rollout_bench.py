"""Rollout throughput: (a) plain batched generation, (b) our engine, (c) naive re-generation.

    python -m bench.rollout_bench [--batch 64] [--calls 3] [--free 16] [--top-k 10] [--repeats 2] [--threads N]

Setup: the tiny model of `kgreasoner.models` (Qwen3, hidden 256, 4 layers, word-level tokenizer
with tags and handles as single tokens, randomly initialised) and the search tool with entity
handles over the synthetic KG of `data_gen.synthetic`. An untrained model does not search, so a
scripted logits processor forces the same pattern on every method: per row, `--calls` turns of
`--free` freely sampled tokens then `<search>E{k}</search>`, and a last turn of free tokens then
`</think><answer>E2</answer>`. Free tokens never sample a tag or EOS. The script is indexed by
model-written tokens, so (a), (b) and (c) write the same number of model tokens per row.

- (a) `model.generate` on the batch, no tool: as many new tokens per row as (b)'s longest
  completion (model + tool tokens), every one decoded.
- (b) `RolloutEngine` with the hf backend: model tokens decoded, tool blocks prefilled.
- (c) the naive way: `model.generate` for all unfinished rows until `</search>`/`</answer>`,
  then the tool, then `generate` again from the re-tokenised full text of every unfinished row.

Tokens/s counts completion tokens (model-written + tool-inserted) per second of wall time —
what each method produces after the prompt; model-written tokens/s are printed too. Targets:
(b) >= 0.7 x (a) and (b) >= 3 x (c).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from data_gen.synthetic import generate as generate_synthetic
from kgreasoner.models import TinyModelConfig, build_tiny_model
from kgreasoner.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    TAGS,
    THINK_CLOSE,
    THINK_OPEN,
    build_prompt,
    format_tool_block,
    last_open_search,
)
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams
from kgreasoner.rollout.hf_backend import HFBackend
from kgreasoner.tokenizer import TokenizerConfig, train_tokenizer

FREE = None


def build_script(tokenizer, calls: int, free: int) -> list[int | None]:
    """Model-token script shared by every row: None = sample freely, an id = force it."""

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    script: list[int | None] = ids(THINK_OPEN)
    for call in range(calls):
        script += [FREE] * free + ids(f"{SEARCH_OPEN}E{call + 1}{SEARCH_CLOSE}")
    return script + [FREE] * free + ids(f"{THINK_CLOSE}{ANSWER_OPEN}E2{ANSWER_CLOSE}")


class Script:
    """Forces the script at a given model-token number; bans tags and EOS at free positions."""

    def __init__(self, script: list[int | None], banned: list[int]) -> None:
        self.script = script
        self.banned = banned

    def apply(self, logits: torch.Tensor, numbers: list[int]) -> torch.Tensor:
        logits = logits.clone()
        for i, k in enumerate(numbers):
            forced = self.script[k] if k < len(self.script) else FREE
            if forced is FREE:
                logits[i, self.banned] = float("-inf")
            else:
                logits[i] = float("-inf")
                logits[i, forced] = 0.0
        return logits

    def engine_processor(self, rows, logits):
        return self.apply(logits, [row.num_model_tokens for row in rows])


class GenerateScript(LogitsProcessor):
    """The same script inside `model.generate`: token number = tokens written before + new ones."""

    def __init__(self, script: Script, offsets: list[int], prompt_width: int) -> None:
        self.script, self.offsets, self.prompt_width = script, offsets, prompt_width

    def __call__(self, input_ids, scores):
        new = input_ids.shape[1] - self.prompt_width
        return self.script.apply(scores, [offset + new for offset in self.offsets])


def left_pad(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(ids) for ids in batch)
    ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return ids, mask


def run_plain(model, tokenizer, prompts, script, new_tokens, seed) -> tuple[float, int]:
    ids, mask = left_pad(tokenizer, prompts)
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            logits_processor=LogitsProcessorList([GenerateScript(script, [0] * len(prompts), ids.shape[1])]),
            eos_token_id=None,
            pad_token_id=tokenizer.pad_token_id,
        )
    seconds = time.perf_counter() - start
    return seconds, (out.shape[1] - ids.shape[1]) * len(prompts)


def run_naive(model, tokenizer, prompts, sessions, script, config: RolloutConfig, seed) -> tuple[float, int, int]:
    """Re-generate every unfinished row from its full text after each round of tool calls."""

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    stops = [
        tokenizer.convert_tokens_to_ids(SEARCH_CLOSE),
        tokenizer.convert_tokens_to_ids(ANSWER_CLOSE),
        tokenizer.eos_token_id,
    ]
    texts = [""] * len(prompts)
    model_tokens = [0] * len(prompts)
    completion_tokens = [0] * len(prompts)
    active = list(range(len(prompts)))
    torch.manual_seed(seed)
    start = time.perf_counter()
    while active:
        ids, mask = left_pad(tokenizer, [prompts[i] + texts[i] for i in active])
        processor = GenerateScript(script, [model_tokens[i] for i in active], ids.shape[1])
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=config.max_turn_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                logits_processor=LogitsProcessorList([processor]),
                eos_token_id=stops,
                pad_token_id=tokenizer.pad_token_id,
            )
        still = []
        for row, new in zip(active, out[:, ids.shape[1] :].tolist()):
            cut = next((k + 1 for k, t in enumerate(new) if t in stops), len(new))
            new = new[:cut]
            model_tokens[row] += len(new)
            completion_tokens[row] += len(new)
            texts[row] += tokenizer.decode(new, skip_special_tokens=False)
            if new and new[-1] == stops[0] and len(sessions[row].queries) < config.max_turns:
                block = format_tool_block(sessions[row].call(last_open_search(texts[row]) or "").text)
                completion_tokens[row] += len(encode(block))
                texts[row] += block
                still.append(row)
        active = still
    return time.perf_counter() - start, sum(completion_tokens), sum(model_tokens)


class CountingSession:
    """Wraps a real search session to count the queries the naive loop sends."""

    def __init__(self, session) -> None:
        self.session, self.queries = session, []

    def call(self, query):
        self.queries.append(query)
        return self.session.call(query)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3, help="tool calls per row")
    parser.add_argument("--free", type=int, default=16, help="freely sampled tokens per turn")
    parser.add_argument("--top-k", type=int, default=10, help="triples per tool call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per method; the fastest is reported")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    data = generate_synthetic(seed=args.seed, num_entities=1500, num_questions=300)
    kg = data.kg()
    texts = [e.question for e in data.examples] + list(data.names.values()) + list(set(data.relations.tolist()))
    tokenizer = train_tokenizer(texts, TokenizerConfig())
    model = build_tiny_model(TinyModelConfig(seed=args.seed), tokenizer).eval()
    tool = KGSearchTool(kg, ToolConfig(entity_handles=True, top_k=args.top_k))
    examples = [data.examples[i % len(data.examples)] for i in range(args.batch)]
    prompts = [build_prompt(e.question, list(e.topic_entities), tokenizer) for e in examples]
    banned = sorted(
        {tokenizer.convert_tokens_to_ids(t) for t in TAGS} | {tokenizer.eos_token_id, tokenizer.pad_token_id}
    )
    script = Script(build_script(tokenizer, args.calls, args.free), banned)
    config = RolloutConfig(
        max_turns=args.calls, max_turn_tokens=4 * args.free + 16, max_new_tokens=4096, max_tool_tokens=1024
    )
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Qwen3 hidden 256, 4 layers, {params / 1e6:.1f}M parameters, vocab {len(tokenizer)}; "
        f"KG: {data.num_triples} triples; batch {args.batch}; torch threads {torch.get_num_threads()}"
    )
    print(
        f"scripted pattern (same for a, b, c): {args.calls} x ({args.free} free tokens + <search>E_k</search>), "
        f"then {args.free} free tokens + </think><answer>E2</answer>"
    )

    # warm-up (allocator, kernels) on a small batch
    RolloutEngine(HFBackend(model, tokenizer, [script.engine_processor]), tool, config).run(examples[:4])

    # The machine is shared: each method runs `--repeats` times, interleaved, and the fastest counts.
    a_seconds = b_seconds = c_seconds = float("inf")
    for _ in range(args.repeats):
        engine = RolloutEngine(HFBackend(model, tokenizer, [script.engine_processor]), tool, config)
        start = time.perf_counter()
        trajectories = engine.run(examples, sampling=SamplingParams(temperature=1.0, seed=args.seed))
        b_seconds = min(b_seconds, time.perf_counter() - start)
        b_completion = sum(len(t.completion_ids) for t in trajectories)
        b_model = sum(t.num_model_tokens for t in trajectories)

        longest = max(len(t.completion_ids) for t in trajectories)
        seconds, a_tokens = run_plain(model, tokenizer, prompts, script, longest, args.seed)
        a_seconds = min(a_seconds, seconds)

        sessions = [CountingSession(tool.session(e.question, list(e.topic_entities))) for e in examples]
        seconds, c_completion, c_model = run_naive(model, tokenizer, prompts, sessions, script, config, args.seed)
        c_seconds = min(c_seconds, seconds)
    calls = sum(t.num_tool_calls for t in trajectories) / len(trajectories)
    reasons = sorted({t.finish_reason for t in trajectories})

    a_rate, b_rate, c_rate = a_tokens / a_seconds, b_completion / b_seconds, c_completion / c_seconds
    print(
        f"(b) engine: {calls:.2f} tool calls per row, finish reasons {reasons}, "
        f"{b_model} model + {b_completion - b_model} tool tokens"
    )
    print(f"(a) plain generate : {a_tokens:7d} tokens in {a_seconds:6.2f} s = {a_rate:8.0f} tokens/s")
    print(
        f"(b) rollout engine : {b_completion:7d} tokens in {b_seconds:6.2f} s = {b_rate:8.0f} tokens/s "
        f"({b_model / b_seconds:.0f} model tokens/s)"
    )
    print(
        f"(c) naive regen    : {c_completion:7d} tokens in {c_seconds:6.2f} s = {c_rate:8.0f} tokens/s "
        f"({c_model / c_seconds:.0f} model tokens/s)"
    )
    print(f"(b)/(a) = {b_rate / a_rate:.2f}  (target >= 0.7)")
    print(f"(b)/(c) = {b_rate / c_rate:.2f}  (target >= 3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
