"""Catalogue: inputs read as meant, or a word on stderr and in the JSON ``warnings``.

One test per finding: preprocessing curvcal chooses on its own is said (stderr, first table,
JSON); a model config whose input size differs from the images' is a warning that an explicit
``--resize`` silences; probability-looking scores read as logits are a warning (an error under
``--strict``); calibrator files carry provenance and refuse a mismatch unless
``--apply-anyway``; a temperature at its bracket end and an infinite NLL are warnings.
Models and images are built here with timm and transformers themselves.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

from PIL import Image  # noqa: E402

from curvcal.calibration.metrics import calibration_metrics  # noqa: E402
from tests.console_text import said, shown, times_said  # noqa: E402


def _images(root: Path, side: int, per_class: int = 4, classes: str = "abc") -> Path:
    generator = torch.Generator().manual_seed(7)
    for label in classes:
        (root / label).mkdir(parents=True)
        for index in range(per_class):
            pixels = torch.randint(0, 256, (side, side, 3), generator=generator, dtype=torch.uint8)
            Image.fromarray(pixels.numpy()).save(root / label / f"{index}.png")
    return root


@pytest.fixture(scope="module")
def timm_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A timm save_for_hf folder whose pretrained_cfg (test_resnet's: 160×160, mean/std 0.5)
    is not what 32×32 images are."""
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=3).eval()
    folder = tmp_path_factory.mktemp("timm") / "model"
    save_for_hf(model, str(folder), safe_serialization=True)
    assert json.loads((folder / "config.json").read_text())["pretrained_cfg"]["input_size"] == [
        3,
        160,
        160,
    ]
    return folder, model


@pytest.fixture(scope="module")
def small_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _images(tmp_path_factory.mktemp("images") / "folder", 32)


def _valid(document: dict) -> None:
    """The report, new fields included, is valid under the schema curvcal ships."""
    jsonschema = pytest.importorskip("jsonschema")
    from curvcal.assets import report_schema

    jsonschema.validate(document, json.loads(report_schema().read_text()))


def _json(result) -> dict:
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def test_a_timm_config_that_upscales_the_images_is_a_warning(
    run_cli, timm_folder, small_images, tmp_path: Path
) -> None:
    folder, _model = timm_folder
    result = run_cli(
        "calibrate", folder, "--data", f"folder:{small_images}", "--method", "ts", "--json"
    )
    document = _json(result)
    warning = next(w for w in document["warnings"] if "32×32" in w)
    assert "160×160" in warning and "upscaled" in warning and "--resize none" in warning
    assert "curvcal: warning:" in result.stderr and "upscaled" in result.stderr
    chosen = document["inputs"]["data"]["chosen_preprocessing"]
    assert any("resize 168, center-crop 160" in note for note in chosen)
    assert any("normalisation mean 0.5,0.5,0.5" in note for note in chosen)
    assert said("curvcal chose resize 168", result.stderr)
    _valid(document)


def test_explicit_resize_none_reads_the_images_as_they_are(
    run_cli, timm_folder, small_images, tmp_path: Path
) -> None:
    folder, model = timm_folder
    logits = tmp_path / "z.npz"
    result = run_cli(
        "calibrate",
        folder,
        "--data",
        f"folder:{small_images}",
        "--resize",
        "none",
        "--mean",
        "0.5,0.5,0.5",
        "--std",
        "0.5,0.5,0.5",
        "--method",
        "ts",
        "--save-logits",
        logits,
        "--json",
    )
    document = _json(result)
    # (random images with random labels: the temperature warning is expected, no size warning)
    assert not any("×" in w for w in document["warnings"]) and "×" not in result.stderr
    assert "chosen_preprocessing" not in document["inputs"]["data"]
    assert "chose" not in result.stderr
    # ground truth: the model's own forward on the 32×32 images, normalised by hand
    from torchvision.datasets import ImageFolder

    images = ImageFolder(str(small_images))
    x = torch.stack(
        [
            torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), dtype=np.float32))
            .permute(2, 0, 1)
            .div(255)
            .sub(0.5)
            .div(0.5)
            for path, _ in images.samples
        ]
    )
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(torch.from_numpy(np.load(logits)["logits"]), expected, atol=1e-5)


