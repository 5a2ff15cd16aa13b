"""Class counts the labels contradict: a class count inferred from a head tied to the input
embedding (the vocabulary's width) is refused when the labels do not reach it, and a
calibration set holding only some of the model's classes is a warning naming how many."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from curvcal.load.models.architecture import tied_output_widths
from curvcal.models import DigitsCNN
from curvcal.pipeline.calibration_warnings import missing_classes

VOCAB = 12


class TiedHead(nn.Module):
    """Token counts (float, N × VOCAB) -> their embedding -> a head sharing the embedding's
    weight: VOCAB outputs whatever the task's class count."""

    def __init__(self, num_classes: int = VOCAB) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_classes, 8)
        self.head = nn.Linear(8, num_classes, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(x @ self.embed.weight))


class Untied(TiedHead):
    """The same shapes, the head its own weight."""

    def __init__(self, num_classes: int = VOCAB) -> None:
        super().__init__(num_classes)
        self.head.weight = nn.Parameter(self.embed.weight.detach().clone())


def _write(tmp_path: Path, cls: type[nn.Module], classes: int) -> tuple[Path, Path]:
    torch.manual_seed(0)
    model = cls()
    checkpoint = tmp_path / f"{cls.__name__}.safetensors"
    save_file({k: v.clone().contiguous() for k, v in model.state_dict().items()}, str(checkpoint))
    generator = torch.Generator().manual_seed(1)
    data = tmp_path / f"tokens{classes}.safetensors"
    x = torch.rand(60, VOCAB, generator=generator)
    save_file({"x": x, "y": torch.arange(60) % classes}, str(data))
    return checkpoint, data


def _arch(cls: type[nn.Module]) -> tuple[str, ...]:
    return ("--arch", f"py:{__name__}:{cls.__name__}", "--trust-checkpoint", "--device", "cpu")


def test_tied_widths_are_found() -> None:
    assert tied_output_widths(TiedHead()) == {VOCAB}
    assert tied_output_widths(Untied()) == frozenset()


def test_a_class_count_inferred_from_a_tied_head_is_refused(
    tmp_path: Path, run_cli: Callable[..., object]
) -> None:
    """Labels 0..5 (6 classes) and a head tied to a 12-token embedding: the 12 outputs are the
    vocabulary's, and the run asks for --num-classes (exit 2, one line naming the file)."""
    checkpoint, data = _write(tmp_path, TiedHead, 6)
    result = run_cli("calibrate", checkpoint, *_arch(TiedHead), "--data", data)
    assert result.code == 2, result.output  # type: ignore[attr-defined]
    line = [x for x in result.stderr.splitlines() if x.strip()]  # type: ignore[attr-defined]
    assert len(line) == 1 and str(checkpoint) in line[0]
    assert "tied to its input embedding" in line[0] and "labels span 6 classes" in line[0]
    assert "--num-classes" in line[0]


@pytest.mark.parametrize(("cls", "classes"), [(TiedHead, VOCAB), (Untied, 6)])
def test_labels_that_reach_the_width_or_an_untied_head_pass(
    tmp_path: Path, run_cli: Callable[..., object], cls: type[nn.Module], classes: int
) -> None:
    checkpoint, data = _write(tmp_path, cls, classes)
    result = run_cli("calibrate", checkpoint, *_arch(cls), "--data", data, "--json")
    assert result.code == 0, result.output  # type: ignore[attr-defined]
    warnings = json.loads(result.stdout)["warnings"]  # type: ignore[attr-defined]
    if classes < VOCAB:  # the untied model's 12 outputs, 6 of them in the labels
        assert any("hold 6 of the model's 12 classes (6 missing: 6, 7" in w for w in warnings)


def test_missing_classes_warning_counts_them() -> None:
    labels = torch.tensor([0, 1, 2, 3, 4, 0, 1])
    message = missing_classes(labels, 10, "--data d.safetensors")
    assert message is not None
    assert message.startswith("--data d.safetensors: the labels hold 5 of the model's 10 classes")
    assert "(5 missing: 5, 6, 7, 8, 9)" in message
    assert missing_classes(torch.arange(10), 10, "x") is None
    assert missing_classes(torch.zeros(3, dtype=torch.long), 1, "x") is None  # K = 1: own warning
    many = missing_classes(torch.tensor([0]), 100, "x")
    assert many is not None and "99 missing: 1, 2, 3, 4, 5, 6, 7, 8, ... and 91 more" in many


