"""Files of other frameworks, and inputs curvcal reads once it knows what they mean.

A model saved by ONNX, Keras/HDF5, TensorFlow (SavedModel), Flax (msgpack) or llama.cpp (GGUF)
is refused with one line that names the file and the format and says what works instead (exit
2, nothing on stdout, the file unchanged). A binary problem's single logit column and one-hot
labels are read (checked against hand-worked numbers); soft labels are refused with the row.
``inspect`` names the ``--allow-global`` a torchvision reference checkpoint needs, the model
the file records, counts parameters without BatchNorm's statistics and shows a shared prefix.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from curvcal.errors import InputError
from curvcal.load.scores.logits import load_logits

# (file or folder name, how to make it, the format's name in the message, a word of the route)
ONNX_BYTES = b"\x08\x07\x12\x07pytorch\x1a\x032.6"  # ir_version 7, producer "pytorch"


def _onnx(path: Path) -> None:
    path.write_bytes(ONNX_BYTES)


def _hdf5(path: Path) -> None:
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64))


def _keras_v3(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", '{"keras_version": "3.0.0"}')
        archive.writestr("config.json", '{"class_name": "Sequential"}')
        archive.writestr("model.weights.h5", b"\x89HDF\r\n\x1a\n")


def _saved_model(path: Path) -> None:
    path.mkdir()
    (path / "saved_model.pb").write_bytes(b"\x08\x01")
    (path / "variables").mkdir()


def _msgpack(path: Path) -> None:
    path.write_bytes(b"\x81\xa6params\x81\xa5dense\x80")


def _gguf(path: Path) -> None:
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(16))


FOREIGN = [
    ("model.onnx", _onnx, "is an ONNX model", "curvcal metrics"),
    ("model.h5", _hdf5, "is a Keras/HDF5 model", "safetensors"),
    ("weights.bin.hdf5", _hdf5, "is a Keras/HDF5 model", "safetensors"),
    ("model.keras", _keras_v3, "is a Keras/HDF5 model", "curvcal metrics"),
    ("exported", _saved_model, "is a TensorFlow SavedModel", "curvcal metrics"),
    ("flax_model.msgpack", _msgpack, "is Flax weights (msgpack)", "from_flax=True"),
    ("model.gguf", _gguf, "is a GGUF file (llama.cpp)", "safetensors"),
    # the content names the format whatever the name says
    ("renamed.pt", _hdf5, "is a Keras/HDF5 model", "safetensors"),
    ("renamed.bin", _gguf, "is a GGUF file (llama.cpp)", "safetensors"),
]


def _digest(path: Path) -> str:
    if path.is_dir():
        return ";".join(_digest(p) for p in sorted(path.rglob("*")) if p.is_file())
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line_error(result, *needles: str) -> str:
    assert result.code == 2, (result.code, result.stderr)
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("curvcal: error: ")
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "data.pt"
    torch.save({"x": torch.randn(6, 1, 8, 8), "y": torch.tensor([0, 1, 2, 0, 1, 2])}, path)
    return path


@pytest.mark.parametrize(
    ("name", "make", "format_name", "route"), FOREIGN, ids=[f[0] for f in FOREIGN]
)
@pytest.mark.parametrize("command", ["inspect", "hessian", "calibrate"])
def test_a_foreign_model_is_named_with_what_works(
    run_cli, tmp_path: Path, data: Path, name, make, format_name, route, command
) -> None:
    path = tmp_path / name
    make(path)
    before = _digest(path)
    options = [] if command == "inspect" else ["--arch", "curvcal:DigitsCNN", "--data", data]
    result = run_cli(command, path, *options)
    line = _one_line_error(result, f"{path}: {format_name}", route)
    assert "PyTorch checkpoints" in line
    assert _digest(path) == before


@pytest.mark.parametrize(
    ("name", "make", "format_name"),
    [
        ("model.onnx", _onnx, "ONNX"),
        ("model.h5", _hdf5, "Keras/HDF5"),
        ("model.gguf", _gguf, "GGUF"),
    ],
)
def test_metrics_names_the_format_and_the_files_it_reads(
    run_cli, tmp_path: Path, name, make, format_name
) -> None:
    path = tmp_path / name
    make(path)
    _one_line_error(
        run_cli("metrics", path),
        f"{path}: is",
        format_name,
        ".npz, .pt, .safetensors, .parquet or .csv",
    )


def test_a_missing_file_is_missing_whatever_its_extension(run_cli, tmp_path: Path) -> None:
    line = _one_line_error(run_cli("inspect", tmp_path / "absent.onnx"), "absent.onnx")
    assert "ONNX" not in line
    line = _one_line_error(run_cli("metrics", tmp_path / "absent.onnx"), "absent.onnx")
    assert "ONNX" not in line


def test_a_torch_checkpoint_with_a_foreign_extension_still_loads(run_cli, tmp_path: Path) -> None:
    """The bytes decide: a torch.save file named .h5 is a checkpoint."""
    path = tmp_path / "model.h5"
    torch.save(torch.nn.Linear(2, 3).state_dict(), path)
    result = run_cli("inspect", path, "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["results"]["format"] == "state_dict"


# -- one score per row, one-hot labels ------------------------------------------------------


def _binary_nll(z: np.ndarray, y: np.ndarray) -> float:
    """Hand-worked: P(class 1) = σ(z); NLL = mean −log P(y)."""
    p1 = 1.0 / (1.0 + np.exp(-z))
    return float(np.mean(-np.log(np.where(y == 1, p1, 1.0 - p1))))


@pytest.mark.parametrize("suffix", [".npz", ".csv"])
def test_a_single_logit_column_is_a_binary_problem(run_cli, tmp_path: Path, suffix: str) -> None:
    z = np.array([2.0, -1.0, 0.5, -3.0, 1.5, -0.25])
    y = np.array([1, 0, 0, 0, 1, 1])
    path = tmp_path / f"binary{suffix}"
    if suffix == ".npz":
        np.savez(path, logits=z, labels=y)
    else:
        path.write_text(
            "logits,labels\n"
            + "".join(f"{float(a)!r},{int(b)}\n" for a, b in zip(z, y, strict=True))
        )
    result = run_cli("metrics", path, "--json")
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    metrics = report["results"]["evaluation"]["uncalibrated"]
    assert report["inputs"]["logits"]["n_classes"] == 2
    assert metrics["accuracy"] == pytest.approx(4 / 6)  # predicted 1 where z > 0
    assert metrics["nll"] == pytest.approx(_binary_nll(z, y), rel=1e-12)


def test_one_probability_per_row_is_that_of_class_one(tmp_path: Path) -> None:
    path = tmp_path / "p.npz"
    np.savez(path, probs=np.array([0.9, 0.2, 0.5]), labels=np.array([1, 0, 1]))
    loaded = load_logits(path, kind="probs", scores_key="probs")
    expected = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.5, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(loaded.scores, expected, rtol=0, atol=1e-15)
    np.savez(path, probs=np.array([0.9, 1.2]), labels=np.array([1, 0]))
    with pytest.raises(
        InputError, match=r"row 1 is 1\.2; one probability per row is read as that of class 1"
    ):
        load_logits(path, kind="probs", scores_key="probs")


def test_one_score_per_row_with_more_than_two_classes_says_why(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "l.npz"
    np.savez(path, logits=np.array([1.0, 2.0, 3.0]), labels=np.array([0, 1, 2]))
    _one_line_error(run_cli("metrics", path), "binary problem", "label 2 in row 2", "2-D (N, K)")


def test_one_hot_labels_are_their_class_indices(run_cli, tmp_path: Path) -> None:
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5], [0.1, 0.2, 3.0], [1.0, 0.0, 0.0]])
    classes = np.array([0, 2, 2, 1])
    np.savez(tmp_path / "hot.npz", logits=logits, labels=np.eye(3)[classes])
    np.savez(tmp_path / "int.npz", logits=logits, labels=classes)
    hot = json.loads(run_cli("metrics", tmp_path / "hot.npz", "--json").stdout)["results"]
    plain = json.loads(run_cli("metrics", tmp_path / "int.npz", "--json").stdout)["results"]
    assert hot == plain
    expected = -np.log(np.exp(logits[range(4), classes]) / np.exp(logits).sum(axis=1)).mean()
    assert hot["evaluation"]["uncalibrated"]["nll"] == pytest.approx(expected, rel=1e-12)


def test_one_hot_labels_of_a_dataset_too(run_cli, tmp_path: Path) -> None:
    from curvcal.assets import demo_checkpoint

    x = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(12) % 10
    torch.save({"x": x, "y": torch.nn.functional.one_hot(y, 10)}, tmp_path / "hot.pt")
    torch.save({"x": x, "y": y}, tmp_path / "int.pt")
    results = [
        json.loads(
            run_cli(
                "calibrate",
                demo_checkpoint(),
                "--data",
                tmp_path / name,
                "--method",
                "none",
                "--json",
            ).stdout
        )
        for name in ("hot.pt", "int.pt")
    ]
    assert results[0]["results"] == results[1]["results"]


def test_soft_labels_are_refused_with_the_row(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "soft.npz"
    labels = np.array([[1.0, 0.0], [0.7, 0.3], [0.0, 1.0]])
    np.savez(path, logits=np.zeros((3, 2)), labels=labels)
    _one_line_error(run_cli("metrics", path), f"{path}:", "row 1", "not one-hot", "shape (N,)")


# -- inspect: what a file needs and what it records --------------------------------------------


@pytest.fixture(scope="module")
def resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def test_inspect_names_the_allow_global_a_reference_checkpoint_needs(
    run_cli, tmp_path: Path, resnet
) -> None:
    """torchvision's reference train.py saves its argparse arguments beside the weights."""
    args = argparse.Namespace(model="resnet18", data_path="/data", batch_size=32, lr=0.1, epochs=90)
    path = tmp_path / "model_89.pth"
    torch.save({"model": resnet.state_dict(), "optimizer": {}, "epoch": 89, "args": args}, path)
    result = run_cli("inspect", path, "--json")
    assert result.code == 0, result.stderr
    info = json.loads(result.stdout)["results"]
    assert info["unsafe_globals"] == ["argparse.Namespace"]
    assert info["needs_allow_global"] == ["argparse.Namespace"] and not info["needs_trust"]
    assert info["recorded_arch"] == "model = 'resnet18'"
    assert info["suggested_arch"] == "tv:resnet18"
    table = run_cli("inspect", path).stdout
    assert "--allow-global argparse.Namespace" in table and "tv:resnet18" in table
    # what it suggests works
    allowed = run_cli("inspect", path, "--allow-global", "argparse.Namespace", "--json")
    assert json.loads(allowed.stdout)["results"]["state_dict_key"] == "model"


