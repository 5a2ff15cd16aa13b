"""`curvcal landscape` and `curvcal hessian --save-eigenvectors` through the CLI, against
ground truth built here: a dense float64 Hessian block, the unperturbed model's own loss, and
the model moved by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from safetensors import safe_open

from curvcal.assets import demo_checkpoint
from curvcal.cli import main
from curvcal.curvature.landscape import second_difference

BLOCK = "classifier.3"  # the last layer: 10×32 + 10 = 330 parameters
DATA = ["--data", "curvcal:digits", "--max-samples", "60", "--dtype", "float64"]


def _run(*args: str) -> tuple[int, str]:
    """Exit code, and stdout then stderr."""
    runner = CliRunner()
    with runner.isolation() as streams:
        code = main([str(a) for a in args])
    return code, streams[0].getvalue().decode() + streams[1].getvalue().decode()


def _model_and_data() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    from curvcal.load.checkpoint import load_model
    from curvcal.load.data import load_dataset
    from curvcal.load.datasets.batches import iter_batches
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

    loaded = load_model(demo_checkpoint(), CheckpointSettings(device="cpu", dtype="float64"))
    data = load_dataset(DataSettings(data="curvcal:digits", max_samples=60))
    pairs = list(iter_batches(data.dataset, 1000))
    x = torch.cat([pair[0] for pair in pairs]).to(torch.float64)
    y = torch.cat([pair[1] for pair in pairs])
    return loaded.module, x, y


def _dense_block_hessian(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    """The Hessian of the mean CE in (weight, bias) of the last layer, flattened."""
    weight = dict(model.named_parameters())[f"{BLOCK}.weight"].detach()
    bias = dict(model.named_parameters())[f"{BLOCK}.bias"].detach()

    def mean_loss(theta: torch.Tensor) -> torch.Tensor:
        params = {
            f"{BLOCK}.weight": theta[: weight.numel()].reshape(weight.shape),
            f"{BLOCK}.bias": theta[weight.numel() :],
        }
        return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    flat = torch.cat([weight.reshape(-1), bias])
    return torch.autograd.functional.hessian(mean_loss, flat), weight.shape


def test_saved_eigenvectors_are_the_dense_hessian_s(tmp_path: Path) -> None:
    out = tmp_path / "vectors.safetensors"
    report = tmp_path / "h.json"
    args = ["hessian", str(demo_checkpoint()), *DATA, "--params", f"{BLOCK}.*", "--top-k", "2"]
    code, text = _run(
        *args, "--no-trace", "--tol", "1e-8", "--save-eigenvectors", str(out), "-o", str(report)
    )
    assert code == 0, text
    values = [v["value"] for v in json.loads(report.read_text())["results"]["spectrum"]["values"]]
    with safe_open(str(out), "pt") as stored:
        metadata = stored.metadata()
        keys = sorted(stored.keys())
        vectors = [
            torch.cat(
                [
                    stored.get_tensor(f"v{i}/{BLOCK}.weight").reshape(-1),
                    stored.get_tensor(f"v{i}/{BLOCK}.bias"),
                ]
            )
            for i in range(2)
        ]
    assert keys == [f"v{i}/{BLOCK}.{p}" for i in range(2) for p in ("bias", "weight")]
    assert json.loads(metadata["eigenvalues"]) == values
    sha = json.loads(report.read_text())["inputs"]["checkpoint"]["sha256"]
    assert metadata["checkpoint_sha256"] == sha
    assert json.loads(metadata["parameters"]) == [f"{BLOCK}.weight", f"{BLOCK}.bias"]

    model, x, y = _model_and_data()
    hessian, _shape = _dense_block_hessian(model, x, y)
    truth, basis = torch.linalg.eigh(hessian)
    for i in range(2):
        assert values[i] == pytest.approx(float(truth[-1 - i]), rel=1e-6)
        assert float(vectors[i].norm()) == pytest.approx(1.0, abs=1e-10)
        assert abs(float(vectors[i] @ basis[:, -1 - i])) == pytest.approx(1.0, abs=1e-5)

    # an existing file is not replaced without --force, and is left as it was
    before = out.read_bytes()
    code, text = _run(*args, "--no-trace", "--save-eigenvectors", str(out))
    assert code == 2 and "already exists" in text and "--force" in text
    assert out.read_bytes() == before
    code, text = _run(*args, "--no-trace", "--save-eigenvectors", str(tmp_path / "v.pt"))
    assert code == 2 and "--save-eigenvectors" in text and ".safetensors" in text


def test_landscape_along_the_top_eigenvector(tmp_path: Path) -> None:
    """λ from the run, the loss at α = 0 equal to the unmoved model's, each point equal to the
    model moved by hand along the saved eigenvector, and the second difference ≈ λmax
    (h = 1e-4: the quartic term errs by O(h²), rounding by ε·loss/h², both far below 1e-4;
    a ReLU network's loss is only piecewise smooth, and a larger h can straddle a kink: on all
    797 digits h = 1e-3 errs by 6e-4 relative, h = 1e-4 by 2e-7)."""
    vectors = tmp_path / "v.safetensors"
    code, text = _run(
        "hessian", str(demo_checkpoint()), *DATA, "--no-trace", "--tol", "1e-8",
        "--seed", "3", "--save-eigenvectors", str(vectors),
    )  # fmt: skip
    assert code == 0, text
    report = tmp_path / "l.json"
    plot = tmp_path / "l.svg"
    code, text = _run(
        "landscape", str(demo_checkpoint()), *DATA, "--tol", "1e-8", "--seed", "3",
        "--steps", "3", "--radius", "1e-4", "--plot", str(plot), "-o", str(report),
    )  # fmt: skip
    assert code == 0, text
    assert plot.read_text().lstrip().startswith("<?xml")
    results = json.loads(report.read_text())["results"]
    with safe_open(str(vectors), "pt") as stored:
        lambda_max = json.loads(stored.metadata()["eigenvalues"])[0]
        names = stored.keys()
        direction = {key[3:]: stored.get_tensor(key) for key in names}
    assert results["eigenvalues"][0] == pytest.approx(lambda_max, rel=1e-6)
    points = results["landscape"]["points"]
    assert [p["alpha"] for p in points] == [-1e-4, 0.0, 1e-4]

    model, x, y = _model_and_data()
    with torch.no_grad():
        assert points[1]["loss"] == pytest.approx(float(F.cross_entropy(model(x), y)), rel=1e-12)
        params = dict(model.named_parameters())
        for point in (points[0], points[2]):
            # the eigenvector's sign is arbitrary: the run's and the file's may differ
            losses = []
            for sign in (1.0, -1.0):
                moved = {n: params[n] + sign * point["alpha"] * direction[n] for n in direction}
                logits = torch.func.functional_call(model, moved, (x,))
                losses.append(float(F.cross_entropy(logits, y)))
            assert min(abs(point["loss"] - loss) for loss in losses) <= 1e-12 * point["loss"]
    (curvature,) = second_difference([p["loss"] for p in points], 1e-4)
    assert curvature == pytest.approx(lambda_max, rel=1e-4)


def test_landscape_grid_of_random_directions_and_bad_options(tmp_path: Path) -> None:
    code, text = _run(
        "landscape", str(demo_checkpoint()), "--data", "curvcal:digits", "--max-samples", "40",
        "--directions", "random", "--dims", "2", "--steps", "3", "--json",
    )  # fmt: skip
    assert code == 0, text
    results = json.loads(text)["results"]
    text = text[: text.rindex("}") + 1]
    assert results["eigenvalues"] is None and results["landscape"]["betas"] == [-0.5, 0.0, 0.5]
    assert len(results["landscape"]["points"]) == 9
    centre = results["landscape"]["points"][4]
    assert (centre["alpha"], centre["beta"]) == (0.0, 0.0)
    code, again = _run(
        "landscape", str(demo_checkpoint()), "--data", "curvcal:digits", "--max-samples", "40",
        "--directions", "random", "--dims", "2", "--steps", "3", "--json",
    )  # fmt: skip
    assert json.loads(again)["results"] == results  # the same seed draws the same directions
    for bad, message in (
        (["--dims", "3"], "--dims"),
        (["--steps", "1"], "--steps"),
        (["--loss", "focal"], "--gamma"),
        (["--radius", "0"], "--radius"),
    ):
        code, text = _run("landscape", str(demo_checkpoint()), "--data", "curvcal:digits", *bad)
        assert code == 2 and message in text, text