def _ten_class_model_on_half_its_classes(tmp_path: Path) -> None:
    """``m.safetensors``: a 10-class DigitsCNN; ``half.safetensors``: 40 samples of classes
    0..4 only."""
    torch.manual_seed(0)
    model = DigitsCNN(num_classes=10, width=1)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(tmp_path / "m.safetensors"),
        metadata={
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": json.dumps({"num_classes": 10, "width": 1}),
        },
    )
    generator = torch.Generator().manual_seed(0)
    save_file(
        {"x": torch.randn(40, 1, 8, 8, generator=generator), "y": torch.arange(40) % 5},
        str(tmp_path / "half.safetensors"),
    )


def test_calibrate_warns_when_the_calibration_set_lacks_classes(
    tmp_path: Path, run_cli: Callable[..., object]
) -> None:
    """A 10-class model calibrated on data holding classes 0..4 only."""
    _ten_class_model_on_half_its_classes(tmp_path)
    result = run_cli(
        "calibrate", tmp_path / "m.safetensors", "--data", tmp_path / "half.safetensors", "--json"
    )
    assert result.code == 0, result.output  # type: ignore[attr-defined]
    assert "the labels" in " ".join(result.stderr.split())  # type: ignore[attr-defined]
    warnings = json.loads(result.stdout)["warnings"]  # type: ignore[attr-defined]
    assert sum("hold 5 of the model's 10 classes (5 missing: 5, 6" in w for w in warnings) == 1


def test_metrics_warns_for_a_scores_file_lacking_classes(
    tmp_path: Path, run_cli: Callable[..., object]
) -> None:
    np.savez(
        tmp_path / "k4.npz",
        logits=np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32),
        labels=np.arange(30) % 3,
    )
    result = run_cli("metrics", tmp_path / "k4.npz", "--json")
    assert result.code == 0, result.output  # type: ignore[attr-defined]
    warnings = json.loads(result.stdout)["warnings"]  # type: ignore[attr-defined]
    assert any("hold 3 of the model's 4 classes (1 missing: 3)" in w for w in warnings)


def test_check_warns_when_the_data_lacks_classes(
    tmp_path: Path, run_cli: Callable[..., object]
) -> None:
    """The same 10-class model gated by ``check`` on data holding classes 0..4 only: the
    warning calibrate gives is in check's report too, said once."""
    _ten_class_model_on_half_its_classes(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text(
        f'[settings]\ndata = "{(tmp_path / "half.safetensors").as_posix()}"\ndevice = "cpu"\n'
        'method = "none"\n\n[ece]\nmax = 1.0\n'
    )
    result = run_cli("check", tmp_path / "m.safetensors", "--policy", policy, "--json")
    assert result.code == 0, result.output  # type: ignore[attr-defined]
    warnings = json.loads(result.stdout)["warnings"]  # type: ignore[attr-defined]
    assert sum("hold 5 of the model's 10 classes (5 missing: 5, 6" in w for w in warnings) == 1


def test_study_warns_when_the_data_lacks_classes(
    tmp_path: Path, run_cli: Callable[..., object]
) -> None:
    """``study`` of the same model on the same half of the classes: the warning is in its
    report too, once for the checkpoint."""
    _ten_class_model_on_half_its_classes(tmp_path)
    result = run_cli(
        "study",
        tmp_path / "m.safetensors",
        "--data",
        tmp_path / "half.safetensors",
        "--probes",
        "4",
        "--tol",
        "1e-3",
        "--json",
    )
    assert result.code == 0, result.output  # type: ignore[attr-defined]
    warnings = json.loads(result.stdout)["warnings"]  # type: ignore[attr-defined]
    assert sum("hold 5 of the model's 10 classes (5 missing: 5, 6" in w for w in warnings) == 1
