"""GRPO with tool-masked multi-turn rollouts (paper, Section 4.3 and Appendix A): the assembly of a run.

TRL's `GRPOTrainer` does the policy update; generation is ours: `rollout_func` runs the
`RolloutEngine` (search tool in the loop) on the trainer's current weights and hands back
`prompt_ids`, `completion_ids`, `logprobs` and `env_mask`, so tool-inserted tokens carry no
loss and sampled ids are never re-tokenised (`grpo_rollout`). The rewards are the paper's search, format and
answer components (`kgreasoner.rewards`), each logged by TRL under `rewards/<name>`. The recipe is
`grpo_recipe.GRPORecipe`; the step log and the dev curve are `grpo_callbacks`'.

Episodes: episode 1 trains on every training question for a stable initial policy; later
episodes train on the hard cases (`data: hard`, the paper's episode, its questions mined from the policy:
those episode 1's groups got partly or wholly wrong, with a replay share of the rest in every batch;
`kgreasoner.training.hard_cases`) or on
the frontier (`data: frontier`: the questions episode 1's groups answered sometimes but not always,
plus a replay share of the rest; `kgreasoner.training.frontier`). Questions come in a
stratified order (`order`, `kgreasoner.records.sampling.balanced_order`): hop counts take turns,
so every batch of a few questions holds multi-hop questions and short chains alike.

Guided groups (`guidance.mode: gold`, `kgreasoner.training.guidance`): a group whose rollouts hold no right
answer trains on its question's gold warm-up trajectory in place of its last rollout, an off-policy row
with exact ids and masks; the groups are planned whole over every rank's rows. With `guidance.mode: gold_prefix`
that row is rolled out again from the gold trajectory's first h - 1 search turns (no loss on them). A guided
row trains with the fixed advantage `guidance.gold_advantage` when it answers right (0 when not), and stays out of its
group's mean and std (`trl_internals.GuidedRowAdvantages`).

What shows learning, beside TRL's own `reward`, `frac_reward_zero_std` (groups whose rollouts all got one
reward: no gradient) and `entropy`: the rollout figures (`grpo_rollout`) and greedy Hits@1 on a fixed dev
sample (`grpo_callbacks.DevEval`). Under torchrun only the main process logs progress. Each episode is one TRL
run in `run_dir/episode-<k>` starting from the previous episode's final weights;
`--resume` continues the first unfinished episode from its last checkpoint. The episodes share one AdamW
state and one learning-rate schedule (`episode_carry`, `kgreasoner.training.episode_schedule`). With
`dev_eval.choose_final: best_dev` the last episode's `final` ends up holding the warm-up or the save of the whole
run with the best Hits@1 on the whole dev split, no hop count more than one standard error below the
warm-up's (`kgreasoner.training.checkpoint_choice`, `run_dir/chosen.json`).

With `rollout_backend: vllm` the step log also carries the shares of model tokens and of rollouts that
TRL's importance-sampling correction dropped or capped (`importance_sampling`: `rollout/is_dropped`,
`rollout/is_dropped_rows`, `rollout/is_capped`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelerate import PartialState
from accelerate.logging import get_logger
from transformers import TrainerCallback

from kgreasoner.training.checkpoint_choice import CHOSEN, BestKeeper, apply_choice
from kgreasoner.training.common import (
    ddp_backend,
    is_saved_model,
    last_complete_checkpoint,
    save_final,
    start_process_group,
)
from kgreasoner.training.episode_schedule import plan_episode
from kgreasoner.training.frontier import GROUPS_FILE, GroupLog, frontier_examples
from kgreasoner.training.grpo_callbacks import DevEval, RolloutMetrics, StepLog
from kgreasoner.training.grpo_recipe import Episode, GRPORecipe
from kgreasoner.training.grpo_rollout import KGRollout, PolicyRollouts
from kgreasoner.training.hard_cases import hard_examples, replay_order, replay_slots
from kgreasoner.training.plots import STEP_LOG

__all__ = ["Episode", "GRPORecipe", "build_trainer", "grpo_config", "train_grpo"]
logger = get_logger(__name__)  # main process only unless a call says otherwise


def grpo_config(recipe: GRPORecipe, output_dir: Path, episode: Episode):
    """TRL's GRPOConfig of one episode: the recipe's `trainer` mapping over kgreasoner's defaults (`GRPO_TRAINER`).

    The lengths come from the recipe's own budget (`rollout.types.sequence_tokens`): vLLM's context
    holds the longest prompt plus the longest completion, instead of the model's whole context
    (131,072 tokens for Llama-3.1, whose KV cache for one such sequence does not fit vLLM's share), and
    `max_completion_length` is the longest completion the rollout hands TRL (`dr_grpo` divides by it).
    """
    import torch

    from kgreasoner.rewards import reward_functions
    from kgreasoner.rollout.types import completion_tokens, sequence_tokens

    return recipe.TRAINER.build(
        recipe.trainer,
        dict(
            output_dir=str(output_dir),
            num_train_epochs=episode.num_train_epochs,
            max_steps=episode.max_steps,
            reward_weights=recipe.rewards.weights([f.__name__ for f in reward_functions(recipe.rewards.search_form)]),
            # a hard episode lays out its own batches (hard cases and replay): TRL must keep them
            shuffle_dataset=recipe.order == "shuffled" and episode.data != "hard",
            use_vllm=recipe.rollout_backend == "vllm",
            vllm_max_model_length=sequence_tokens(recipe.rollout, recipe.max_prompt_tokens),
            max_completion_length=completion_tokens(recipe.rollout),
            model_init_kwargs={"dtype": recipe.weights_dtype()},
            vllm_importance_sampling_mode=recipe.importance_sampling,
            save_strategy="steps",
            ddp_backend=ddp_backend(),
            use_cpu=not torch.cuda.is_available(),
        ),
    )


def _open_kg(recipe: GRPORecipe, dataset):
    if recipe.kg:
        from kgreasoner.kg.open import open_kg

        return open_kg(recipe.kg)
    from kgreasoner.data import open_dataset_kg

    return open_dataset_kg(dataset)


def _episode_dataset(examples, tokenizer, order: str, seed: int, max_prompt_tokens: int, chains=None, replay=None):
    """The episode's rows in training order (TRL keeps it unless the order is `shuffled`), and the
    number of questions left out because their prompt is longer than `max_prompt_tokens`; with
    `chains` (`GoldChains`) each row carries its question's gold chains for the `path` search reward.

    With `replay`, a hard episode's (other questions, questions per generation batch, share), the rows
    come in `hard_cases.replay_order`'s batches: the hard questions in `order` (`shuffled`: shuffled once,
    seeded), a share of every batch from the other questions. Long prompts are left out first, so no
    batch loses a question."""
    import random

    from datasets import Dataset

    from kgreasoner.protocol import build_prompt
    from kgreasoner.records.sampling import balanced_order, hop_count

    by_prompt: dict[str, Any] = {}
    prompts: dict[str, str] = {}  # question id -> its prompt

    def fitting(questions) -> list:
        kept = []
        for example in questions:
            prompt = build_prompt(example.question, list(example.topic_entities), tokenizer)
            if len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= max_prompt_tokens:
                by_prompt[prompt], prompts[example.id] = example, prompt
                kept.append(example)
        return kept

    kept = fitting(examples)
    dropped = len(examples) - len(kept)
    if order == "stratified":
        kept = balanced_order(kept, seed)
    elif replay is not None:
        random.Random(f"{seed}|hard").shuffle(kept)
    if replay is not None:
        others, per_batch, share = replay
        rest = fitting(others)
        dropped += len(others) - len(rest)
        kept = replay_order(kept, rest, per_batch, share, seed)
    rows = []
    for example in kept:
        prompt = prompts[example.id]
        forms = [form for answer in example.answers for form in answer.surface_forms()]
        rows.append({"prompt": prompt, "answers": forms, "id": example.id, "hops": hop_count(example)})
        if chains is not None:
            rows[-1]["gold_chains"] = chains(example)
    return Dataset.from_list(rows), by_prompt, dropped


def _episode_rows(recipe: GRPORecipe, number: int, episode: Episode, examples, replay, tokenizer, args, kg):
    """The episode's dataset (`_episode_dataset`) and its questions by prompt, refused when TRL would train
    no step on it; a hard episode's rows take a `hard_cases.replay` share of every generation batch from `replay`."""
    from kgreasoner.data.gold_chains import GoldChains

    chains = GoldChains(kg) if recipe.rewards.search_form == "path" else None
    per_batch = args.generation_batch_size // args.num_generations
    mix = None
    if episode.data == "hard":
        mix = (list(replay), per_batch, recipe.hard_cases.replay)
        logger.info(
            "episode %d: %d of every %d questions a batch from the %d other training questions",
            number,
            replay_slots(per_batch, recipe.hard_cases.replay) if replay else 0,
            per_batch,
            len(replay),
        )
    limit = recipe.max_prompt_tokens
    data, by_prompt, dropped = _episode_dataset(examples, tokenizer, recipe.order, args.seed, limit, chains, mix)
    if not len(data):
        raise ValueError(f"episode {number}: every prompt is longer than max_prompt_tokens={limit}")
    if len(data) < per_batch:
        raise ValueError(
            f"episode {number}: {len(data)} questions, fewer than the {per_batch} one generation batch takes "
            f"(per_device_train_batch_size x steps_per_generation x processes / num_generations): "
            "TRL would train no step; lower per_device_train_batch_size or give the episode more"
        )
    if dropped:
        logger.warning(
            "episode %d: left out %d questions whose prompt is longer than max_prompt_tokens=%d",
            number,
            dropped,
            limit,
        )
    return data, by_prompt


