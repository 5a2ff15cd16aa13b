"""Dataset specs, checks, batching and stratified splits."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from curvcal.errors import InputError, TrustError
from curvcal.load.data import load_dataset
from curvcal.load.datasets.batches import iter_batches
from curvcal.load.datasets.labels import check_labels, stratified_split
from curvcal.load.datasets.preprocessing import NORMALISATION_PRESETS
from curvcal.settings.data import DataSettings


def _xy(n: int = 12, k: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(n * 2 * 2 * 2, dtype=torch.float32).reshape(n, 2, 2, 2) / 10
    y = torch.arange(n) % k
    return x, y


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    if path.suffix == ".npz":
        np.savez(path, **{k: v.numpy() for k, v in tensors.items()})
    elif path.suffix == ".safetensors":
        save_file(tensors, str(path))
    else:
        torch.save(tensors, path)
    return path


@pytest.mark.parametrize("suffix", [".pt", ".npz", ".safetensors"])
def test_tensor_files_round_trip(tmp_path: Path, suffix: str) -> None:
    x, y = _xy()
    path = _write(tmp_path / f"d{suffix}", {"x": x, "y": y})
    data = load_dataset(DataSettings(data=str(path)))
    assert data.n_samples == 12
    assert data.num_classes == 3 and data.num_classes_source == "inferred"
    assert data.labels.dtype == torch.int64
    assert torch.equal(data.labels, y)
    assert data.files == (path,)
    batches = list(iter_batches(data.dataset, 5))
    assert [len(b[1]) for b in batches] == [5, 5, 2]
    assert torch.equal(torch.cat([b[0] for b in batches]), x)
    assert torch.equal(torch.cat([b[1] for b in batches]), y)
    assert data.describe()["n_samples"] == 12


def test_key_overrides_and_missing_key(tmp_path: Path) -> None:
    x, y = _xy()
    path = _write(tmp_path / "d.pt", {"inputs": x, "targets": y})
    data = load_dataset(DataSettings(data=str(path), x_key="inputs", y_key="targets"))
    assert torch.equal(data.labels, y)
    with pytest.raises(InputError, match=r"d\.pt.*no tensor named 'x'.*--x-key"):
        load_dataset(DataSettings(data=str(path)))


def test_float_whole_labels_accepted_fractional_rejected(tmp_path: Path) -> None:
    x, y = _xy()
    good = _write(tmp_path / "good.npz", {"x": x, "y": y.double()})
    assert torch.equal(load_dataset(DataSettings(data=str(good))).labels, y)
    bad_y = y.double()
    bad_y[4] = 1.5
    bad = _write(tmp_path / "bad.npz", {"x": x, "y": bad_y})
    with pytest.raises(InputError, match=r"bad\.npz: label 4 is 1\.5"):
        load_dataset(DataSettings(data=str(bad)))


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"x": torch.zeros(0, 3), "y": torch.zeros(0, dtype=torch.int64)}, "no samples"),
        ({"x": torch.zeros(4, 3), "y": torch.tensor([0, -1, 0, 1])}, "label 1 is -1"),
        ({"x": torch.zeros(4, 3), "y": torch.tensor([0, 1, 0])}, "4 samples but y has 3"),
        (
            {"x": torch.tensor([[0.0], [float("nan")]]), "y": torch.tensor([0, 1])},
            "sample 1 of x has a NaN",
        ),
        ({"x": torch.zeros(2, 3, dtype=torch.uint8), "y": torch.tensor([0, 1])}, "floating"),
        ({"x": torch.zeros(2, 3), "y": torch.tensor([True, False])}, "integers"),
    ],
)
def test_bad_tensor_files(tmp_path: Path, tensors: dict[str, torch.Tensor], message: str) -> None:
    path = _write(tmp_path / "bad.safetensors", tensors)
    with pytest.raises(InputError, match=message) as info:
        load_dataset(DataSettings(data=str(path)))
    assert "bad.safetensors" in str(info.value)


def test_missing_unknown_and_truncated_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.pt: no such file"):
        load_dataset(DataSettings(data=str(tmp_path / "nope.pt")))
    (tmp_path / "d.csv").write_text("1,2\n")  # a CSV is text data: its header names columns
    with pytest.raises(InputError, match=r"d\.csv: has no column 'text' \(columns: 1, 2\)"):
        load_dataset(DataSettings(data=str(tmp_path / "d.csv")))
    (tmp_path / "d.tsv").write_text("1\t2\n")
    with pytest.raises(InputError, match=r"d\.tsv.*not a dataset spec"):
        load_dataset(DataSettings(data=str(tmp_path / "d.tsv")))
    x, y = _xy()
    for suffix in (".pt", ".npz", ".safetensors"):
        path = _write(tmp_path / f"t{suffix}", {"x": x, "y": y})
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(InputError, match=rf"t\{suffix}: cannot be read"):
            load_dataset(DataSettings(data=str(path)))


def test_pt_with_pickled_objects_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "obj.pt"
    torch.save({"x": torch.zeros(2, 1), "y": torch.tensor([0, 1]), "z": Path("a")}, path)
    with pytest.raises(InputError, match=r"obj\.pt: holds Python objects"):
        load_dataset(DataSettings(data=str(path)))


def test_mean_std_applied_to_tensor_file(tmp_path: Path) -> None:
    x, y = _xy()
    path = _write(tmp_path / "d.pt", {"x": x, "y": y})
    data = load_dataset(DataSettings(data=str(path), mean=(1.0, 2.0), std=(2.0, 4.0)))
    got = next(iter_batches(data.dataset, 100))[0]
    assert torch.allclose(got[:, 0], (x[:, 0] - 1) / 2)
    assert torch.allclose(got[:, 1], (x[:, 1] - 2) / 4)
    with pytest.raises(InputError, match="--mean/--std"):
        load_dataset(DataSettings(data=str(path), mean=(1.0, 2.0, 3.0)))
    with pytest.raises(InputError, match="--resize"):
        load_dataset(DataSettings(data=str(path), resize=4))


def test_max_samples_subset_is_deterministic_and_sorted(tmp_path: Path) -> None:
    x, y = _xy(n=50, k=5)
    path = _write(tmp_path / "d.pt", {"x": x, "y": y})
    options = DataSettings(data=str(path), max_samples=10, subset_seed=3)
    first, second = load_dataset(options), load_dataset(options)
    other = load_dataset(replace(options, subset_seed=4))
    assert first.n_samples == 10
    xs, ys = next(iter_batches(first.dataset, 100))
    assert torch.equal(ys, first.labels)
    assert torch.equal(next(iter_batches(second.dataset, 100))[0], xs)
    assert not torch.equal(next(iter_batches(other.dataset, 100))[0], xs)
    # rows of x are unique, so recover the indices and check they ascend
    rows = [int(torch.nonzero((x == xi).all(dim=(1, 2, 3)))[0, 0]) for xi in xs]
    assert rows == sorted(rows) and len(set(rows)) == 10
    assert first.describe()["subset"] == {"max_samples": 10, "subset_seed": 3, "of": 50}
    everything = load_dataset(replace(options, max_samples=500))
    assert everything.n_samples == 50


def _png_folder(root: Path) -> Path:
    from PIL import Image

    for label, colour in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        (root / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (6, 5), colour).save(root / label / f"{i}.png")
    return root


def test_folder_dataset(tmp_path: Path) -> None:
    root = _png_folder(tmp_path / "imgs")
    data = load_dataset(DataSettings(data=f"folder:{root}", resize=4, crop=4))
    assert data.n_samples == 6 and data.num_classes == 2
    assert data.num_classes_source == "dataset"
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert data.files == (root,)  # the folder: its digest covers every image's name and size
    x, y = next(iter_batches(data.dataset, 6))
    assert x.shape == (6, 3, 4, 4) and y.tolist() == [0, 0, 0, 1, 1, 1]
    mean, std = NORMALISATION_PRESETS["imagenet"]
    # a pure red image: channel 0 is 1.0 before normalisation, the others 0.0
    assert torch.allclose(x[0, 0], torch.full((4, 4), (1.0 - mean[0]) / std[0]))
    assert torch.allclose(x[0, 2], torch.full((4, 4), (0.0 - mean[2]) / std[2]))
    assert data.describe()["normalisation"]["preset"] == "imagenet"
    given = load_dataset(DataSettings(data=f"folder:{root}", mean=(0.5,), std=(0.5,)))
    assert torch.allclose(next(iter_batches(given.dataset, 1))[0][0, 0], torch.ones(5, 6))
    check_labels(data, 2)
    with pytest.raises(InputError, match="2 classes but the model has 10 outputs"):
        check_labels(data, 10)


def test_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is not a folder"):
        load_dataset(DataSettings(data=f"folder:{tmp_path / 'absent'}"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="is not an image folder"):
        load_dataset(DataSettings(data=f"folder:{tmp_path / 'empty'}"))


def test_folder_images_of_two_sizes_name_the_image_and_the_fix(tmp_path: Path) -> None:
    """Without --resize a batch of images of different sizes cannot be stacked: one error naming
    the image that differs and the options that give them one size; with them, it loads."""
    from PIL import Image

    root = _png_folder(tmp_path / "imgs")
    odd = root / "dog" / "1.png"
    Image.new("RGB", (12, 10), (0, 0, 255)).save(odd)
    data = load_dataset(DataSettings(data=f"folder:{root}"))
    with pytest.raises(InputError, match="--resize") as info:
        list(iter_batches(data.dataset, 6))
    message = str(info.value)
    assert str(odd) in message and "3×10×12" in message and "3×5×6" in message
    resized = load_dataset(DataSettings(data=f"folder:{root}", resize=4, crop=4))
    assert next(iter_batches(resized.dataset, 6))[0].shape == (6, 3, 4, 4)


@pytest.mark.parametrize("content", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n\x00\x00"])
def test_an_unreadable_image_names_its_file(tmp_path: Path, content: bytes) -> None:
    root = _png_folder(tmp_path / "imgs")
    bad = root / "cat" / "1.png"
    bad.write_bytes(content)
    data = load_dataset(DataSettings(data=f"folder:{root}"))
    assert data.dataset[0][1] == 0  # the readable ones still load
    with pytest.raises(InputError, match="cannot be read as an image") as info:
        list(iter_batches(data.dataset, 6))
    assert str(info.value).startswith(str(bad))


def test_tensor_samples_of_two_shapes_name_the_sample() -> None:
    class Ragged(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            return torch.zeros(2 if index < 2 else 3), 0

    with pytest.raises(InputError, match="sample 2 has shape 3, sample 0 2") as info:
        list(iter_batches(Ragged(), 3))
    assert "--resize" not in str(info.value)
    assert next(iter_batches(Ragged(), 2))[0].shape == (2, 2)


def test_torchvision_missing_root_says_download(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--download") as info:
        load_dataset(DataSettings(data="tv:mnist", data_root=tmp_path / "nothing"))
    assert "nothing" in str(info.value)
    with pytest.raises(InputError, match="not a known torchvision dataset"):
        load_dataset(DataSettings(data="tv:imagenet22k"))
    with pytest.raises(InputError, match="unknown split"):
        load_dataset(DataSettings(data="tv:cifar10:val", data_root=tmp_path))


FACTORY = """
import torch

