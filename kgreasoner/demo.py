"""`kgreasoner demo`: the whole pipeline on one CPU machine, every stage through its library API.

    kgreasoner demo                      # synthetic KG + questions, configs/demo/full.yaml (about an hour on 2 cores)
    kgreasoner demo --quick              # configs/demo/quick.yaml: tiny budgets (<= 5 min), what the tests run
    kgreasoner demo --data PQ-2H         # a PathQuestion set (also pathquestion:PQ-3H; `pathquestion` = PQ-2H)
    kgreasoner demo --data DIR           # a dataset folder: kb.tsv (+ names.tsv) + questions.jsonl

Stages, each into its own folder under `--out` (default outputs/demo):

 1. data     `data/`: the dataset folder every later stage reads (splits fixed; gold paths
             derived where the questions have none, `kgreasoner.data.path_search`)
 2. kg       `kg/stats.json`: the KB in the embedded memory store
 3. ranker   `ranker/`: the question-conditioned GAT ranker the tool orders candidates with
 4. warmup   `warmup/all.jsonl`: a trajectory per training question (the tool in the loop, entity
             handles), and `warmup/warmup.jsonl`: the SFT sample, the first `warmup_examples`
             questions of a stratified order (hop counts and relation paths take turns); where
             these oracle trajectories need more searches than `rollout.max_turns` allows, GRPO and
             evaluation get a turn budget that fits them (`TurnBudget`; the log and report say so)
 5. model    `base/`: a tiny Qwen3 and a word tokenizer trained on the KB, the warm-up sample and
             every training question's text
 6. sft      `sft/final`: the SFT warm-up (short: it teaches the format and the search habit)
 7. grpo     `grpo/episode-1/final` (all questions), `grpo/episode-2/final` (the hard cases: the
             questions episode 1's own rollouts got partly or wholly wrong, `grpo/episode-2/hard_cases.jsonl`,
             with a replay share of the other questions in every batch): RL does the teaching; dev Hits@1 is
             measured along the way
 8. eval     `eval/sft`, `eval/grpo`: the kgreasoner method on both checkpoints and the oracle
 9. report   `report/report.md` with the results table, the curves (PNG), each stage's command
             and wall time; no checkpoints, so the folder can be committed

Every stage prints the command that does the same from the shell. A stage that finished leaves
`stages/<name>.json` (its wall and CPU seconds and commands; `kgreasoner.stages`); a run finds it and skips the
stage, so an interrupted demo resumes (SFT and GRPO from their last checkpoint). `demo.yaml` in `--out` records
the settings; another run with different settings into the same folder is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from kgreasoner.config import ConfigError, add_config_arguments, describe, load_config, resolve_recipe
from kgreasoner.data.path_search import PathSearch
from kgreasoner.records.splits import DEFAULT_SPLIT_SCHEME, SCHEMES, SPLIT_SCHEME_HELP
from kgreasoner.stages import (
    Stage,
    StageInput,
    StageRunner,
    StageStore,
    command,
    default_threads,
    log_progress,
    threads_text,
    write_json,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
SYNTHETIC = "synthetic"
FULL_CONFIG = "configs/demo/full.yaml"
QUICK_CONFIG = "configs/demo/quick.yaml"
STAGE_NAMES = ("data", "kg", "ranker", "warmup", "model", "sft", "grpo", "eval", "report")
STAGE_FOLDERS = {name: "base" if name == "model" else name for name in STAGE_NAMES}
"""The folder under `--out` each stage writes (and only that one, besides the embedding cache)."""
RECIPE_STAGES = ("ranker", "warmup", "model", "sft", "grpo", "eval")


@dataclass
class StageRecipe:
    """A stage's own recipe (the YAML its command takes) and `--set` overrides on top of it."""

    config: str | None = field(
        default=None,
        metadata={
            "help": "the stage's YAML recipe (relative paths: from the current directory, else configs/... from the "
            "package's own recipes)"
        },
    )
    set: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "field -> value overrides of that recipe (dotted keys for nested fields); paths are set by the "
            "demo"
        },
    )


