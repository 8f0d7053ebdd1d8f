"""Shared training helpers."""


def test_last_complete_checkpoint_passes_over_a_folder_killed_while_saving(tmp_path):
    from kgreasoner.training.common import last_complete_checkpoint

    assert last_complete_checkpoint(tmp_path / "missing") is None
    for step in (2, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-11").mkdir()  # killed before trainer_state.json was written
    (tmp_path / "checkpoint-x").mkdir()
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
