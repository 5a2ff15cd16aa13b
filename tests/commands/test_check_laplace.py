"""`curvcal check` gating the last-layer Laplace map: a policy with a `laplace.*` rule fits it on
the fit split from the model's features and judges its metrics like any map's, with the numbers
`curvcal calibrate --method laplace` gives on the same data and split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from curvcal.assets import demo_checkpoint
from tests.commands.test_check_command import SETTINGS, policy, row


def _check(run_cli, tmp_path: Path, text: str):
    return run_cli("check", demo_checkpoint(), "--policy", policy(tmp_path, text), "--json")


def _calibrate(run_cli, *extra: str) -> dict:
    result = run_cli(
        "calibrate", demo_checkpoint(), "--data", "curvcal:digits", "--device", "cpu",
        "--max-samples", "120", "--method", "laplace", "--json", *extra,
    )  # fmt: skip
    assert result.code == 0, result.output
    return json.loads(result.stdout)["results"]


@pytest.mark.parametrize("rule", ["marglik", "nll"])
def test_passing_laplace_policy_exits_0_with_calibrates_numbers(run_cli, tmp_path, rule) -> None:
    text = (
        SETTINGS + f'laplace_prior = "{rule}"\n[laplace.nll]\nmax = 5\n[laplace.ece]\nmax = 0.9\n'
    )
    result = _check(run_cli, tmp_path, text)
    assert result.code == 0, result.output
    document = json.loads(result.stdout)
    calibration = document["results"]["calibration"]
    assert calibration["settings"]["method"] == "laplace"
    assert calibration["settings"]["laplace_prior"] == rule
    assert calibration["fits"]["laplace"]["prior_rule"] == rule
    expected = _calibrate(run_cli, "--laplace-prior", rule)
    assert calibration["fits"]["laplace"]["prior_precision"] == pytest.approx(
        expected["fits"]["laplace"]["prior_precision"], rel=1e-12
    )
    for metric in ("nll", "ece"):
        measured = row(document, f"laplace.{metric}", "max")
        assert measured["passed"]
        assert measured["value"] == pytest.approx(
            expected["evaluation"]["laplace"][metric], rel=1e-12
        )


def test_failing_laplace_policy_exits_1_with_that_row_marked(run_cli, tmp_path) -> None:
    # the evidence-chosen δ leaves the digits model under-confident: ECE far above 0.05
    text = SETTINGS + "\n[ece]\nmax = 0.5\n[laplace.ece]\nmax = 0.05\n"
    result = _check(run_cli, tmp_path, text)
    assert result.code == 1, result.output
    document = json.loads(result.stdout)
    failed = row(document, "laplace.ece", "max")
    assert not failed["passed"] and failed["value"] > 0.05
    assert row(document, "ece", "max")["passed"]
    assert document["status"] == "fail"


def test_laplace_with_ts_fits_every_map(run_cli, tmp_path) -> None:
    text = SETTINGS + "\n[ts.ece]\nmax = 0.5\n[laplace.ece]\nmax = 0.9\n"
    result = _check(run_cli, tmp_path, text)
    assert result.code == 0, result.output
    calibration = json.loads(result.stdout)["results"]["calibration"]
    assert calibration["settings"]["method"] == "all"
    assert {"ts", "laplace"} <= set(calibration["evaluation"])


class SoftmaxHead(nn.Module):
    """A model whose last nn.Linear is followed by a scaling: its logits are not the head's."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2.0 * self.head(x.reshape(x.shape[0], -1))


def test_a_model_without_a_logits_head_is_refused_in_one_line(run_cli, tmp_path) -> None:
    model = SoftmaxHead()
    ckpt = tmp_path / "scaled.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    text = SETTINGS + "\n[laplace.ece]\nmax = 0.9\n"
    result = run_cli(
        "check", ckpt, "--arch", f"py:{__name__}:SoftmaxHead", "--trust-checkpoint",
        "--policy", policy(tmp_path, text),
    )  # fmt: skip
    assert result.code == 2, result.output
    assert "does not produce the model's logits" in result.output
    assert "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if "error" in line] == [
        result.output.strip().splitlines()[-1]
    ]  # one line (progress lines may precede it)


def test_logits_alone_are_refused_in_one_line(run_cli, tmp_path) -> None:
    logits = tmp_path / "logits.pt"
    torch.save({"logits": torch.randn(20, 3), "labels": torch.randint(0, 3, (20,))}, logits)
    text = SETTINGS + "\n[laplace.ece]\nmax = 0.9\n"
    result = run_cli("check", logits, "--policy", policy(tmp_path, text))
    assert result.code == 2, result.output
    assert "holds logits and labels, not a model" in result.output
    assert "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if "error" in line] == [
        result.output.strip().splitlines()[-1]
    ]  # one line (progress lines may precede it)