def test_folder_imagenet_default_is_said_in_the_table_header(
    run_cli, small_images, tmp_path: Path
) -> None:
    model = torch.jit.script(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3)).eval()
    )
    path = tmp_path / "plain.pt"
    torch.jit.save(model, str(path))
    result = run_cli(
        "calibrate",
        path,
        "--trust-checkpoint",
        "--data",
        f"folder:{small_images}",
        "--method",
        "ts",
        "--format",
        "markdown",
    )
    assert result.code == 0, result.stderr
    # the first table after the "what was measured" header that opens every output
    header = result.stdout.split("###")[2]
    assert "preprocessing chosen by curvcal" in header
    assert "0.485,0.456,0.406" in header and "imagenet preset" in header
    assert said("curvcal chose normalisation mean 0.485,0.456,0.406", result.stderr)


def test_folder_imagenet_default_is_a_warning_in_the_json_and_under_quiet(
    run_cli, small_images, tmp_path: Path
) -> None:
    model = torch.jit.script(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3)).eval()
    )
    path = tmp_path / "plain.pt"
    torch.jit.save(model, str(path))
    args = ("calibrate", path, "--trust-checkpoint", "--data", f"folder:{small_images}",
            "--method", "none", "--json")  # fmt: skip
    quiet = run_cli(*args, "-q")
    document = _json(quiet)
    (warning,) = [w for w in document["warnings"] if "0.485,0.456,0.406" in w]
    assert "imagenet preset" in warning and "an assumption" in warning
    assert said("curvcal chose normalisation mean 0.485,0.456,0.406", quiet.stderr)
    assert said("an assumption", quiet.stderr)
    # said once without -q too: as the warning, not also as a note
    loud = run_cli(*args)
    assert times_said("curvcal chose normalisation mean 0.485,0.456,0.406", loud.stderr) == 1
    _valid(document)


def test_an_hf_image_processor_size_that_differs_is_a_warning(
    run_cli, small_images, tmp_path: Path
) -> None:
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=8,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    torch.manual_seed(0)
    folder = tmp_path / "vit"
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)
    document = _json(
        run_cli("calibrate", folder, "--data", f"folder:{small_images}", "--method", "ts", "--json")
    )
    assert any("32×32" in w and "16×16" in w and "downscaled" in w for w in document["warnings"])
    quiet = _json(
        run_cli(
            "calibrate",
            folder,
            "--data",
            f"folder:{small_images}",
            "--resize",
            "16",
            "--method",
            "ts",
            "--json",
        )
    )
    assert not any("×" in w for w in quiet["warnings"])
    # the Hessian reads the same data the same way, and says so the same way
    hessian = run_cli(
        "hessian",
        folder,
        "--data",
        f"folder:{small_images}",
        "--params",
        "classifier.*",
        "--no-trace",
        "--max-iter",
        "5",
        "--json",
    )
    assert hessian.code == 0, hessian.stderr
    assert any("downscaled" in w for w in json.loads(hessian.stdout)["warnings"])
    assert "downscaled" in hessian.stderr


