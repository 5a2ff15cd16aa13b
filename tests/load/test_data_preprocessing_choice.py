"""What load_dataset chooses on its own for image data is recorded (``chosen``), and a model
config whose input size differs from the images' is a warning, unless the size is given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from curvcal.errors import InputError
from curvcal.load.data import load_dataset
from curvcal.settings.data import NO_RESIZE, DataSettings

CONFIG = {"mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25), "input_size": (3, 24, 24),
          "crop_pct": 0.875, "source": "the test config"}  # fmt: skip


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        pixels = torch.randint(0, 256, (12, 10, 3), generator=generator, dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(tmp_path / label / "0.png")
    return tmp_path


def test_the_imagenet_default_is_recorded_and_warned_as_an_assumption(folder: Path) -> None:
    data = load_dataset(DataSettings(data=f"folder:{folder}"))
    (note,) = data.chosen
    assert note.startswith("normalisation mean 0.485,0.456,0.406, std 0.229,0.224,0.225")
    assert "imagenet preset" in note
    assert data.describe()["chosen_preprocessing"] == [note]
    (warning,) = data.warnings  # a convention assumed for images of unknown origin
    assert note in warning and "an assumption" in warning


def test_normalisation_from_the_model_or_the_user_is_no_assumption(folder: Path) -> None:
    from_model = load_dataset(DataSettings(data=f"folder:{folder}"), {"mean": (0.5,) * 3,
                              "std": (0.25,) * 3, "source": "the test config"})  # fmt: skip
    assert any("the test config" in note for note in from_model.chosen)
    given = load_dataset(DataSettings(data=f"folder:{folder}", mean=(0.5,), std=(0.25,)))
    assert from_model.warnings == () and given.warnings == () and given.chosen == ()


def test_a_config_transform_is_recorded_and_its_size_mismatch_warned(folder: Path) -> None:
    data = load_dataset(DataSettings(data=f"folder:{folder}"), CONFIG)
    assert data.dataset[0][0].shape == (3, 24, 24)
    assert any(note.startswith("resize 27, center-crop 24") for note in data.chosen)
    (warning,) = data.warnings
    assert "images are 12×10" in warning and "takes 24×24" in warning and "upscaled" in warning


def test_given_sizes_and_normalisation_choose_nothing(folder: Path) -> None:
    options = DataSettings(data=f"folder:{folder}", mean=(0.0,), std=(1.0,), resize=NO_RESIZE)
    data = load_dataset(options, CONFIG)
    assert data.chosen == () and data.warnings == ()
    image = data.dataset[0][0]
    assert image.shape == (3, 12, 10)  # as stored: no resize, no crop
    with Image.open(folder / "a" / "0.png") as picture:
        raw = torch.from_numpy(np.asarray(picture.convert("RGB"), dtype=np.float32))
    assert torch.allclose(image.permute(1, 2, 0), raw / 255)


def test_only_a_crop_given_keeps_the_config_transform_off(folder: Path) -> None:
    data = load_dataset(DataSettings(data=f"folder:{folder}", crop=8), CONFIG)
    assert data.dataset[0][0].shape == (3, 8, 8) and data.warnings == ()


def test_no_resize_is_still_refused_for_tensor_files(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"x": torch.zeros(2, 3), "y": torch.tensor([0, 1])}, path)
    with pytest.raises(InputError, match="--resize/--crop"):
        load_dataset(DataSettings(data=str(path), resize=NO_RESIZE))
