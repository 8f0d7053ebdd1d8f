"""A recipe's `trainer:` mapping goes to TRL's config as written; what kgreasoner derives, a TRL field at the top
level, an unknown field and an episode's step budget set twice are refused, naming the file and the setting."""

import dataclasses

import pytest
from trl import GRPOConfig, SFTConfig

from kgreasoner.config import ConfigError, load_config
from kgreasoner.training.grpo import GRPORecipe, grpo_config
from kgreasoner.training.sft import SFTRecipe, sft_config

GRPO = "model: m\ndataset: d\nrun_dir: {out}\n"
SFT = "model: m\ntrain_file: t.jsonl\nrun_dir: {out}\n"


def _yaml(tmp_path, head: str, body: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(head.format(out=tmp_path / "out") + body)
    return path


def _grpo_args(recipe: GRPORecipe):
    return grpo_config(recipe, recipe.run_dir, recipe.episodes[0])


def test_the_trainer_mapping_reaches_trls_configs_as_written(tmp_path):
    grpo = load_config(
        GRPORecipe,
        _yaml(
            tmp_path,
            GRPO,
            "trainer: {num_generations: 4, temperature: 0.7, top_k: 5, learning_rate: 3.0e-6, report_to: [], "
            "mask_truncated_completions: true, vllm_gpu_memory_utilization: 0.3}\n",
        ),
    )
    args = _grpo_args(grpo)
    assert (args.num_generations, args.temperature, args.top_k, args.learning_rate) == (4, 0.7, 5, 3e-6)
    assert args.report_to == [] and args.mask_truncated_completions and args.vllm_gpu_memory_utilization == 0.3
    sft = load_config(SFTRecipe, _yaml(tmp_path, SFT, "trainer: {max_length: 64, activation_offloading: true}\n"))
    args = sft_config(sft, has_eval=False)
    assert args.max_length == 64 and args.activation_offloading is True


def test_kgreasoners_defaults_sit_under_the_mapping_and_the_accessor_reads_what_trl_gets(tmp_path):
    recipe = GRPORecipe(model="m", dataset="d", run_dir=str(tmp_path))
    args = _grpo_args(recipe)
    assert (args.beta, args.num_generations, args.loss_type, args.seed, args.data_seed) == (1e-5, 16, "grpo", 0, 0)
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False
    for name in ("beta", "num_generations", "seed", "epsilon", "top_p", "temperature"):
        assert recipe.setting(name) == getattr(args, name), name
    seeded = GRPORecipe(model="m", dataset="d", run_dir=str(tmp_path), trainer={"seed": 3, "beta": 0.0})
    args = _grpo_args(seeded)
    assert (args.seed, args.data_seed, args.beta) == (3, 3, 0.0) and seeded.setting("seed") == 3
    sft = SFTRecipe(model="m", train_file="t", run_dir=str(tmp_path))
    assert (sft.setting("max_length"), sft_config(sft, has_eval=True).train_sampling_strategy) == (
        4096,
        "group_by_length",
    )


@pytest.mark.parametrize(
    ("head", "field", "setting"),
    [
        (GRPO, "reward_weights", "rewards"),
        (GRPO, "max_completion_length", "the rollout's budget"),
        (GRPO, "use_vllm", "rollout_backend"),
        (GRPO, "shuffle_dataset", "order"),
        (GRPO, "output_dir", r"run_dir \(each episode trains in run_dir/episode-<k>\)"),
        (GRPO, "max_steps", r"episodes \(each episode's max_steps\)"),
        (GRPO, "num_train_epochs", r"episodes \(each episode's num_train_epochs\)"),
        (SFT, "output_dir", "run_dir"),
        (SFT, "eval_strategy", "eval_file"),
        (SFT, "save_strategy", "trainer.save_steps"),
    ],
)
def test_a_field_kgreasoner_derives_is_refused_naming_the_setting_that_decides_it(tmp_path, head, field, setting):
    path = _yaml(tmp_path, head, f"trainer: {{{field}: 1}}\n")
    cls = GRPORecipe if head is GRPO else SFTRecipe
    with pytest.raises(ConfigError, match=rf"^{path}: trainer: {field} is set by kgreasoner from {setting}"):
        load_config(cls, path)


@pytest.mark.parametrize(("cls", "head", "config"), [(GRPORecipe, GRPO, "GRPOConfig"), (SFTRecipe, SFT, "SFTConfig")])
def test_an_unknown_trainer_field_is_named_with_the_file(tmp_path, cls, head, config):
    path = _yaml(tmp_path, head, "trainer: {learning_rate: 1.0e-5, no_such_field: 1}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: trainer: no_such_field is not a field of trl.{config}$"):
        load_config(cls, path)
    with pytest.raises(ConfigError, match=rf"^{path}: trainer: gradient_checkpointing is transformers' deprecated"):
        load_config(cls, path, ["trainer={gradient_checkpointing: true}"])


@pytest.mark.parametrize(("cls", "head", "config"), [(GRPORecipe, GRPO, "GRPOConfig"), (SFTRecipe, SFT, "SFTConfig")])
def test_a_trl_field_at_the_top_level_is_refused_saying_where_it_goes(tmp_path, cls, head, config):
    """A recipe written before the fields moved under `trainer:` is told how to migrate, not silently changed."""
    path = _yaml(tmp_path, head, "learning_rate: 1.0e-5\ntrainer: {learning_rate: 2.0e-5}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: learning_rate is a {config} field: set it under trainer:$"):
        load_config(cls, path)
    with pytest.raises(ConfigError, match=rf"^{path}: per_device_train_batch_size is a {config} field"):
        load_config(cls, _yaml(tmp_path, head, ""), ["per_device_train_batch_size=2"])


def test_a_top_level_field_kgreasoner_derives_points_to_its_setting(tmp_path):
    path = _yaml(tmp_path, GRPO, "use_vllm: true\n")
    with pytest.raises(ConfigError, match=rf"^{path}: use_vllm is set by kgreasoner from rollout_backend$"):
        load_config(GRPORecipe, path)


@pytest.mark.parametrize(("cls", "head"), [(GRPORecipe, GRPO), (SFTRecipe, SFT)], ids=["grpo", "sft"])
def test_a_recipe_that_sets_output_dir_is_told_it_is_now_run_dir(tmp_path, cls, head):
    """A recipe written when the run's folder was `output_dir` (TRL's name) is pointed to `run_dir`."""
    path = tmp_path / "old.yaml"
    path.write_text(head.replace("run_dir", "output_dir").format(out=tmp_path / "out"))
    with pytest.raises(ConfigError, match=rf"^{path}: output_dir is set by kgreasoner from run_dir"):
        load_config(cls, path)
    current = _yaml(tmp_path, head, "")
    with pytest.raises(ConfigError, match=rf"^{current}: output_dir is set by kgreasoner from run_dir"):
        load_config(cls, current, ["output_dir=elsewhere"])


@pytest.mark.parametrize(("recipe", "config"), [(GRPORecipe, GRPOConfig), (SFTRecipe, SFTConfig)])
def test_a_recipe_holds_no_field_of_trls_config(recipe, config):
    """Every TRL setting lives under `trainer:`; a recipe field of the same name would say two things at once."""
    names = {f.name for f in dataclasses.fields(config)}
    assert sorted(f.name for f in dataclasses.fields(recipe) if f.name in names) == []


def test_sfts_trl_output_dir_is_the_run_dir(tmp_path):
    sft = load_config(SFTRecipe, _yaml(tmp_path, SFT, ""))
    assert sft_config(sft, has_eval=False).output_dir == str(tmp_path / "out")


def test_recipe_checks_of_trl_values_name_the_trainer_field(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.num_generations must be >= 2"):
        load_config(GRPORecipe, _yaml(tmp_path, GRPO, "trainer: {num_generations: 1}\n"))
    with pytest.raises(ConfigError, match=r"trainer.save_steps must be a multiple of trainer.eval_steps"):
        load_config(SFTRecipe, _yaml(tmp_path, SFT, "trainer: {eval_steps: 20, save_steps: 30}\n"))


def test_the_train_scripts_refuse_a_misplaced_field_with_one_error_line(tmp_path, capsys):
    from kgreasoner.training.launch import train_main

    def never(recipe, resume):
        raise AssertionError("a refused recipe must not train")

    argv = ["--config", "configs/tiny-cpu/sft.yaml", "--set", "learning_rate=1e-3"]
    with pytest.raises(SystemExit) as exit_:
        train_main("SFT", SFTRecipe, never, "resume", argv=argv)
    assert exit_.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("error: configs/tiny-cpu/sft.yaml: learning_rate is a SFTConfig field: set it under trainer:")
    )
