"""The GRPO run's rollouts, one way for all of them (`PolicyRollouts`): the training rollouts TRL trains on
(`KGRollout`, its `rollout_func`), the dev curve's (`grpo_callbacks.DevEval`) and the whole dev split's
measurement of each save (`checkpoint_choice.BestKeeper`, through `greedy_verdicts`), so a run evaluates on the
backend it trains with. Every answer is judged right or wrong in one place (`right_answers`, the answer
reward's own `rewards.is_right`).

What the rollouts show beside TRL's own `reward` and `rewards/<name>/mean` (the policy's own rows: guided rows
are logged apart, `guidance/gold_rows` and `guidance/gold_<name>`): searches and correct answers per rollout by
hop count (`rollout/searches_hop<h>`, `rollout/correct_hop<h>`), the share of groups whose answers all got one
reward and of groups guided, by hop count (`rollout/answer_tied_hop<h>`, `rollout/guided_hop<h>`), and the share
of rows rolled out after a gold prefix that answered right (`rollout/prefix_correct`). They go through TRL's own
metric path (the `log_metric` its reward functions get), which averages them over the ranks.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from kgreasoner.rewards import is_right
from kgreasoner.training.common import generation_context
from kgreasoner.training.frontier import GroupLog

if TYPE_CHECKING:
    from kgreasoner.rollout.types import RolloutConfig, SamplingParams, Trajectory
    from kgreasoner.training.grpo_recipe import GRPORecipe


def right_answers(trajectories: Sequence[Trajectory], examples: Sequence[Any]) -> list[bool]:
    """Whether each rollout answered its question right (`rewards.is_right`, as the answer reward judges)."""
    return [is_right(t.text, e.answers, t.resolved_answers, t.tool_spans) for t, e in zip(trajectories, examples)]


class PolicyRollouts:
    """The engine's rollouts of QA examples in fresh sessions of the search `tool` on the trainer's current
    weights, through the run's rollout backend (`hf` or `vllm`) within the `limits` of the run's rollout.

    Every rank calls it together, with rows or none: under ZeRO-3 the hf generation context gathers the
    weights on all ranks at once, and vLLM's tensor-parallel group turns together. With vLLM the engine
    first gets the current weights when TRL has not loaded this step's yet (it does so only before its own
    generation, so a dev evaluation after a step would read the previous step's)."""

    def __init__(self, backend: str, limits: RolloutConfig, tool) -> None:
        self.backend = backend
        self.limits = limits
        self.tool = tool

    def __call__(self, trainer, examples, sampling: SamplingParams, prompts=None, prefixes=None) -> list[Trajectory]:
        """The rollouts of `examples`, from `prompts` (their prompt strings; by default the engine builds
        them from the examples) after `prefixes` (gold turns given with no loss, one list a row)."""
        from kgreasoner.rollout.engine import RolloutEngine
        from kgreasoner.rollout.hf_backend import HFBackend

        sessions = [self.tool.session(e.question, list(e.topic_entities), example_id=e.id) for e in examples]
        prompts = list(examples) if prompts is None else prompts
        if self.backend == "vllm":
            from kgreasoner.rollout.vllm_backend import VLLMBackend
            from kgreasoner.training.trl_internals import sync_vllm_weights, vllm_engine

            sync_vllm_weights(trainer)
            # With tensor parallelism the ranks of a TP group share one engine: the backend gathers their requests.
            llm, tp_group = vllm_engine(trainer)
            backend = VLLMBackend(trainer.processing_class, llm=llm, tp_group=tp_group)
            return RolloutEngine(backend, None, self.limits).run(prompts, sessions, sampling, prefixes=prefixes)
        tokenizer = trainer.processing_class
        assert isinstance(tokenizer, PreTrainedTokenizerBase), "GRPO on text: a tokenizer"
        with generation_context(trainer) as model:
            engine = RolloutEngine(HFBackend(model, tokenizer), None, self.limits)
            return engine.run(prompts, sessions, sampling, prefixes=prefixes)