@pytest.fixture
def probabilities(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """Over-confident probabilities (rows sum to 1) with labels drawn from softer ones."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(300, 5)) * 3
    soft = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = np.array([rng.choice(5, p=row) for row in soft])
    sharp = np.exp(3 * logits) / np.exp(3 * logits).sum(1, keepdims=True)
    path = tmp_path / "probs.csv"
    with path.open("w") as handle:
        handle.write(",".join(f"logits_{k}" for k in range(5)) + ",labels\n")
        for row, label in zip(sharp, labels, strict=True):
            handle.write(",".join(repr(float(v)) for v in row) + f",{label}\n")
    return path, sharp, labels


def test_probabilities_read_as_logits_are_a_warning_naming_input_kind(
    run_cli, probabilities
) -> None:
    path, sharp, labels = probabilities
    result = run_cli("metrics", path, "--json")
    document = _json(result)
    assert any("--input-kind probs" in w and "look like" in w for w in document["warnings"])
    assert said("--input-kind probs", result.stderr)
    # the number it warns about is not the truth; with --input-kind probs it is
    truth = calibration_metrics(torch.from_numpy(sharp), torch.from_numpy(labels), kind="probs")
    read = _json(run_cli("metrics", path, "--input-kind", "probs", "--json"))
    assert read["warnings"] == []
    assert read["results"]["evaluation"]["uncalibrated"]["ece"] == pytest.approx(truth.ece)
    wrong = document["results"]["evaluation"]["uncalibrated"]["ece"]
    assert abs(wrong - truth.ece) > 0.1


def test_probabilities_read_as_logits_are_refused_under_strict(run_cli, probabilities) -> None:
    path, _sharp, _labels = probabilities
    result = run_cli("metrics", path, "--strict")
    assert result.code == 2 and result.stdout == ""
    assert result.stderr.startswith(f"curvcal: error: {shown(path, ':')}")
    assert "--input-kind probs" in result.stderr and "--strict" in result.stderr


def _logits_file(path: Path, n_classes: int = 4, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(200, n_classes)) * 4
    soft = np.exp(logits / 2) / np.exp(logits / 2).sum(1, keepdims=True)
    labels = np.array([rng.choice(n_classes, p=row) for row in soft])
    np.savez(path, logits=logits, labels=labels)
    return path


def test_a_saved_calibrator_records_its_provenance(run_cli, tmp_path: Path) -> None:
    fit = _logits_file(tmp_path / "fit.npz")
    test = _logits_file(tmp_path / "test.npz", seed=1)
    calibrator = tmp_path / "cal.json"
    saved = run_cli(
        "metrics", test, "--fit", fit, "--method", "ts", "--save-calibrator", calibrator
    )
    assert saved.code == 0, saved.stderr
    provenance = json.loads(calibrator.read_text())["provenance"]
    assert provenance["n_classes"] == 4 and provenance["input_kind"] == "logits"
    assert provenance["fit_data"]["sha256"] == hashlib.sha256(fit.read_bytes()).hexdigest()
    assert provenance["fit_data"]["size_bytes"] == fit.stat().st_size
    assert provenance["fit_data"]["n_samples"] == 200 and provenance["model"] is None
    applied = run_cli("metrics", test, "--apply", calibrator, "--json")
    document = _json(applied)
    assert document["inputs"]["calibrator"]["provenance"] == provenance
    _valid(document)
    assert provenance["fit_data"]["sha256"] in applied.stderr


def test_calibrate_records_the_model_sha256(run_cli, timm_folder, small_images, tmp_path) -> None:
    folder, _model = timm_folder
    calibrator = tmp_path / "cal.json"
    document = _json(
        run_cli(
            "calibrate",
            folder,
            "--data",
            f"folder:{small_images}",
            "--resize",
            "none",
            "--method",
            "ts",
            "--save-calibrator",
            calibrator,
            "--json",
        )
    )
    provenance = json.loads(calibrator.read_text())["provenance"]
    assert provenance["model"]["sha256"] == document["inputs"]["checkpoint"]["sha256"]
    assert provenance["n_classes"] == 3 and provenance["fit_data"]["n_samples"] == 6
    assert "--val-split 0.5" in provenance["fit_data"]["source"]


def test_a_calibrator_fitted_on_logits_is_refused_on_probabilities(run_cli, tmp_path: Path) -> None:
    fit = _logits_file(tmp_path / "fit.npz")
    calibrator = tmp_path / "cal.json"
    assert (
        run_cli(
            "metrics", fit, "--val-split", "0.5", "--method", "ts", "--save-calibrator", calibrator
        ).code
        == 0
    )
    z = np.load(fit)["logits"]
    rounded = np.round(np.exp(z) / np.exp(z).sum(1, keepdims=True), 2)
    rounded /= rounded.sum(1, keepdims=True)
    probs = tmp_path / "rounded.npz"
    np.savez(probs, logits=rounded, labels=np.load(fit)["labels"])
    refused = run_cli("metrics", probs, "--input-kind", "probs", "--apply", calibrator)
    assert refused.code == 2 and refused.stdout == ""
    assert (
        f"curvcal: error: {shown(calibrator, ':')} does not match {shown(probs)}" in refused.stderr
    )
    assert "fitted on logits, applied to probs" in refused.stderr
    assert "--apply-anyway" in refused.stderr
    anyway = run_cli(
        "metrics", probs, "--input-kind", "probs", "--apply", calibrator, "--apply-anyway", "--json"
    )
    document = _json(anyway)
    assert any("fitted on logits, applied to probs" in w for w in document["warnings"])
    # rounded probabilities put 0 on some true classes: the NLL is infinite and says so
    assert document["results"]["evaluation"]["uncalibrated"]["nll"] is None
    assert any("NLL of the uncalibrated stage" in w for w in document["warnings"])


def test_a_calibrator_for_other_classes_is_refused(run_cli, tmp_path: Path) -> None:
    fit = _logits_file(tmp_path / "fit.npz", n_classes=4)
    other = _logits_file(tmp_path / "other.npz", n_classes=3)
    calibrator = tmp_path / "cal.json"
    assert run_cli("metrics", fit, "--val-split", "0.5", "--save-calibrator", calibrator).code == 0
    refused = run_cli("metrics", other, "--apply", calibrator)
    assert refused.code == 2
    assert "fitted on 4 classes, applied to 3" in refused.stderr


def test_an_old_calibrator_file_is_read_and_said_to_have_no_provenance(
    run_cli, tmp_path: Path
) -> None:
    test = _logits_file(tmp_path / "test.npz")
    old = tmp_path / "old.json"
    old.write_text(
        '{"schema": "1.0", "curvcal": "0.1.0", '
        '"ts": {"method": "temperature", "temperature": 2.0, "gamma": 0.0}, "focal_ts": null}'
    )
    result = run_cli("metrics", test, "--apply", old, "--json")
    document = _json(result)
    assert any("has no provenance" in w for w in document["warnings"])
    assert said("has no provenance", result.stderr)
    assert document["inputs"]["calibrator"]["provenance"] is None


def test_a_temperature_at_its_bracket_end_is_a_warning(run_cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    noise = tmp_path / "noise.npz"  # confident scores with labels unrelated to them: T -> inf
    np.savez(noise, logits=rng.normal(size=(300, 4)) * 5, labels=rng.integers(0, 4, 300))
    result = run_cli("metrics", noise, "--val-split", "0.5", "--method", "ts", "--json")
    document = _json(result)
    assert document["results"]["fits"]["ts"]["at_bracket_end"] is True
    assert document["results"]["fits"]["ts"]["temperature"] == pytest.approx(100.0)
    assert any(
        "temperature scaling stopped at T = 100" in w and "[0.01, 100]" in w
        for w in document["warnings"]
    )
    assert said("stopped at T = 100", result.stderr)


def test_a_softmax_model_calibrated_as_logits_is_a_warning(run_cli, tmp_path: Path) -> None:
    model = torch.jit.script(
        torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.Softmax(dim=1)).eval()
    )
    path = tmp_path / "softmax.pt"
    torch.jit.save(model, str(path))
    data = tmp_path / "data.pt"
    torch.save({"x": torch.randn(40, 6), "y": torch.arange(40) % 3}, data)
    result = run_cli(
        "calibrate", path, "--trust-checkpoint", "--data", data, "--method", "ts", "--json"
    )
    document = _json(result)
    assert any(
        "look like probabilities" in w and "--save-logits" in w for w in document["warnings"]
    )
    assert said("look like probabilities", result.stderr)
