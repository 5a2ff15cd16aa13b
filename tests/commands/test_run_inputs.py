"""The inputs a command that runs a checkpoint on ``--data`` names before any work, from one
place (:func:`~curvcal.commands.clashes.model_and_data_inputs`): the checkpoint, an ``--arch
hf:`` folder, ``--data`` and the command's other data options, ``--tokenizer``, in that order."""

from __future__ import annotations

from pathlib import Path

from curvcal.commands.clashes import model_and_data_inputs
from curvcal.settings.checkpoint import CheckpointSettings
from curvcal.settings.data import DataSettings


def test_every_input_of_a_checkpoint_run_on_data_is_named(tmp_path: Path) -> None:
    model = tmp_path / "m.pt"
    named = model_and_data_inputs(
        model,
        CheckpointSettings(arch=f"hf:{tmp_path / 'cfg'}"),
        DataSettings(data=str(tmp_path / "d.pt"), tokenizer=tmp_path / "tok"),
        [("--fit-data", str(tmp_path / "f.pt")), ("--curvature-data", None)],
    )
    assert named == [
        ("CHECKPOINT", model),
        ("--arch", tmp_path / "cfg"),
        ("--data", tmp_path / "d.pt"),
        ("--fit-data", tmp_path / "f.pt"),
        ("--tokenizer", tmp_path / "tok"),
    ]


def test_a_torchvision_dataset_names_its_root_and_nothing_else_is_added(tmp_path: Path) -> None:
    named = model_and_data_inputs(
        tmp_path / "m.pt",
        CheckpointSettings(arch="tv:resnet18"),
        DataSettings(data="tv:CIFAR10", data_root=tmp_path / "root"),
    )
    assert named == [("CHECKPOINT", tmp_path / "m.pt"), ("--data-root", tmp_path / "root")]
