"""Bad inputs of `--method laplace` and of Laplace calibrators: one line naming the file or
option and the problem, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from tests.commands.test_calibrate import CKPT, DATA, one_line_error
from tests.commands.test_laplace_cli import TwoClass, write_data, write_model
from tests.commands.test_laplace_cli import arch as two_class_arch


class Scaled(TwoClass):
    """Its last nn.Linear is followed by a scaling: the head's output is not the logits."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * self.head(self.body(x))


class Twice(nn.Module):
    """The last nn.Linear is applied twice per input."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.head(x)))


class NoLinear(nn.Module):
    """Logits from a 1×1 convolution: no nn.Linear at all."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 3, kernel_size=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x[:, None, :])[:, :, 0]


def arch(cls: type[nn.Module]) -> tuple[str, ...]:
    return ("--arch", f"py:{__name__}:{cls.__name__}", "--trust-checkpoint", "--device", "cpu")


@pytest.fixture(scope="module")
def demo_calibrator(tmp_path_factory) -> Path:
    from click.testing import CliRunner

    from curvcal.cli import main

    path = tmp_path_factory.mktemp("lap") / "cal.json"
    with CliRunner().isolation():
        code = main(["calibrate", CKPT, *DATA, "--method", "laplace", "--save-calibrator",
                     str(path), "--laplace-structure", "kron"])  # fmt: skip
    assert code == 0
    return path


def _model(tmp_path: Path, cls: type[nn.Module]) -> Path:
    torch.manual_seed(0)
    model = cls().eval()
    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    torch.save({"x": torch.randn(30, 4), "y": torch.arange(30) % 2}, tmp_path / "d.pt")
    return path


@pytest.mark.parametrize(
    ("cls", "needle"),
    [
        (Scaled, "the last nn.Linear (head) does not produce the model's logits"),
        (Twice, "the last nn.Linear (head) is not applied once per sample"),
        (NoLinear, "has no nn.Linear layer"),
    ],
)
def test_a_head_that_is_not_the_final_linear(run_cli, tmp_path: Path, cls, needle: str) -> None:
    ckpt = _model(tmp_path, cls)
    out = tmp_path / "cal.json"
    result = run_cli("calibrate", ckpt, *arch(cls), "--data", tmp_path / "d.pt",
                     "--method", "laplace", "--save-calibrator", out)  # fmt: skip
    one_line_error(result, str(ckpt), needle)
    assert not out.exists()


def test_logits_only_are_refused(run_cli, tmp_path: Path, demo_calibrator: Path) -> None:
    logits = tmp_path / "z.npz"
    assert run_cli("calibrate", CKPT, *DATA, "--method", "none", "--save-logits", logits).code == 0
    one_line_error(
        run_cli("metrics", logits, "--method", "laplace", "--val-split", "0.5"),
        "--method laplace needs the model, not only logits",
    )
    one_line_error(
        run_cli("metrics", logits, "--apply", demo_calibrator),
        str(demo_calibrator),
        "holds a Laplace calibrator",
        "curvcal calibrate CHECKPOINT --data SPEC --apply FILE",
    )


def test_apply_to_another_checkpoint_is_refused(
    run_cli, tmp_path: Path, demo_calibrator: Path
) -> None:
    from safetensors.torch import load_file

    weights = load_file(CKPT)
    weights["classifier.3.bias"] = weights["classifier.3.bias"] + 0.5
    other = tmp_path / "other.safetensors"
    from safetensors import safe_open

    with safe_open(CKPT, "pt") as handle:
        metadata = handle.metadata()
    save_file(weights, str(other), metadata)
    result = run_cli("calibrate", other, *DATA, "--apply", demo_calibrator)
    one_line_error(
        result, str(demo_calibrator), "holds a Laplace calibrator fitted on checkpoint sha256",
        "applies only to the checkpoint it was fitted on",
    )  # fmt: skip


def test_apply_with_a_fit_option_is_refused(run_cli, demo_calibrator: Path) -> None:
    for extra in (("--method", "laplace"), ("--val-split", "0.3")):
        result = run_cli("calibrate", CKPT, *DATA, "--apply", demo_calibrator, *extra)
        one_line_error(result, "--apply measures saved calibrators and fits nothing")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"kron_a": "__import__('os').system('true')"}, "kron_a must be a non-empty list"),
        ({"kron_g": [[1.0]]}, "kron_g has 1 entries where K = 10"),
        ({"prior_precision": -1.0}, "prior_precision -1.0 is outside 1.0e-08..1.0e+08"),
        ({"structure": "diag"}, "unknown structure 'diag' (structure is full or kron)"),
        ({"predictive": "bma"}, "unknown predictive 'bma' (predictive is probit or mc)"),
        ({"samples": 0, "predictive": "mc"}, "a Monte Carlo predictive needs samples >= 1"),
        ({"extra": 1}, "unknown calibrator keys ['extra']"),
    ],
)
def test_tampered_laplace_calibrator_is_one_line(
    run_cli, tmp_path: Path, demo_calibrator: Path, change: dict, needle: str
) -> None:
    saved = json.loads(demo_calibrator.read_text())
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**saved, "laplace": {**saved["laplace"], **change}}))
    one_line_error(run_cli("calibrate", CKPT, *DATA, "--apply", path), str(path), needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--method", "laplace", "--laplace-samples", "0"), "--laplace-samples"),
        (("--method", "laplace", "--laplace-structure", "diag"), "--laplace-structure"),
        (("--method", "ts", "--laplace-structure", "full"), "--laplace-structure would shape"),
    ],
)
def test_bad_laplace_options(run_cli, args: tuple[str, ...], needle: str) -> None:
    one_line_error(run_cli("calibrate", CKPT, *DATA, *args), needle)


def test_a_fit_split_of_one_sample_per_class_still_fits(run_cli, tmp_path: Path) -> None:
    model, ckpt = write_model(tmp_path, TwoClass)
    write_data(tmp_path / "fit.pt", model, 2, 5)
    torch.save({"x": torch.randn(2, 4), "y": torch.tensor([0, 1])}, tmp_path / "fit.pt")
    write_data(tmp_path / "test.pt", model, 20, 6)
    result = run_cli("calibrate", ckpt, *two_class_arch(TwoClass), "--data", tmp_path / "test.pt",
                     "--fit-data", tmp_path / "fit.pt", "--method", "laplace", "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    fit = json.loads(result.stdout)["results"]["fits"]["laplace"]
    assert fit["n_samples"] == 2 and fit["prior_precision"] > 0


def test_a_check_policy_with_method_laplace_gating_ts_is_one_line(run_cli, tmp_path: Path) -> None:
    from curvcal.assets import demo_checkpoint
    from tests.commands.test_check_command import SETTINGS

    text = (
        SETTINGS.replace("[settings]", '[settings]\nmethod = "laplace"') + "[ts.ece]\nmax = 0.5\n"
    )
    gate = tmp_path / "gate.toml"
    gate.write_text(text)
    result = run_cli("check", demo_checkpoint(), "--policy", gate)
    one_line_error(result, str(gate), "method 'laplace' fits no ts map")
