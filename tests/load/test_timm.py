"""timm models: --arch timm:NAME over timm's checkpoint wrappers, timm folders saved by
save_for_hf, and the model's pretrained_cfg preprocessing for image data; numbers against
timm's own forward and transforms."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

timm = pytest.importorskip("timm")

from curvcal.errors import InputError  # noqa: E402
from curvcal.load.checkpoint import load_model  # noqa: E402
from curvcal.load.checkpoints.inspect import inspect_checkpoint  # noqa: E402
from curvcal.load.data import load_dataset  # noqa: E402
from curvcal.settings.checkpoint import CheckpointSettings  # noqa: E402
from curvcal.settings.data import DataSettings  # noqa: E402

NAME = "test_resnet"  # timm's own tiny test network


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    network = timm.create_model(NAME, num_classes=4)
    # a few training steps' worth of BatchNorm statistics, so eval mode differs from train mode
    network.train()
    with torch.no_grad():
        for _ in range(3):
            network(torch.randn(8, 3, 32, 32))
    return network.eval()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    path = tmp_path_factory.mktemp("timm_data") / "images.pt"
    x = torch.randn(7, 3, 32, 32)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    torch.save({"x": x, "y": y}, path)
    return path, x, y


def _train_checkpoint(model: torch.nn.Module, path: Path) -> Path:
    """What timm's train.py CheckpointSaver writes (less its argparse namespace): the model
    name under 'arch', weights under 'state_dict' (here DDP-prefixed) and EMA weights."""
    state = {f"module.{k}": v for k, v in model.state_dict().items()}
    torch.save(
        {
            "epoch": 9,
            "arch": NAME,
            "state_dict": state,
            "state_dict_ema": model.state_dict(),
            "optimizer": {"state": {}, "param_groups": []},
            "version": 2,
            "metric": 0.5,
        },
        path,
    )
    return path


def test_a_train_checkpoint_loads_with_arch_timm(model, tmp_path: Path) -> None:
    path = _train_checkpoint(model, tmp_path / "checkpoint-9.pth.tar")
    options = CheckpointSettings(arch=f"timm:{NAME}", arch_kwargs={"num_classes": 4}, device="cpu")
    loaded = load_model(path, options)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.module(x), model(x))
    assert loaded.state_dict_key == "state_dict" and loaded.stripped_prefix == "module."
    assert loaded.architecture == NAME and loaded.modality == "image"
    preprocessing = loaded.preprocessing
    assert preprocessing is not None and preprocessing["mean"] == model.pretrained_cfg["mean"]
    # num_classes inferred from the weights when not given
    inferred = load_model(path, CheckpointSettings(arch=f"timm:{NAME}", device="cpu"))
    assert inferred.num_classes == 4


def test_without_arch_the_error_names_the_recorded_timm_model(model, tmp_path: Path) -> None:
    path = _train_checkpoint(model, tmp_path / "checkpoint.pth.tar")
    with pytest.raises(InputError, match=f"--arch timm:{NAME}"):
        load_model(path, CheckpointSettings(device="cpu"))
    with pytest.raises(InputError, match="did you mean"):
        load_model(path, CheckpointSettings(arch="timm:test_resnett", device="cpu"))


def test_hessian_equals_the_dense_reference_of_timms_forward(
    run_cli, model, data, tmp_path
) -> None:
    path, x, y = data
    checkpoint = _train_checkpoint(model, tmp_path / "checkpoint.pth.tar")
    reference = timm.create_model(NAME, num_classes=4)
    reference.load_state_dict(model.state_dict())
    reference = reference.double().eval()
    names = ["fc.weight", "fc.bias"]
    fixed = {n: p.detach() for n, p in reference.named_parameters()}
    sizes = [fixed[n].numel() for n in names]

    def loss(vector: torch.Tensor) -> torch.Tensor:
        params = dict(fixed)
        for name, part in zip(names, vector.split(sizes), strict=True):
            params[name] = part.reshape(fixed[name].shape)
        logits = torch.func.functional_call(reference, params, (x.double(),))
        return torch.nn.functional.cross_entropy(logits, y)

    flat = torch.cat([fixed[n].reshape(-1) for n in names])
    exact = torch.linalg.eigvalsh(torch.func.hessian(loss)(flat))
    result = run_cli(
        "hessian", checkpoint, "--arch", f"timm:{NAME}", "-k", "num_classes=4", "--data", path,
        "--dtype", "float64", "--device", "cpu", "--params", "fc.*", "--tol", "1e-10",
        "--no-trace", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["results"]["lambda_max"] == pytest.approx(float(exact[-1]), rel=1e-6)
    assert document["inputs"]["checkpoint"]["architecture"] == NAME


@pytest.mark.parametrize("safe", [False, True], ids=["bin", "safetensors"])
def test_a_timm_folder_is_a_checkpoint(model, tmp_path: Path, safe: bool) -> None:
    from timm.models import save_for_hf

    folder = tmp_path / "timm_model"
    save_for_hf(model, str(folder), safe_serialization=safe)
    loaded = load_model(folder, CheckpointSettings(device="cpu"))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.module(x), model(x))
    assert loaded.form == "timm_folder" and loaded.architecture == NAME
    info = inspect_checkpoint(folder)
    assert info.format == "timm_folder" and info.architecture == NAME
    assert info.num_classes == 4
    # the parameters; BatchNorm's running statistics are counted as buffers
    assert info.parameter_count == sum(p.numel() for p in model.parameters())
    assert info.buffer_count == sum(b.numel() for b in model.buffers() if b.is_floating_point())


def test_pretrained_cfg_preprocessing_matches_timms_own_transform(model, tmp_path: Path) -> None:
    from PIL import Image

    root = tmp_path / "images"
    generator = torch.Generator().manual_seed(3)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for index in range(2):
            pixels = torch.randint(0, 256, (37, 53, 3), generator=generator, dtype=torch.uint8)
            Image.fromarray(pixels.numpy()).save(root / label / f"{index}.png")
    loaded = load_model(
        _train_checkpoint(model, tmp_path / "c.pth.tar"),
        CheckpointSettings(arch=f"timm:{NAME}", device="cpu"),
    )
    dataset = load_dataset(DataSettings(data=f"folder:{root}"), loaded.preprocessing)
    config = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**config)
    with Image.open(root / "a" / "0.png") as image:
        expected = transform(image.convert("RGB"))
    assert torch.allclose(dataset.dataset[0][0], expected, atol=1e-6)
    assert dataset.normalisation is not None and "timm" in dataset.normalisation["preset"]
    # the user's own values win
    given = load_dataset(
        DataSettings(data=f"folder:{root}", mean=(0.0,), std=(1.0,), resize=40, crop=32),
        loaded.preprocessing,
    )
    assert given.dataset[0][0].shape == (3, 32, 32)
    assert given.normalisation is not None and given.normalisation["mean"] == [0.0]
    assert given.normalisation["preset"].endswith("(overridden)")


def test_missing_timm_names_the_extra(run_cli, model, data, tmp_path, monkeypatch) -> None:
    path, _x, _y = data
    checkpoint = _train_checkpoint(model, tmp_path / "checkpoint.pth.tar")
    monkeypatch.setitem(sys.modules, "timm", None)
    result = run_cli(
        "hessian", checkpoint, "--arch", f"timm:{NAME}", "--data", path, "--device", "cpu"
    )
    assert result.code == 2
    line = result.stderr.strip().splitlines()[-1]
    assert f"--arch timm:{NAME}" in line and "pip install 'curvcal[timm]'" in line