def build_trainer(
    recipe: GRPORecipe,
    number: int,
    episode: Episode,
    examples,
    model_path: str,
    tool,
    dev_examples=(),
    engine_from=None,
    dev_split=(),
    replay=(),
    schedule=None,
):
    """The TRL trainer of one episode, our rollout as its `rollout_func`, our metrics as callbacks.

    `dev_examples` is the periodic dev curve's sample; `dev_split`, the whole dev split, measures the
    candidates of `dev_eval.choose_final: best_dev`. A hard episode's `examples` are its hard cases and `replay`
    the other training questions, a `hard_cases.replay` share of every generation batch. `schedule`
    (`episode_schedule.RunSchedule`) is the episode's place in the run's optimiser and learning-rate schedule.

    With `engine_from` (the previous episode's trainer) a vLLM rollout drives that trainer's
    colocated engine instead of starting a second one in the process.
    """
    from transformers import AutoTokenizer

    from kgreasoner.models import check_weights
    from kgreasoner.rewards import reward_functions
    from kgreasoner.training import trl_internals as internals

    episode_dir = Path(recipe.run_dir) / f"episode-{number}"
    args = grpo_config(recipe, episode_dir, episode)  # sets up the process state the logger reads
    check_weights(model_path)  # TRL loads the model by its path
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    data, by_prompt = _episode_rows(recipe, number, episode, examples, replay, tokenizer, args, tool.kg)
    rollouts = PolicyRollouts(recipe.rollout_backend, recipe.rollout, tool)
    group_log = GroupLog(episode_dir / GROUPS_FILE, args.num_generations)
    rollout = KGRollout(recipe, rollouts, by_prompt, group_log)
    with internals.reusing_vllm_engine(engine_from), internals.colocated_engine_args():
        trainer = _trainer_class(recipe, schedule)(
            model=model_path,
            reward_funcs=reward_functions(search_form=recipe.rewards.search_form),
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=recipe.lora.peft_config(),
            rollout_func=rollout,
            callbacks=[group_log],
        )
    if args.use_vllm:
        internals.send_unfused_experts(trainer)
    for callback in _callbacks(recipe, trainer, rollout, number, model_path, dev_examples, dev_split):
        trainer.add_callback(callback)
    return trainer