def test_a_pickled_function_still_needs_trust(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "fn.pt"
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "act": math.sqrt}, path)
    info = json.loads(run_cli("inspect", path, "--json").stdout)["results"]
    assert info["needs_trust"] and info["needs_allow_global"] == []


def test_inspect_counts_parameters_not_buffers_and_shows_the_lightning_prefix(
    run_cli, tmp_path: Path, resnet
) -> None:
    path = tmp_path / "epoch=3.ckpt"
    state = {f"net.{k}": v for k, v in resnet.state_dict().items()}
    torch.save(
        {"epoch": 3, "state_dict": state, "hyper_parameters": {"arch": "resnet18", "lr": 0.1}}, path
    )
    info = json.loads(run_cli("inspect", path, "--json").stdout)["results"]
    assert info["parameter_count"] == sum(p.numel() for p in resnet.parameters()) == 11_181_642
    assert info["buffer_count"] == sum(
        b.numel() for name, b in resnet.named_buffers() if b.is_floating_point()
    )
    assert info["detected_prefix"] == "net." and not info["prefix_is_wrapper"]
    assert info["suggested_arch"] == "tv:resnet18"
    table = run_cli("inspect", path).stdout
    assert "net. (shared by every key" in table and "11,181,642" in table
    # loading strips it: the suggested architecture takes the weights as they are
    from curvcal.load.checkpoint import load_model
    from curvcal.settings.checkpoint import CheckpointSettings

    loaded = load_model(path, CheckpointSettings(arch=info["suggested_arch"], device="cpu"))
    for name, tensor in resnet.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[name], tensor), name


def test_timms_recorded_arch_suggests_timm(run_cli, tmp_path: Path) -> None:
    """timm's train.py records the model name under a top-level "arch"."""
    import timm

    model = timm.create_model("resnet18", num_classes=3)
    path = tmp_path / "model_best.pth.tar"
    torch.save({"epoch": 1, "arch": "resnet18", "state_dict": model.state_dict()}, path)
    info = json.loads(run_cli("inspect", path, "--json").stdout)["results"]
    assert info["recorded_arch"] == "arch = 'resnet18'"
    assert info["suggested_arch"] == "timm:resnet18"


def test_a_weights_file_beside_a_config_suggests_hf(run_cli, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["BertForSequenceClassification"]}')
    path = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), path)
    info = json.loads(run_cli("inspect", path, "--json").stdout)["results"]
    assert info["suggested_arch"] == f"hf:{tmp_path}"
    assert "BertForSequenceClassification" in info["recorded_arch"]
