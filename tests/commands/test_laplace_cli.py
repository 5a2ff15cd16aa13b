"""`curvcal calibrate --method laplace`: fitted on a checkpoint, tabled, saved, applied with the
same checkpoint; the numbers are the kernel's on features computed here independently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from curvcal.calibration.laplace import fit_laplace
from tests.commands.test_calibrate import CKPT, DATA, as_json, one_line_error


class TwoClass(nn.Module):
    """A small MLP whose last nn.Linear gives K = 2 logits."""

    def __init__(self, k: int = 2, bias: bool = True) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 6), nn.Tanh())
        self.head = nn.Linear(6, k, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class NoBias(TwoClass):
    """Three classes, a head without a bias."""

    def __init__(self) -> None:
        super().__init__(k=3, bias=False)


def write_model(tmp_path: Path, cls: type[nn.Module], seed: int = 0) -> tuple[nn.Module, Path]:
    torch.manual_seed(seed)
    model = cls().eval()
    with torch.no_grad():
        model.head.weight.mul_(4)
    path = tmp_path / f"{cls.__name__}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, path


def write_data(
    path: Path, model: nn.Module, n: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    with torch.no_grad():
        y = torch.multinomial(torch.softmax(0.5 * model(x), 1), 1, generator=g)[:, 0]
    torch.save({"x": x, "y": y}, path)
    return x, y


def arch(cls: type[nn.Module]) -> tuple[str, ...]:
    return ("--arch", f"py:{__name__}:{cls.__name__}", "--trust-checkpoint", "--device", "cpu")


@pytest.mark.parametrize("cls", [TwoClass, NoBias])
def test_fit_data_laplace_is_the_kernel_on_the_models_features(
    run_cli, tmp_path: Path, cls: type[nn.Module]
) -> None:
    model, ckpt = write_model(tmp_path, cls)
    x_fit, y_fit = write_data(tmp_path / "fit.pt", model, 120, 1)
    write_data(tmp_path / "test.pt", model, 80, 2)
    calibrator = tmp_path / "cal.json"
    args = ("calibrate", ckpt, *arch(cls), "--data", tmp_path / "test.pt")
    document = as_json(
        run_cli(*args, "--fit-data", tmp_path / "fit.pt", "--method", "laplace",
                "--save-calibrator", calibrator, "--json")
    )  # fmt: skip
    fit = document["results"]["fits"]["laplace"]
    with torch.no_grad():
        features = model.body(x_fit)
    head = model.head
    expected = fit_laplace(
        features, y_fit, head.weight.detach(), None if head.bias is None else head.bias.detach()
    )
    assert fit["layer"] == "head" and fit["has_bias"] == (head.bias is not None)
    assert fit["structure"] == "full" and fit["n_samples"] == 120
    assert fit["prior_precision"] == pytest.approx(expected.prior_precision, rel=1e-5)
    assert fit["log_marginal_likelihood"] == pytest.approx(
        expected.log_marginal_likelihood, rel=1e-5
    )
    evaluation = document["results"]["evaluation"]
    assert evaluation["laplace"]["n_samples"] == 80
    # the probit predictive softens the MAP: mean confidence never rises
    assert evaluation["laplace"]["mean_confidence"] <= evaluation["uncalibrated"]["mean_confidence"]

    saved = json.loads(calibrator.read_text())
    assert saved["laplace"]["method"] == "laplace" and saved["laplace"]["layer"] == "head"
    assert saved["provenance"]["model"]["sha256"] == document["inputs"]["checkpoint"]["sha256"]
    applied = as_json(run_cli(*args, "--apply", calibrator, "--json"))["results"]
    for metric in ("ece", "nll", "brier", "adaece"):
        assert applied["evaluation"]["laplace"][metric] == pytest.approx(
            evaluation["laplace"][metric], rel=1e-12
        )


def test_demo_val_split_table_and_apply_over_all_rows(run_cli, tmp_path: Path) -> None:
    calibrator = tmp_path / "cal.json"
    fitted = as_json(
        run_cli("calibrate", CKPT, *DATA, "--method", "laplace", "--laplace-structure", "kron",
                "--save-calibrator", calibrator, "--json")
    )["results"]  # fmt: skip
    fit = fitted["fits"]["laplace"]
    assert fit["structure"] == "kron" and fit["layer"] == "classifier.3"
    assert fit["prior_precision"] > 0 and not fit["at_bracket_end"]
    assert set(fitted["evaluation"]) == {"uncalibrated", "ts", "focal_ts", "laplace"}
    applied = as_json(run_cli("calibrate", CKPT, *DATA, "--apply", calibrator, "--json"))
    whole = applied["results"]["evaluation"]["laplace"]
    assert whole["n_samples"] == 797
    # all rows = the 398 fit rows (in-sample NLL of the fit) + the 399 evaluation rows
    nll = (398 * fit["nll_after"] + 399 * fitted["evaluation"]["laplace"]["nll"]) / 797
    assert whole["nll"] == pytest.approx(nll, rel=1e-10)
    table = run_cli("calibrate", CKPT, *DATA, "--method", "laplace")
    assert table.code == 0 and "prior precision δ" in table.stdout
    assert "log marginal likelihood" in table.stdout


def test_mc_predictive_is_seeded(run_cli, tmp_path: Path) -> None:
    model, ckpt = write_model(tmp_path, TwoClass)
    write_data(tmp_path / "d.pt", model, 100, 3)
    args = ("calibrate", ckpt, *arch(TwoClass), "--data", tmp_path / "d.pt", "--method",
            "laplace", "--laplace-predictive", "mc", "--laplace-samples", "50", "--json")  # fmt: skip
    first = as_json(run_cli(*args))["results"]
    again = as_json(run_cli(*args))["results"]
    assert first["evaluation"]["laplace"] == again["evaluation"]["laplace"]
    assert first["fits"]["laplace"]["samples"] == 50
    other = as_json(run_cli(*args, "--seed", "1"))["results"]
    assert other["evaluation"]["laplace"]["nll"] != first["evaluation"]["laplace"]["nll"]


@pytest.mark.parametrize(
    ("record", "key", "value", "word"),
    [
        ("model", "sha256", 5, "SHA-256"),
        ("model", "sha256", True, "SHA-256"),
        ("model", "sha256", {}, "SHA-256"),
        ("model", "sha256", "ab" * 31, "SHA-256"),
        ("model", "path", ["x"], "string"),
        ("fit_data", "sha256", 5, "SHA-256"),
        ("fit_data", "source", "x" * 1001, "at most 1000"),
        ("fit_data", "size_bytes", -1, "size_bytes"),
        ("fit_data", "n_samples", 1.5, "whole number"),
        ("fit_data", "n_samples", "120", "whole number"),
    ],
)
def test_a_tampered_provenance_record_is_exit_2_naming_the_file(
    run_cli, tmp_path: Path, record: str, key: str, value: object, word: str
) -> None:
    """The provenance's fit_data and model are read by the schema reader of every saved field:
    a digest that is not one (the Laplace check sliced it: an internal error), a text too
    long, a count that is not a whole number >= 0 are one line, exit 2, naming the file."""
    model, ckpt = write_model(tmp_path, TwoClass)
    write_data(tmp_path / "fit.pt", model, 60, 1)
    write_data(tmp_path / "test.pt", model, 40, 2)
    calibrator = tmp_path / "cal.json"
    args = ("calibrate", ckpt, *arch(TwoClass), "--data", tmp_path / "test.pt")
    fitted = run_cli(*args, "--fit-data", tmp_path / "fit.pt", "--method", "laplace",
                     "--save-calibrator", calibrator)  # fmt: skip
    assert fitted.code == 0, fitted.stderr
    document = json.loads(calibrator.read_text())
    document["provenance"][record][key] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    one_line_error(run_cli(*args, "--apply", bad), str(bad), f"provenance {record}", key, word)