def _trainer_class(recipe: GRPORecipe, schedule):
    """TRL's `GRPOTrainer` with our scoring and guided rows (`trl_internals`), the recipe's settings of them and
    the episode's place in the run's schedule (`episode_schedule.RunSchedule`, or None) its class attributes."""
    from kgreasoner.training import trl_internals as internals

    return internals.guided_trainer_class(
        internals.scoring_trainer_class(),
        length_chunk_rows=recipe.length_chunk_rows,
        gold_advantage=recipe.guidance.gold_advantage,
        run_schedule=schedule,
    )


def _callbacks(recipe: GRPORecipe, trainer, rollout: KGRollout, number: int, model_path: str, dev_examples, dev_split):
    """The episode's callbacks on `trainer`, in order: the step log's (first: on resume it cuts the log back,
    which the others read), the dev curve's, and the final choice's measurement of each save."""
    step_log = StepLog(Path(recipe.run_dir) / STEP_LOG, number)
    callbacks: list[TrainerCallback] = [RolloutMetrics(trainer, step_log, rollout)]
    if recipe.dev_eval.steps and dev_examples:
        every, size = recipe.dev_eval.steps, recipe.dev_eval.batch_size
        callbacks.append(DevEval(trainer, rollout.rollouts, dev_examples, every, size, step_log))
    if recipe.dev_eval.final == "best_dev" and dev_split:
        root = Path(recipe.run_dir)
        size = recipe.dev_eval.batch_size
        callbacks.append(BestKeeper(trainer, root, number, model_path, dev_split, rollout.rollouts, size, step_log))
    return callbacks