def pairs():
    return torch.ones(5, 2), torch.tensor([0, 1, 2, 1, 0])

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.full((2,), float(i)), i % 2

def items():
    return Items()

def nothing():
    return 42
"""


def test_py_factory_needs_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_factory_mod.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_factory_mod", raising=False)
    spec = "py:my_factory_mod:pairs"
    with pytest.raises(TrustError, match="--trust-checkpoint"):
        load_dataset(DataSettings(data=spec))
    data = load_dataset(DataSettings(data=spec, trust_checkpoint=True))
    assert data.n_samples == 5 and data.labels.tolist() == [0, 1, 2, 1, 0]
    items = load_dataset(DataSettings(data="py:my_factory_mod:items", trust_checkpoint=True))
    assert items.labels.tolist() == [0, 1, 0, 1]
    x, y = next(iter_batches(items.dataset, 3, indices=[3, 0, 2]))
    assert y.tolist() == [1, 0, 0] and x[:, 0].tolist() == [3.0, 0.0, 2.0]
    with pytest.raises(InputError, match="returned a int"):
        load_dataset(DataSettings(data="py:my_factory_mod:nothing", trust_checkpoint=True))
    with pytest.raises(InputError, match="cannot import"):
        load_dataset(DataSettings(data="py:no_such_module_xyz:f", trust_checkpoint=True))


def test_check_labels_range(tmp_path: Path) -> None:
    x, y = _xy(k=5)
    data = load_dataset(DataSettings(data=str(_write(tmp_path / "d.pt", {"x": x, "y": y}))))
    check_labels(data, 5)
    check_labels(data, 7)  # inferred class count: a model may know classes absent here
    check_labels(data, None)
    with pytest.raises(InputError, match=r"d\.pt.*label 4 .*out of range.*\[0, 4\)"):
        check_labels(data, 4)


def test_bundled_digits() -> None:
    data = load_dataset(DataSettings(data="curvcal:digits"))
    assert data.num_classes == 10 and data.num_classes_source == "dataset"
    x, _ = next(iter_batches(data.dataset, 4))
    assert x.shape == (4, 1, 8, 8) and x.dtype == torch.float32
    with pytest.raises(InputError, match="not a bundled dataset"):
        load_dataset(DataSettings(data="curvcal:cifar"))


def test_iter_batches_bad_size() -> None:
    x, y = _xy()
    from curvcal.load.datasets.tensor_dataset import TensorPairDataset

    with pytest.raises(InputError, match="--batch-size"):
        list(iter_batches(TensorPairDataset(x, y), 0))


# --- stratified_split -------------------------------------------------------------------------


def test_split_proportions_disjoint_deterministic() -> None:
    labels = torch.tensor([0] * 40 + [1] * 20 + [2] * 10)
    fit, held = stratified_split(labels, 0.3, seed=1)
    # 0.3 of 40, 20 and 10 are whole numbers: exactly 12, 6 and 3
    assert torch.bincount(labels[fit]).tolist() == [12, 6, 3]
    assert torch.bincount(labels[held]).tolist() == [28, 14, 7]
    assert set(fit.tolist()).isdisjoint(held.tolist())
    assert sorted(fit.tolist() + held.tolist()) == list(range(70))
    assert fit.tolist() == sorted(fit.tolist())
    again = stratified_split(labels, 0.3, seed=1)
    assert torch.equal(again[0], fit) and torch.equal(again[1], held)
    assert not torch.equal(stratified_split(labels, 0.3, seed=2)[0], fit)


def test_split_largest_remainders() -> None:
    # quotas 0.5*3 = 1.5, 0.5*3 = 1.5, 0.5*1 = 0.5; n_fit = round(3.5) = 4 (banker's: 4)
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    fit, held = stratified_split(labels, 0.5, seed=0)
    counts = torch.bincount(labels[fit], minlength=3).tolist()
    # floors 1, 1, 0; two extra go to the largest remainders, ties to the lower class
    assert counts == [2, 2, 0]
    assert len(held) == 3


def test_split_borders() -> None:
    labels = torch.tensor([0, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    # a fraction that rounds to zero samples still gives one sample to fit
    fit, held = stratified_split(labels, 0.01, seed=0)
    assert len(fit) == 1 and len(held) == 9
    # and one that rounds to all still leaves one to evaluate on
    fit, held = stratified_split(labels, 0.99, seed=0)
    assert len(fit) == 9 and len(held) == 1
    with pytest.raises(InputError, match="between 0 and 1"):
        stratified_split(labels, 1.0, seed=0)
    with pytest.raises(InputError, match="between 0 and 1"):
        stratified_split(labels, 0.0, seed=0)
    with pytest.raises(InputError, match=r"one\.pt has 1 sample") as info:
        stratified_split(torch.tensor([3]), 0.5, seed=0, source="one.pt")
    assert info.value.what == "--val-split"


def _fake_mnist(root: Path, n: int = 5) -> torch.Tensor:
    """Write a tiny MNIST test split in the IDX format torchvision reads (no download)."""
    import struct

    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images = (torch.arange(n * 28 * 28) % 256).to(torch.uint8).reshape(n, 28, 28)
    labels = torch.tensor([3, 1, 4, 1, 5][:n], dtype=torch.uint8)
    for prefix in ("t10k", "train"):  # torchvision wants both splits present
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 0x803, n, 28, 28) + images.numpy().tobytes()
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 0x801, n) + labels.numpy().tobytes()
        )
    return images


def test_torchvision_dataset_present(tmp_path: Path) -> None:
    images = _fake_mnist(tmp_path)
    data = load_dataset(DataSettings(data="tv:mnist", data_root=tmp_path))
    assert data.n_samples == 5 and data.num_classes == 10
    assert data.labels.tolist() == [3, 1, 4, 1, 5]
    x, y = next(iter_batches(data.dataset, 8))
    assert x.shape == (5, 1, 28, 28) and y.tolist() == [3, 1, 4, 1, 5]
    (mean,), (std,) = NORMALISATION_PRESETS["mnist"]
    assert torch.allclose(x[:, 0], (images.float() / 255 - mean) / std, atol=1e-6)
    assert data.describe()["normalisation"] == {"preset": "mnist", "mean": [mean], "std": [std]}
    with pytest.raises(InputError, match="3 values but --data tv:mnist has 1 channels"):
        load_dataset(DataSettings(data="tv:mnist", data_root=tmp_path, mean=(0.1, 0.2, 0.3)))
    # a damaged file is reported with the reason, not as "not found"
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x09\x01")
    with pytest.raises(InputError, match="cannot be read under --data-root"):
        load_dataset(DataSettings(data="tv:mnist", data_root=tmp_path))
