"""Ranks that agree or stop: two gloo ranks of ``curvcal hessian -o report.json`` on the CPU, each
started with its own command line (as torchrun would start them, but with nothing to make the
lines alike), one of them given another ``--seed``, another checkpoint of the same shape, or
other data of the same shape. Before, each of these was exit 0 and a report summing two
different models' products; now every rank stops with the same line naming rank 1 and what
differs, exit 2, and no report is written."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from curvcal.models import DigitsCNN

ROOT = Path(__file__).resolve().parents[2]
SAME = "(every rank must run the same command on the same checkpoint and data)"
ARCH_META = {
    "curvcal.arch": "curvcal:DigitsCNN",
    "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _model(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    state = {k: v.contiguous() for k, v in DigitsCNN(num_classes=3, width=1).state_dict().items()}
    save_file(state, str(path), ARCH_META)
    return path


def _images(path: Path, seed: int, n_samples: int = 12) -> Path:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n_samples, 1, 8, 8, generator=generator)
    torch.save({"x": x, "y": torch.arange(n_samples) % 3}, path)
    return path


def _two_ranks(
    folders: tuple[Path, Path], args: tuple[list[str], list[str]], importable: bool = False
) -> list[tuple[int, str]]:
    """Ranks 0 and 1 of a gloo group of two, rank r running ``curvcal hessian model.safetensors
    --data data.pt ARGS[r] -o report.json`` in ``folders[r]`` (on ``PYTHONPATH`` when
    ``importable``, for a ``py:`` architecture): each rank's exit code and stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "OMP_NUM_THREADS": "1",
           "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "CURVCAL_DIST_TIMEOUT": "120"}  # fmt: skip
    common = ["model.safetensors", "--data", "data.pt", "--device", "cpu", "--top-k", "1",
              "--max-iter", "5", "--probes", "4", "-o", "report.json"]  # fmt: skip
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "curvcal", "hessian", *common, *args[rank]],
            cwd=folders[rank],
            env={
                **env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                **(
                    {"PYTHONPATH": os.pathsep.join((str(ROOT), str(folders[rank])))}
                    if importable
                    else {}
                ),
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    try:
        for process in ranks:
            _, stderr = process.communicate(timeout=150)
            results.append((process.returncode, stderr))
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    return results


#: what rank 1 is given otherwise (its --seed, its checkpoint's or data's seed), and the line
CASES: dict[str, tuple[dict[str, int], str]] = {
    "--seed": ({"seed": 1}, "its settings: --seed 1 on rank 1, 0 on rank 0"),
    "checkpoint": ({"model": 1}, "its checkpoint: checkpoint sha256 "),
    "data": ({"data": 2}, "its data: files sha256 "),
}


@pytest.mark.slow
@pytest.mark.parametrize("differs", list(CASES))
def test_a_rank_that_differs_stops_every_rank_naming_it(tmp_path: Path, differs: str) -> None:
    """Each rank runs in its own folder, the files named alike (as on two machines): the
    command lines differ in --seed at most, so a checkpoint or data of other content is found
    by its digest, not its name."""
    other, said = CASES[differs]
    folders = (tmp_path / "rank0", tmp_path / "rank1")
    for folder in folders:
        folder.mkdir()
    _model(folders[0] / "model.safetensors", seed=0)
    _images(folders[0] / "data.pt", seed=1)
    for name in ("model.safetensors", "data.pt"):  # rank 1's files the same bytes
        shutil.copy(folders[0] / name, folders[1] / name)
    if "model" in other:
        _model(folders[1] / "model.safetensors", seed=other["model"])
    if "data" in other:
        _images(folders[1] / "data.pt", seed=other["data"])
    args = (["--seed", "0"], ["--seed", str(other.get("seed", 0))])
    (code0, err0), (code1, err1) = _two_ranks(folders, args)
    assert (code0, code1) == (2, 2), (err0, err1)
    for stderr in (err0, err1):  # every rank says the same one line
        lines = stderr.splitlines()
        assert len(lines) == 1, stderr
        line = lines[0]
        assert line.startswith(f"curvcal: error: rank 1: differs from rank 0 in {said}"), line
        assert line.endswith(SAME), line
    assert not any((folder / "report.json").exists() for folder in folders)


#: a ``py:`` architecture for :func:`_net_weights`, its hidden activation left open
NET_SOURCE = (
    "import torch\n\n"
    "class Net(torch.nn.Sequential):\n"
    "    def __init__(self):\n"
    "        super().__init__(torch.nn.Flatten(), torch.nn.Linear(64, 8), torch.nn.{}(),\n"
    "                         torch.nn.Linear(8, 3))\n"
)


def _net_weights(path: Path) -> Path:
    torch.manual_seed(0)
    layers = (
        torch.nn.Flatten(),
        torch.nn.Linear(64, 8),
        torch.nn.Identity(),
        torch.nn.Linear(8, 3),
    )
    state = torch.nn.Sequential(*layers).state_dict()  # the keys of NET_SOURCE's Net
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


@pytest.mark.slow  # two ranks of a real run: about 15 s
def test_ranks_that_build_other_models_around_the_same_weights_stop(tmp_path: Path) -> None:
    """The same checkpoint, data and command line, but each rank's ``py:`` architecture module
    (same name, on its own machine's path) builds another network: ReLU on rank 0, Tanh on
    rank 1. Before, the fingerprint held the checkpoint's digest only: exit 0 and a report
    summing the products of two different models. Now the files the model was built from are
    digested too, and both ranks stop naming rank 1."""
    folders = (tmp_path / "rank0", tmp_path / "rank1")
    for folder, activation in zip(folders, ("ReLU", "Tanh"), strict=True):
        folder.mkdir()
        (folder / "rank_net.py").write_text(NET_SOURCE.format(activation))
        _net_weights(folder / "model.safetensors")
        _images(folder / "data.pt", seed=1)
    arch = ["--arch", "py:rank_net:Net", "--trust-checkpoint"]
    (code0, err0), (code1, err1) = _two_ranks(folders, (arch, arch), importable=True)
    assert (code0, code1) == (2, 2), (err0, err1)
    for stderr in (err0, err1):
        (line,) = stderr.splitlines()
        assert line.startswith(
            "curvcal: error: rank 1: differs from rank 0 in its checkpoint: files it was built "
            "from sha256 "
        ), line
        assert line.endswith(SAME), line
    assert not any((folder / "report.json").exists() for folder in folders)


def test_the_files_a_model_is_built_from_are_in_its_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process: the fingerprint of a model built by a ``py:`` architecture digests the
    module's source (not the checkpoint a second time), so two sources differ and one agrees
    with itself."""
    from curvcal import inputs
    from curvcal.load.checkpoint import load_model
    from curvcal.pipeline.agreement import model_fingerprint
    from curvcal.settings.checkpoint import CheckpointSettings

    prints = []
    for activation in ("ReLU", "Tanh", "ReLU"):
        folder = tmp_path / f"{activation}{len(prints)}"
        folder.mkdir()
        (folder / "built_net.py").write_text(NET_SOURCE.format(activation))
        weights = _net_weights(folder / "model.safetensors")
        monkeypatch.syspath_prepend(str(folder))
        sys.modules.pop("built_net", None)
        settings = CheckpointSettings(device="cpu", arch="py:built_net:Net", trust_checkpoint=True)
        with inputs.recording(), inputs.opened_within() as opened:
            loaded = load_model(weights, settings)
        prints.append(model_fingerprint(loaded, opened))
    sys.modules.pop("built_net", None)
    (built_from,) = prints[0]["files it was built from sha256"]
    assert built_from == hashlib.sha256(NET_SOURCE.format("ReLU").encode()).hexdigest()
    assert prints[0]["checkpoint sha256"] == prints[1]["checkpoint sha256"]
    assert prints[0] != prints[1] and prints[0] == prints[2]


#: a ``py:`` data factory of 200 samples whose sample 5 (off the strided ones) is left open
DATA_SOURCE = (
    "import torch\n\n"
    "def make():\n"
    "    x = torch.zeros(200, 1, 8, 8)\n"
    "    x[5] = {}\n"
    "    return x, torch.arange(200) % 3\n"
)


def test_a_py_data_factory_s_source_is_in_the_data_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``py:`` factories whose data differ in sample 5 only: the strided samples (every
    4th of 200) and the labels agree, so before the fingerprints were equal and ranks given
    them were summed. The factory's source is digested now; an image folder's images (beneath
    the folder, covered by the samples' digest) are not digested a second time."""
    from curvcal import inputs
    from curvcal.load.datasets.image_folder import load_image_folder
    from curvcal.load.datasets.py_dataset import load_py_dataset
    from curvcal.pipeline.agreement import data_fingerprint
    from curvcal.settings.data import DataSettings

    prints = []
    for value in (0, 1):
        folder = tmp_path / str(value)
        folder.mkdir()
        (folder / "rank_data.py").write_text(DATA_SOURCE.format(value))
        monkeypatch.syspath_prepend(str(folder))
        sys.modules.pop("rank_data", None)
        settings = DataSettings(data="py:rank_data:make", trust_checkpoint=True)
        with inputs.recording(), inputs.opened_within() as opened:
            data = load_py_dataset(settings)
        prints.append(data_fingerprint(data, 2, opened))
    sys.modules.pop("rank_data", None)
    assert prints[0]["strided samples sha256"] == prints[1]["strided samples sha256"]
    assert prints[0]["other files read sha256"] != prints[1]["other files read sha256"]
    _image_folder(tmp_path / "images", 0)
    with inputs.recording(), inputs.opened_within() as opened:
        images = load_image_folder(DataSettings(data=f"folder:{tmp_path / 'images'}"), None)
    assert data_fingerprint(images, 2, opened)["other files read sha256"] == []


def test_fingerprints_name_what_differs() -> None:
    """One process: nothing is gathered. The data fingerprint digests the samples themselves,
    so other samples of the same labels differ."""
    from curvcal.distributed import agree
    from curvcal.load.datasets.loaded_data import loaded_data
    from curvcal.pipeline.agreement import data_fingerprint

    agree("settings", lambda: {"--seed": 0})  # one process: a no-op
    labels = torch.arange(6) % 3
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    one = data_fingerprint(loaded_data(torch.utils.data.TensorDataset(x, labels), "a", labels), 2)
    other_x = x.clone()
    other_x[-1, 0] += 1
    two = data_fingerprint(
        loaded_data(torch.utils.data.TensorDataset(other_x, labels), "a", labels), 2
    )
    assert one["labels sha256"] == two["labels sha256"]
    assert one["strided samples sha256"] != two["strided samples sha256"]
    assert one["samples"] == 6 and one["files sha256"] == []


def _image_folder(root: Path, seed: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.bmp")


def test_image_folders_of_other_pixels_differ(tmp_path: Path) -> None:
    """Two ``folder:`` sets of the same names and file sizes (BMPs of one shape) but other
    pixels. Before, the fingerprint held only the folder's digest (names and sizes) and the
    labels, so the two were alike and ranks reading them were summed together."""
    from curvcal.load.datasets.image_folder import load_image_folder
    from curvcal.pipeline.agreement import data_fingerprint
    from curvcal.settings.data import DataSettings

    prints = []
    for seed in (0, 1):
        _image_folder(tmp_path / str(seed), seed)
        spec = f"folder:{tmp_path / str(seed)}"
        prints.append(data_fingerprint(load_image_folder(DataSettings(data=spec), None), 2))
    assert prints[0]["files sha256"] == prints[1]["files sha256"]  # names and sizes alike
    assert prints[0]["labels sha256"] == prints[1]["labels sha256"]
    assert prints[0] != prints[1]
    assert prints[0]["strided samples sha256"] != prints[1]["strided samples sha256"]


def test_strided_samples_span_the_data() -> None:
    """Every ⌈N/64⌉-th sample and the last: the ends and a spread between, at most 65."""
    from curvcal.pipeline.agreement import strided_indices

    assert strided_indices(1) == [0]
    assert strided_indices(5) == [0, 1, 2, 3, 4]
    assert strided_indices(64) == list(range(64))
    assert strided_indices(65) == [0, 2, 4, *range(6, 65, 2)]  # stride 2 reaches 64
    assert strided_indices(66)[-2:] == [64, 65]  # stride 2 and the last
    big = strided_indices(1_000_003)
    assert big[0] == 0 and big[-1] == 1_000_002 and len(big) <= 65
    assert big[1] == 15_626  # ⌈1,000,003 / 64⌉


def test_library_versions_are_in_the_checkpoint_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks whose torch (or transformers, peft, ...) differ may build other models from
    the same files: the checkpoint fingerprint holds each imported library's version, so
    another version on one rank is a difference ``agree`` names."""
    from curvcal.load.checkpoint import load_model
    from curvcal.pipeline.agreement import model_fingerprint
    from curvcal.settings.checkpoint import CheckpointSettings

    loaded = load_model(_model(tmp_path / "m.pt", 0), CheckpointSettings(device="cpu"))
    before = model_fingerprint(loaded)
    assert before["torch version"] == torch.__version__
    assert before["python version"] == platform.python_version()
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    after = model_fingerprint(loaded)
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {"torch version"}