def _questions(recipe: GRPORecipe):
    """The run's training questions, its search tool, the dev curve's sample and the whole dev split (the
    last two empty when unused), the topic entities the data names by id only (CWQ's Freebase mids) given the
    KG's names, which the prompt shows."""
    from kgreasoner.data import load_dataset
    from kgreasoner.data.entity_names import with_kg_names
    from kgreasoner.records.sampling import stratified_order
    from kgreasoner.retrieval.tool import KGSearchTool

    dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
    train_examples = dataset.split("train")[: recipe.max_questions]
    if not train_examples:
        raise ValueError(f"dataset {recipe.dataset!r} has no training questions")
    if recipe.dev_eval.steps and not dataset.split("dev"):
        # else no dev curve is drawn and the final choice falls back to the last weights, unsaid
        raise ValueError(
            f"dataset {recipe.dataset!r} has no dev questions, which dev_eval measures on: give it a dev split, "
            "or set dev_eval.steps: 0 and dev_eval.choose_final: last"
        )
    tool = KGSearchTool(_open_kg(recipe, dataset), recipe.tool)
    dev_examples: list[Any] = []
    if recipe.dev_eval.steps:
        dev_examples = stratified_order(dataset.split("dev"), recipe.setting("seed"))[: recipe.dev_eval.questions]
    dev_split = dataset.split("dev") if recipe.dev_eval.final == "best_dev" else []
    named = [with_kg_names(examples, tool.kg) for examples in (train_examples, dev_examples, dev_split)]
    return named[0], tool, named[1], named[2]


def _episode_questions(recipe: GRPORecipe, root: Path, number: int, episode: Episode, train_examples):
    """The questions episode `number` trains on, and the other questions a hard episode replays."""
    if episode.data == "hard":
        return hard_examples(root, number, train_examples, recipe.hard_cases.threshold)
    if episode.data == "frontier":
        args = grpo_config(recipe, root / f"episode-{number}", episode)
        per_batch = args.generation_batch_size // args.num_generations
        return frontier_examples(root, number, train_examples, recipe.frontier_replay, args.seed, per_batch), []
    return train_examples, []