def dev_batches(count: int, rank: int, world: int, size: int) -> list[list[int]]:
    """The dev sample's positions rank `rank` of `world` rolls out (every world-th from its own), in batches of
    at most `size`. Every rank gets as many batches as the largest share needs, the last ones empty where its
    share is smaller: each batch is a collective (ZeRO-3's gather, vLLM's tensor-parallel turns)."""
    mine = list(range(rank, count, world))
    largest = -(-count // world)  # rank 0's share, ceil(count / world)
    return [mine[start : start + size] for start in range(0, largest, size)]


def greedy_verdicts(
    rollouts: PolicyRollouts, trainer, examples: Sequence[Any], batch_size: int
) -> list[tuple[bool, int]]:
    """Every rank together: the trainer's current policy's greedy verdict on each of `examples` and its number
    of searches, in the examples' order on every rank. Each rank rolls out its share (every world_size-th
    question) through `rollouts` in calls of at most `batch_size` rows (`dev_batches`), as many calls on every
    rank; the verdicts are gathered back."""
    from accelerate.utils import gather_object

    from kgreasoner.rollout.types import SamplingParams

    accelerator = trainer.accelerator
    greedy = SamplingParams(temperature=0.0)
    positions: list[int] = []
    trajectories: list[Trajectory] = []
    for batch in dev_batches(len(examples), accelerator.process_index, accelerator.num_processes, batch_size):
        trajectories += rollouts(trainer, [examples[i] for i in batch], greedy)
        positions += batch
    right = right_answers(trajectories, [examples[i] for i in positions])
    mine = [(i, r, t.num_searches) for i, r, t in zip(positions, right, trajectories)]
    return [(r, n) for _, r, n in sorted(gather_object(mine))]


class KGRollout:
    """TRL `rollout_func`: the run's `rollouts` of a generation batch's prompts (`examples_by_prompt` maps each
    to its question), guided groups planned and filled in (`recipe.guidance`), each group's right answers
    recorded in `group_log` as sampled."""

    def __init__(
        self, recipe: GRPORecipe, rollouts: PolicyRollouts, examples_by_prompt: dict[str, Any], group_log: GroupLog
    ) -> None:
        from kgreasoner.training.guidance import GoldTrajectories

        self.recipe = recipe
        self.rollouts = rollouts
        self.examples_by_prompt = examples_by_prompt
        self.group_log = group_log
        self.rollout_seconds = 0.0
        gold = recipe.guidance.trajectories  # set whenever guidance is on (Guidance checks it)
        self.gold = GoldTrajectories(gold) if recipe.guidance.mode != "none" and gold else None

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        from kgreasoner.rollout.types import SamplingParams, trl_rollout_output
        from kgreasoner.training.trl_internals import GUIDED_COLUMN, log_metric

        started = time.perf_counter()
        examples = [self.examples_by_prompt[p] for p in prompts]
        # A different, reproducible stream per step and rank; resuming replays the same seeds.
        args = trainer.args
        seed = args.seed + 1_000_003 * trainer.state.global_step + 7919 * trainer.accelerator.process_index
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=seed)
        trajectories = self.rollouts(trainer, examples, sampling, prompts)
        correct = right_answers(trajectories, examples)
        self.group_log.record(trainer, examples, correct)  # on-policy counts: before any guided row replaces one
        rows, group_figures = self.guide(trajectories, examples, correct, trainer, prompts, sampling)
        elapsed = time.perf_counter() - started
        self.rollout_seconds += elapsed
        fresh = [row for row, first in zip(rows, trajectories) if row is not first and row.prefix_tokens]
        tool_seconds = sum(c.seconds for t in [*trajectories, *fresh] for c in t.tool_calls)
        # TRL's metric path: it averages these over the ranks when it flushes the step's reward metrics
        figures = self.figures(trajectories, examples, correct, elapsed, tool_seconds) | group_figures
        for name, value in figures.items():
            log_metric(trainer, name, value)
        output = trl_rollout_output(rows, trainer.processing_class.eos_token_id)
        if self.gold is not None:  # the trainer's GuidedRowAdvantages reads it
            output[GUIDED_COLUMN] = [row is not first for row, first in zip(rows, trajectories)]
        return output

    def guide(self, trajectories, examples, correct, trainer, prompts, sampling) -> tuple[list, dict[str, float]]:
        """The rows TRL trains on (each planned guided row replaced by its gold row, or by a rollout after its
        gold prefix) and the group figures, both over whole groups gathered from every rank
        (`kgreasoner.training.guidance`); with gold prefixes, `rollout/prefix_correct` is the share of those
        rollouts that answered right (over every rank's; absent in a step that guided none)."""
        import dataclasses

        from accelerate.utils import gather_object

        from kgreasoner.records.sampling import hop_count
        from kgreasoner.training.guidance import RowVerdict, gathered_plan, held

        prefixed = self.recipe.guidance.mode == "gold_prefix"
        verdicts = [
            RowVerdict(bool(right), hop_count(e), self._guidable(e, prompt) if self.gold else False)
            for right, e, prompt in zip(correct, examples, prompts)
        ]
        group_plan, offset = gathered_plan(
            verdicts, trainer.args.num_generations, self.gold is not None, trainer.accelerator.process_index
        )
        rows, figures = list(trajectories), dict(group_plan.figures)
        mine = held(group_plan.guided, offset, len(rows))
        if prefixed and group_plan.guided:  # every rank knows the plan: all generate, with rows or none
            picked = [examples[i] for i in mine]
            prefixes = [self._prefix(examples[i], prompts[i]) for i in mine]
            # a stream of its own: the first pass's seed would redraw that pass's first tokens
            again = dataclasses.replace(sampling, seed=None if sampling.seed is None else sampling.seed + 500_009)
            continued = self.rollouts(trainer, picked, again, [prompts[i] for i in mine], prefixes)
            for i, row in zip(mine, continued):
                rows[i] = dataclasses.replace(row, index=i)
            everyone = gather_object(right_answers(continued, picked))  # a collective: every rank is here
            figures["rollout/prefix_correct"] = sum(everyone) / len(everyone)
        elif not prefixed:
            for i in mine:
                assert self.gold is not None  # a guided row exists only with gold trajectories
                e = examples[i]
                session = self.rollouts.tool.session(e.question, list(e.topic_entities), example_id=e.id)
                rows[i] = self.gold.row(e, rows[i].prompt_ids, trainer.processing_class, session, index=i)
        return rows, figures

    def _prefix(self, example, prompt: str) -> list[str]:
        from kgreasoner.records.sampling import hop_count

        assert self.gold is not None  # asked only with gold trajectories
        return self.gold.prefix(example.id, hop_count(example), prompt, self.recipe.rollout.max_turns)

    def _guidable(self, example, prompt: str) -> bool:
        """The question has a gold row to give (gold), or a gold prefix of at least one turn (gold_prefix)."""
        if self.recipe.guidance.mode == "gold_prefix":
            return bool(self._prefix(example, prompt))
        return self.gold is not None and example.id in self.gold

    @staticmethod
    def figures(trajectories, examples, correct, elapsed: float, tool_seconds: float) -> dict[str, float]:
        """This rank's rollout figures of one generation batch (the policy's own rollouts, before any guided
        row): `rollout/*` per rollout, `time/*` in seconds."""
        from kgreasoner.protocol import check_format
        from kgreasoner.records.sampling import hop_count

        n = max(len(trajectories), 1)
        by_hops: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for trajectory, example, right in zip(trajectories, examples, correct):
            by_hops[hop_count(example)].append((trajectory.num_searches, right))
        figures = {}
        for hops, pairs in sorted(by_hops.items()):
            figures[f"rollout/searches_hop{hops}"] = sum(p[0] for p in pairs) / len(pairs)
            figures[f"rollout/correct_hop{hops}"] = sum(p[1] for p in pairs) / len(pairs)
        model_tokens = sum(t.num_model_tokens for t in trajectories)
        all_tokens = sum(len(t.completion_ids) for t in trajectories)
        figures.update(
            {
                "rollout/searches": sum(t.num_searches for t in trajectories) / n,
                "rollout/tool_calls": sum(t.num_tool_calls for t in trajectories) / n,
                "rollout/backtracks": sum(t.num_backtracks for t in trajectories) / n,
                "rollout/model_tokens": model_tokens / n,
                "rollout/tool_token_share": (all_tokens - model_tokens) / max(all_tokens, 1),
                "rollout/format_valid": sum(check_format(t.text, t.tool_spans).valid for t in trajectories) / n,
                "rollout/answered": sum(t.finish_reason == "answer" for t in trajectories) / n,
                "time/generation_s": elapsed - tool_seconds,
                "time/tool_s": tool_seconds,
            }
        )
        return figures