@dataclass
class SyntheticSize:
    """The synthetic world (data_gen/synthetic.py) when `data` is `synthetic`."""

    num_entities: int | None = field(
        default=None, metadata={"help": "about this many named entities (None: about 2,800)"}
    )
    num_questions: int = field(
        default=3000, metadata={"help": "questions, a third per hop count (split 80/10/10 grouped)"}
    )


def _recipe(config: str | None, **overrides: Any) -> Callable[[], StageRecipe]:
    return lambda: StageRecipe(config, dict(overrides))


@dataclass
class DemoConfig:
    """Settings of `kgreasoner demo`. These defaults are the demo's settings (configs/demo/full.yaml names
    none of them); a YAML names only what it changes (configs/demo/quick.yaml).

    A stage section given in a YAML or `--set` changes the fields it names of that stage's default section:
    `config` replaces the default recipe, and `set` adds to (or changes) the default overrides key by key,
    so `--set sft.set.trainer.max_steps=300` changes one value and keeps the rest.
    """

    data: str = field(
        default=SYNTHETIC,
        metadata={"help": "synthetic, a PathQuestion set (PQ-2H, pathquestion:PQ-3H) or a dataset folder"},
    )
    synthetic: SyntheticSize = field(default_factory=SyntheticSize, metadata={"help": "size of the synthetic world"})
    split_scheme: str = field(default=DEFAULT_SPLIT_SCHEME, metadata={"help": SPLIT_SCHEME_HELP})
    split_seed: int = field(default=0, metadata={"help": "seed of that split"})
    paths: PathSearch = field(
        default_factory=PathSearch, metadata={"help": "gold-path search for questions without paths"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the synthetic world and of every training stage"})
    tool: dict[str, Any] = field(
        default_factory=lambda: {"entity_handles": True, "top_k": 10},
        metadata={
            "help": "ToolConfig fields shared by warm-up, GRPO and eval; ranking is gat (the demo's ranker) unless "
            "set here; ranking=embedding uses the ranker's text encoder, so only the context aggregation differs"
        },
    )
    rollout: dict[str, Any] = field(
        default_factory=lambda: {"max_turns": 6, "max_new_tokens": 192, "max_turn_tokens": 64},
        metadata={
            "help": "RolloutConfig fields shared by GRPO and eval; max_turns is raised (never lowered) to the warm-up "
            "trajectories' 99th-percentile search count + 1 where it is below that"
        },
    )
    ranker: StageRecipe = field(
        default_factory=_recipe("configs/ranker.yaml", epochs=10),
        metadata={"help": "train/ranker.py (RankerTrainConfig)"},
    )
    warmup: StageRecipe = field(
        default_factory=_recipe(
            "configs/tiny-cpu/warmup.yaml", templates="configs/tiny-cpu/templates-copy.yaml", sample="stratified"
        ),
        metadata={"help": "kgreasoner warmup (WarmupConfig)"},
    )
    model: StageRecipe = field(
        default_factory=_recipe("configs/tiny-cpu/model-1m.yaml", tokenizer={"system_prompt": False}),
        metadata={"help": "kgreasoner build-tiny (TinyModelConfig)"},
    )
    sft: StageRecipe = field(
        default_factory=_recipe(
            "configs/tiny-cpu/sft.yaml",
            trainer={
                "learning_rate": 3e-3,
                "per_device_train_batch_size": 16,
                "max_steps": 300,
                "eval_steps": 100,
                "save_steps": 100,
                "logging_steps": 10,
                "report_to": [],
            },
        ),
        metadata={"help": "train/sft.py (SFTRecipe)"},
    )
    grpo: StageRecipe = field(
        # 3 questions a step (one per hop count, in the stratified order); the search reward pays searches up to
        # the question's hop count (the paper's form paid a second search on 1-hop questions, and the policy
        # learned that; paying it only with a right answer taught a weak warm-up to stop searching)
        default_factory=_recipe(
            "configs/tiny-cpu/grpo.yaml",
            episodes=[{"data": "all", "max_steps": 400}, {"data": "hard", "max_steps": 100}],
            rewards={"search_form": "hops"},
            dev_eval={"steps": 25, "questions": 150},
            # the episodes share one AdamW state and one schedule: 25 warm-up steps (5% of the run's 500), then 1e-4
            trainer={
                "learning_rate": 1e-4,
                "lr_scheduler_type": "constant_with_warmup",
                "warmup_steps": 25,
                "per_device_train_batch_size": 24,
                "save_steps": 50,
                "report_to": [],
            },
        ),
        metadata={"help": "train/grpo.py (GRPORecipe)"},
    )
    eval: StageRecipe = field(
        default_factory=_recipe(None, batch_size=32), metadata={"help": "kgreasoner eval (EvalConfig)"}
    )
    eval_questions: int | None = field(
        default=None, metadata={"help": "evaluate only the first N test questions (None: all)"}
    )
    warmup_examples: int | None = field(
        default=300,
        metadata={
            "help": "training questions in the SFT warm-up sample (stratified by hops and relation path; the paper "
            "used about 500); None: SFT on a trajectory for every training question"
        },
    )
    rl: bool = field(
        default=True,
        metadata={
            "help": "false: no GRPO, the SFT model is the final one (the SFT-only baseline: with "
            "warmup_examples null and sft.set.trainer.max_steps sized to the RL run's training time, imitation of "
            "every gold trajectory against RL on the same CPU budget)"
        },
    )
    sft_warmup: bool = field(
        default=True,
        metadata={
            "help": "false: no SFT warm-up (the paper's ablation): GRPO and the first evaluation start from the "
            "untrained base model; the warm-up trajectories are still made (tokenizer texts, guided groups' gold "
            "rows)"
        },
    )

    @classmethod
    def misplaced_key(cls, key: str) -> str | None:
        """`kgreasoner.config.from_dict`'s hint for a key the demo does not have: the stage that is gone."""
        if key == "hard":
            return (
                "hard is no longer a stage: GRPO mines its hard cases from episode 1's own groups; set "
                "grpo.set.hard_cases.threshold and grpo.set.hard_cases.replay"
            )
        return None

    def __post_init__(self) -> None:
        if self.split_scheme not in SCHEMES:
            raise ValueError(f"split_scheme must be one of {SCHEMES}, got {self.split_scheme!r}")
        if not self.rl and not self.sft_warmup:
            raise ValueError("rl: false evaluates the SFT model: sft_warmup must stay true")
        if self.warmup_examples is not None and self.warmup_examples < 1:
            raise ValueError(f"warmup_examples must be >= 1 or null, got {self.warmup_examples}")
        if self.eval_questions is not None and self.eval_questions < 1:
            raise ValueError(f"eval_questions must be >= 1 or null, got {self.eval_questions}")
        for name in ("tool", "rollout"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be a mapping of field names to values")
        for name in RECIPE_STAGES:
            if not isinstance(getattr(self, name).set, dict):
                raise ValueError(f"{name}.set must be a mapping of field names to values")


# --- commands and overrides -------------------------------------------------------------------------
def cli_value(value: Any) -> str:
    """A value as `--set` takes it (parsed back with yaml.safe_load to the same value)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30)
    return text.removesuffix("\n...\n").strip()


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (`{encoder: {kind: x}}` -> `encoder.kind`), so an override
    changes one field of a recipe's section instead of replacing the section."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def overrides(values: dict[str, Any], prefix: str = "") -> list[str]:
    """`key=value` strings as `--set` takes them, one per (dotted) field."""
    return [f"{key}={cli_value(value)}" for key, value in flatten(values, prefix).items()]


TURN_PERCENTILE = 99
"""The share of the warm-up's oracle trajectories (percent) whose searches the turn budget must allow."""


@dataclass(frozen=True)
class TurnBudget:
    """The rollout's turn budget (`max_turns`, searches per row) against the searches of the warm-up's oracle
    trajectories: `needed` is their `TURN_PERCENTILE`th percentile (nearest rank) + 1, one spare search."""

    configured: int
    records: int
    percentile: int
    most: int

    @property
    def needed(self) -> int:
        return self.percentile + 1 if self.records else 0

    @property
    def max_turns(self) -> int:
        """The budget GRPO and evaluation get: the configured one, raised to `needed`, never lowered."""
        return max(self.configured, self.needed)

    @property
    def raised(self) -> bool:
        return self.max_turns > self.configured

    def line(self) -> str:
        if not self.records:
            return f"turn budget {self.configured} searches (no warm-up trajectories to check it against)"
        searches = (
            f"the warm-up's oracle trajectories need up to {self.percentile} searches ({TURN_PERCENTILE}th "
            f"percentile of {self.records}; the most {self.most})"
        )
        if self.raised:
            return (
                f"turn budget raised from {self.configured} to {self.max_turns} searches (rollout.max_turns): "
                f"{searches}, plus one spare"
            )
        return f"turn budget {self.configured} searches fits: {searches}"


def turn_budget(searches: Sequence[int], configured: int) -> TurnBudget:
    """`configured` max_turns against the search counts of the oracle trajectories."""
    ordered = sorted(searches)
    if not ordered:
        return TurnBudget(configured, 0, 0, 0)
    rank = -(-TURN_PERCENTILE * len(ordered) // 100)  # nearest rank: ceil(p/100 * n)
    return TurnBudget(configured, len(ordered), ordered[rank - 1], ordered[-1])


def oracle_searches(path: str | Path) -> list[int]:
    """Searches of each warm-up trajectory in `path` (gold walks and corrections, the trajectories the SFT model
    imitates; lookup drills are not trajectories)."""
    from kgreasoner.protocol import parse_trajectory
    from kgreasoner.records.trajectories import iter_warmup

    return [len(parse_trajectory(r.completion).searches) for r in iter_warmup(path) if r.kind != "drill"]


def with_max_turns(stage: StageInput[T], max_turns: int) -> StageInput[T]:
    """The stage's config and command with `rollout.max_turns` set last, so the printed command still builds it."""
    sets = (*stage.sets, f"rollout.max_turns={max_turns}")
    return StageInput(load_config(type(stage.config), stage.path, list(sets)), stage.path, sets)


class Demo:
    """The stages of one demo run into `out`, built from a DemoConfig (every stage config is validated up front)."""

    def __init__(self, config: DemoConfig, out: Path) -> None:
        from data_gen.warmup import WarmupConfig
        from kgreasoner.data.prepare import source_name
        from kgreasoner.evaluation.methods import EvalConfig
        from kgreasoner.models import TinyModelConfig
        from kgreasoner.retrieval.training import RankerTrainConfig
        from kgreasoner.training.grpo import GRPORecipe
        from kgreasoner.training.sft import SFTRecipe

        self.config = config
        self.out = out
        self.store = StageStore(out / "stages")
        self.source = config.data if config.data == SYNTHETIC else source_name(config.data)
        o = {folder: str(out / folder) for folder in STAGE_FOLDERS.values()}
        self.paths = o
        self.warmup_file = f"{o['warmup']}/warmup.jsonl"
        self.warmup_all_file = f"{o['warmup']}/all.jsonl" if config.warmup_examples else self.warmup_file
        self.train_file = self.sft_train_file()
        # Without the warm-up every later stage starts from the untrained base model.
        self.sft_final = f"{o['sft']}/final" if config.sft_warmup else o["base"]
        self.first_eval = "sft" if config.sft_warmup else "base"
        self.kb_file = f"{o['data']}/{self._kb_name()}"
        cache = str(out / "cache" / "embeddings")
        rollout_sets = overrides(config.rollout, "rollout.")
        seed = config.seed

        self.ranker = self._stage_config(
            RankerTrainConfig,
            "ranker",
            {
                "data": o["data"],
                "split_scheme": config.split_scheme,
                "split_seed": config.split_seed,
                "seed": seed,
                "out_dir": o["ranker"],
                "encoder.cache_dir": cache,
            },
        )
        tool = {"ranking": "gat", **flatten(config.tool)}
        if tool["ranking"] == "gat":
            tool["ranker_path"] = o["ranker"]
        elif tool["ranking"] == "embedding":
            # The ranker's encoder (its kind and vectors), so embedding vs gat isolates the context aggregation.
            encoder = self.ranker.config.encoder
            tool = {
                **{f"encoder.{k}": getattr(encoder, k) for k in ("kind", "model_path", "max_length", "hashing_dim")},
                **tool,
            }
        tool_sets = overrides({**tool, "encoder.cache_dir": cache}, "tool.")
        sample = (
            {"sample_output": self.warmup_file, "sample_size": config.warmup_examples, "num_examples": "all"}
            if config.warmup_examples
            else {}
        )
        self.warmup = self._stage_config(
            WarmupConfig,
            "warmup",
            {
                "dataset": o["data"],
                "output": self.warmup_all_file,
                "split_scheme": config.split_scheme,
                "split_seed": config.split_seed,
                "seed": seed,
                **sample,
            },
            tool_sets,
        )
        self.model = self._stage_config(TinyModelConfig, "model", {"seed": seed})
        # the training stages' seed is TRL's, under the recipe's `trainer:`
        self.sft = self._stage_config(
            SFTRecipe,
            "sft",
            {
                "model": o["base"],
                "tiny_model": None,
                "tokenizer_texts": [],
                "train_file": self.train_file,
                "run_dir": o["sft"],
                "trainer.seed": seed,
            },
        )
        self.grpo = self._stage_config(
            GRPORecipe,
            "grpo",
            {
                "model": self.sft_final,
                "dataset": o["data"],
                "run_dir": o["grpo"],
                "split_scheme": config.split_scheme,
                "split_seed": config.split_seed,
                "trainer.seed": seed,
                "guidance.trajectories": self.warmup_all_file,
            },
            tool_sets + rollout_sets,
        )
        self.grpo_final = f"{o['grpo']}/episode-{len(self.grpo.config.episodes)}/final"
        self.eval = self._stage_config(EvalConfig, "eval", {}, tool_sets + rollout_sets)
        if config.eval_questions is not None:
            self.eval.config.limit = config.eval_questions
        self._turn_budget: TurnBudget | None = None

    def fit_turn_budget(self) -> TurnBudget:
        """Once the warm-up trajectories exist: the turn budget against their searches, GRPO's and evaluation's
        configs (and commands) raised to it where they allow fewer; the first call prints what it found."""
        if self._turn_budget is None:
            budget = turn_budget(oracle_searches(self.warmup_all_file), self.grpo.config.rollout.max_turns)
            if budget.raised:
                self.grpo = with_max_turns(self.grpo, budget.max_turns)
                limit = self.eval.config.limit
                self.eval = with_max_turns(self.eval, budget.max_turns)
                self.eval.config.limit = limit
            print(f"kgreasoner demo: {budget.line()}", flush=True)
            self._turn_budget = budget
        return self._turn_budget

    def tokenizer_texts(self) -> list[str]:
        """The KB, the SFT records and the dataset's questions (their train split only: `--text-splits train`)."""
        return [self.kb_file, self.train_file, f"{self.paths['data']}/questions.jsonl"]

    def sft_train_file(self) -> str:
        """What the tiny model's tokenizer and SFT learn from: the warm-up trajectories (a subclass may train on
        other records)."""
        return self.warmup_file

    def _kb_name(self) -> str:
        """The KB file the data stage writes: kb.nt for a folder that has only an N-Triples KB, else kb.tsv."""
        from kgreasoner.data.datasets import KB_FILES

        folder = Path(self.source)
        if self.source != SYNTHETIC and folder.is_dir():
            return next((name for name in KB_FILES if (folder / name).is_file()), KB_FILES[0])
        return KB_FILES[0]

    def _stage_config(
        self,
        cls: type[T],
        name: str,
        owned: dict[str, Any],
        extra: Sequence[str] = (),
        recipe: StageRecipe | None = None,
    ) -> StageInput[T]:
        """A stage's config object, recipe path and `--set` list: the recipe (the DemoConfig section `name`
        unless given), the user's overrides, then what the demo owns (paths, seeds, the shared tool),
        exactly as the printed command has them."""
        recipe = recipe or getattr(self.config, name)
        clash = sorted(set(flatten(recipe.set)) & set(owned))
        if clash:
            raise ConfigError(f"{name}.set: {', '.join(clash)} is set by the demo (paths and seeds); leave it out")
        path = resolve_recipe(recipe.config)
        sets = overrides(recipe.set) + overrides(owned) + list(extra)
        try:
            return StageInput(load_config(cls, path, sets), path, tuple(sets))
        except ConfigError as err:
            raise ConfigError(f"demo stage {name}: {err}") from err

    # --- the stages ---
    def stages(self) -> list[Stage]:
        o = self.paths
        stages = [
            Stage("data", "dataset folder", [self._data_command()], self.run_data),
            Stage(
                "kg",
                "KG in the embedded store",
                [command("kgreasoner", "kg", "stats", f"memory:{o['data']}")],
                self.run_kg,
            ),
            Stage(
                "ranker",
                "GAT ranker",
                [self.ranker.command("python", "train/ranker.py")],
                self.run_ranker,
            ),
            Stage(
                "warmup",
                "warm-up trajectories",
                [self.warmup.command("kgreasoner", "warmup")],
                self.run_warmup,
            ),
            Stage(
                "model",
                "tiny model + tokenizer",
                [
                    command(
                        "kgreasoner",
                        "build-tiny",
                        *self.model.config_args(),
                        "--texts",
                        *self.tokenizer_texts(),
                        "--text-splits",
                        "train",
                        "--out",
                        o["base"],
                        sets=self.model.sets,
                    )
                ],
                self.run_model,
            ),
            Stage(
                "sft",
                "SFT warm-up",
                [self.sft.command("python", "train/sft.py")],
                self.run_sft,
            ),
            Stage(
                "grpo",
                "GRPO (episode 1: all, 2: hard)",
                [self.grpo.command("python", "train/grpo.py")],
                self.run_grpo,
            ),
            Stage(
                "eval",
                "evaluation",
                [self.eval_command("kgreasoner,oracle", self.sft_final, self.first_eval)]
                + ([self.eval_command("kgreasoner", self.grpo_final, "grpo")] if self.config.rl else []),
                self.run_eval,
            ),
            Stage(
                "report",
                "report",
                [command("kgreasoner", "plot", o["grpo"], "--out", f"{o['report']}/grpo_curves.png")]
                if self.config.rl
                else [],
                self.run_report,
            ),
        ]
        skipped = ({"sft"} if not self.config.sft_warmup else set()) | ({"grpo"} if not self.config.rl else set())
        return [s for s in stages if s.name not in skipped]

    def eval_command(self, methods: str, model: str, label: str) -> str:
        """`kgreasoner eval` of `methods` with checkpoint `model` on the test split into eval/<label>."""
        limit = [] if self.config.eval_questions is None else ["--limit", self.config.eval_questions]
        return command(
            "kgreasoner",
            "eval",
            "--methods",
            methods,
            "--dataset",
            self.paths["data"],
            "--split",
            "test",
            *limit,
            "--llm",
            f"hf:{model}",
            "--out",
            f"{self.paths['eval']}/{label}",
            sets=self.eval.sets,
        )

    def _data_command(self) -> str:
        c = self.config
        if self.source == SYNTHETIC:
            size = [] if c.synthetic.num_entities is None else ["--num-entities", c.synthetic.num_entities]
            return command(
                "python",
                "-m",
                "data_gen.synthetic",
                "--out",
                self.paths["data"],
                "--seed",
                c.seed,
                *size,
                "--questions",
                c.synthetic.num_questions,
            )
        return command(
            "kgreasoner",
            "prepare-data",
            self.source,
            "--out",
            self.paths["data"],
            "--split-scheme",
            c.split_scheme,
            "--seed",
            c.split_seed,
            "--max-hops",
            c.paths.max_hops,
            "--max-paths",
            c.paths.max_paths,
            "--max-branch",
            c.paths.max_branch,
        )

    def run_data(self) -> dict[str, Any]:
        c = self.config
        warnings: dict[str, int] = {}
        if self.source == SYNTHETIC:
            from data_gen.synthetic import write_synthetic

            write_synthetic(
                self.paths["data"],
                seed=c.seed,
                num_entities=c.synthetic.num_entities,
                num_questions=c.synthetic.num_questions,
            )
        else:
            from kgreasoner.data.prepare import prepare_dataset

            warnings = prepare_dataset(self.source, self.paths["data"], c.split_scheme, c.split_seed, search=c.paths)[
                "warnings"
            ]
        from kgreasoner.data import load_dataset

        dataset = load_dataset(self.paths["data"])
        sizes = {s: len(dataset.split(s)) for s in ("train", "dev", "test")}
        with_paths = sum(1 for e in dataset if e.gold_paths)
        flagged = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in warnings.items() if n)
        return {
            "questions": len(dataset),
            "splits": sizes,
            "with_gold_paths": with_paths,
            "warnings": warnings,
            "line": f"{len(dataset)} questions (train/dev/test {sizes['train']}/{sizes['dev']}/{sizes['test']}), "
            f"{with_paths} with gold paths" + (f"; warnings: {flagged}" if flagged else ""),
        }

    def run_kg(self) -> dict[str, Any]:
        from kgreasoner.data import load_dataset, open_dataset_kg
        from kgreasoner.kg.commands import graph_stats

        started = time.perf_counter()
        kg = open_dataset_kg(load_dataset(self.paths["data"]))
        seconds = time.perf_counter() - started
        stats = graph_stats(kg, 5)
        stats["load_seconds"] = round(seconds, 3)
        write_json(Path(self.paths["kg"]) / "stats.json", stats)
        return {
            **stats,
            "line": f"{stats['triples']:,} triples, {stats['nodes']:,} nodes, {stats['relations']} relations, "
            f"loaded in {seconds:.2f}s",
        }

    def run_ranker(self) -> dict[str, Any]:
        from kgreasoner.retrieval.training import train_ranker

        result = train_ranker(self.ranker.config)
        test = result.test or result.dev
        gat, none = test.get("gat", {}), test.get("none", {})
        return {
            "line": f"best epoch {result.best_epoch} of {result.epochs_run}; "
            f"test recall@1 gat {gat.get('recall@1', 0):.3f} "
            f"vs KG order {none.get('recall@1', 0):.3f}"
        }

    def run_warmup(self) -> dict[str, Any]:
        from data_gen.warmup import run

        summary = run(self.warmup.config)
        return {
            "line": f"{summary['records']} trajectories {summary['by_kind']} by split {summary['by_split']}, "
            f"skipped {summary['skipped']}"
        }

    def run_model(self) -> dict[str, Any]:
        from kgreasoner.models import build_tiny, parameter_counts
        from kgreasoner.tokenizer import read_training_texts

        model, tokenizer = build_tiny(
            self.model.config, read_training_texts(self.tokenizer_texts(), ["train"]), self.paths["base"]
        )
        counts = parameter_counts(model)
        return {
            "parameters": counts,
            "vocab": len(tokenizer),
            "line": f"{counts['total']:,} parameters ({counts['non_embedding']:,} without embeddings), "
            f"vocabulary {len(tokenizer):,}",
        }

    def run_sft(self) -> dict[str, Any]:
        from kgreasoner.demo_report import sft_log_history
        from kgreasoner.training.sft import train_sft

        final = train_sft(self.sft.config, resume=True)
        state = sft_log_history(self.paths["sft"])
        evals = [r["eval_loss"] for r in state if "eval_loss" in r]
        return {
            "line": f"{final}; {max((r.get('step', 0) for r in state), default=0)} steps"
            + (f", best dev loss {min(evals):.3f}" if evals else "")
        }

    def run_grpo(self) -> dict[str, Any]:
        from kgreasoner.training.grpo import train_grpo

        self.fit_turn_budget()
        final = train_grpo(self.grpo.config, resume=True)
        return {"line": str(final)}

    def run_eval(self) -> dict[str, Any]:
        self.fit_turn_budget()
        results = {}
        first = self.first_eval
        runs = [(first, self.sft_final, ["kgreasoner", "oracle"])]
        if self.config.rl:
            runs.append(("grpo", self.grpo_final, ["kgreasoner"]))
        for label, model, methods in runs:
            summaries = self._evaluate(model, methods, Path(self.paths["eval"]) / label)
            results[label] = {m: round(s["hits1"], 4) for m, s in summaries.items()}
        grpo = f", GRPO {results['grpo']['kgreasoner']:.3f}" if "grpo" in results else ""
        return {
            "hits1": results,
            "line": f"Hits@1 {'SFT' if first == 'sft' else 'base model'} {results[first]['kgreasoner']:.3f}"
            f"{grpo}, oracle {results[first]['oracle']:.3f}",
        }

    def _evaluate(self, model: str, methods: list[str], out: Path) -> dict[str, dict[str, Any]]:
        from kgreasoner.data import load_dataset, open_dataset_kg
        from kgreasoner.evaluation.harness import run_evaluation, select_examples
        from kgreasoner.evaluation.methods import MethodContext
        from kgreasoner.evaluation.report import RunInfo
        from kgreasoner.llm import open_llm

        config = self.eval.config
        dataset = load_dataset(self.paths["data"], split="test")
        kg = open_dataset_kg(dataset)
        llm = open_llm(f"hf:{model}", config.max_tokens, config.batch_size, config.workers or 8)
        try:
            info = RunInfo(
                dataset.name, "test", dataset.split_scheme, dataset.seed, kg=str(dataset.kb_path), llm=f"hf:{model}"
            )
            return run_evaluation(
                methods,
                select_examples(dataset.examples, config.limit),
                MethodContext(kg, llm, config),
                out,
                info,
                progress=False,
            )
        finally:
            llm.close()
            kg.close()

    def run_report(self) -> dict[str, Any]:
        from kgreasoner.demo_report import write_report

        path = write_report(self)
        return {"line": str(path)}


# --- running -------------------------------------------------------------------------------------------
def check_settings(out: Path, config: DemoConfig) -> None:
    """Record the settings in OUT/demo.yaml; refuse to resume a folder made with other settings."""
    path = out / "demo.yaml"
    settings = dataclasses.asdict(config)
    if path.exists():
        # A setting added since the folder was made counts as its default there.
        stored = {**dataclasses.asdict(DemoConfig()), **(yaml.safe_load(path.read_text(encoding="utf-8")) or {})}
        different = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
        if different:
            raise ValueError(
                f"{out} holds a demo run with other settings ({', '.join(different)} differ, see {path}); "
                "use another --out, or delete the folder to start over"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(settings, sort_keys=False), encoding="utf-8")


def run_demo(config: DemoConfig, out: str | Path, threads: int | None = None) -> Path:
    """Run (or resume) every stage; returns the report's path."""
    import torch

    out = Path(out)
    demo = Demo(config, out)  # validates every stage's config before any work
    log_progress()
    check_settings(out, config)
    threads = threads or default_threads()
    torch.set_num_threads(threads)
    stages = demo.stages()
    print(
        f"kgreasoner demo: data {demo.source} -> {out} ({threads_text(threads)}; {os.cpu_count()} cores)",
        flush=True,
    )
    runner = StageRunner(demo.store, threads)
    started = time.perf_counter()
    for number, stage in enumerate(stages, 1):
        head = f"[{number}/{len(stages)}] {stage.name}: {stage.title}"
        record, ran = runner.run(stage, head)
        if not ran:
            print(f"{head}: done earlier in {record['seconds']:.1f}s, skipped", flush=True)
        if stage.name == "warmup":
            # the later stages' commands, as they will run: with the turn budget the trajectories need
            demo.fit_turn_budget()
            stages[number:] = demo.stages()[number:]
    report = Path(demo.paths["report"]) / "report.md"
    print(f"kgreasoner demo: finished in {time.perf_counter() - started:.1f}s; report: {report}", flush=True)
    return report


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the whole pipeline on one CPU machine (data, ranker, warm-up, SFT, GRPO, eval, report)",
        description=__doc__ + "\nFields of the --config YAML (DemoConfig):\n" + describe(DemoConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--quick", action="store_true", help=f"tiny budgets ({QUICK_CONFIG}, <= 5 minutes; default {FULL_CONFIG})"
    )
    parser.add_argument("--data", default=None, help="synthetic (default), a PathQuestion set, or a dataset folder")
    parser.add_argument(
        "--out", default="outputs/demo", type=Path, help="folder of every stage's output and the report"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the synthetic world and the training stages")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads of every stage (0: OMP_NUM_THREADS when set, else every core this process may use); "
        "each stage's first line says how many",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.quick and args.config:
        raise ValueError("--quick is configs/demo/quick.yaml; give either --quick or --config")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    path = args.config or resolve_recipe(QUICK_CONFIG if args.quick else FULL_CONFIG)
    sets = list(args.overrides)
    if args.data is not None:
        sets.append(f"data={cli_value(args.data)}")
    if args.seed is not None:
        sets.append(f"seed={args.seed}")
    config = load_config(DemoConfig, path, sets)
    run_demo(config, args.out, args.threads or None)
    return 0