def train_grpo(recipe: GRPORecipe, resume: bool = False) -> Path:
    """Run every episode in turn; returns the final model directory of the last one.

    What is alive on each GPU, in order (what preflight adds up for episode 2):
    1. Episode k: its trainer (policy, reference model when beta > 0, optimiser states, DeepSpeed
       engine) and, with `rollout_backend: vllm`, one colocated vLLM engine.
    2. Between episodes: the finished trainer is saved, then released (`trl_internals.release_trainer`):
       policy, reference model, optimiser and DeepSpeed engine are dropped and the CUDA cache emptied
       before the next trainer is built. The vLLM engine alone stays alive (its weights and KV cache,
       `vllm_gpu_memory_utilization` of the GPU): episode k + 1's trainer drives the same engine
       (`engine_from`), whose first weight sync loads the new policy. So episode 2 holds what
       episode 1 held, no more. A hard episode's questions are mined here too, from the groups episode 1
       recorded (a file: no model).
    """
    from kgreasoner.training.trl_internals import release_trainer

    start_process_group(recipe.setting("ddp_timeout"))  # before anything opens one
    train_examples, tool, dev_examples, dev_split = _questions(recipe)
    root = Path(recipe.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    _check_replay(recipe, root)
    model_path, previous, count = recipe.model, None, len(recipe.episodes)
    for number, episode in enumerate(recipe.episodes, 1):
        final = root / f"episode-{number}" / "final"
        if is_saved_model(final):
            model_path = str(final)
            logger.info("episode %d/%d already done: %s", number, count, final)
            continue
        examples, replay = _episode_questions(recipe, root, number, episode, train_examples)
        schedule = None
        if recipe.episode_carry:
            schedule = plan_episode(root, number, [e.max_steps for e in recipe.episodes], recipe.lora.enabled)
        trainer = build_trainer(
            recipe, number, episode, examples, model_path, tool, dev_examples, previous, dev_split, replay, schedule
        )
        if trainer.is_world_process_zero():
            (root / CHOSEN).unlink(missing_ok=True)  # made before this episode changed
        checkpoint = last_complete_checkpoint(final.parent) if resume else None
        resuming = f", resuming {checkpoint}" if checkpoint else ""
        logger.info(
            "episode %d/%d: %d %s questions from %s%s",
            number,
            count,
            len(examples),
            episode.data,
            model_path,
            resuming,
        )
        trainer.train(resume_from_checkpoint=checkpoint)
        model_path = str(save_final(trainer, final, model_path))
        release_trainer(trainer)
        previous = trainer if trainer.use_vllm else None  # kept for its vLLM engine only
    _choose_final(recipe, root)
    return Path(model_path)


def _check_replay(recipe: GRPORecipe, root: Path) -> None:
    """Refuse, before episode 1, a generation batch too small for a hard episode's replay share."""
    if any(e.data == "hard" for e in recipe.episodes):
        args = grpo_config(recipe, root / "episode-1", recipe.episodes[0])
        replay_slots(args.generation_batch_size // args.num_generations, recipe.hard_cases.replay)


def _choose_final(recipe: GRPORecipe, root: Path) -> None:
    """Put the run's choice of final weights in the last episode's `final` (`checkpoint_choice.apply_choice`),
    unless an earlier call already did; every rank waits for it."""
    state = PartialState()  # set up by the trainers, or a bare single process when every episode was done
    if state.is_main_process and not (root / CHOSEN).is_file():
        chosen = apply_choice(root, root / STEP_LOG, len(recipe.episodes), recipe.dev_eval.final, recipe.model)
        logger.info(
            "final model: %s (dev Hits@1 %s), %s",
            "the warm-up" if chosen["warmup"] else f"episode {chosen['episode']} step {chosen['step']}",
            chosen["dev_hits1"],
            root / CHOSEN,
        )
    state.wait_for_everyone()
