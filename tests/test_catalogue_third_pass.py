"""Holes a third adversarial pass found on the surfaces the first two did not reach, each fixed
where every part goes through it:

- image folders (``--data folder:PATH``): torchvision walks the class folders following
  symbolic links and remembers nothing, so a link to a folder above (``a/up -> ..``) listed
  every image again under the link's class, until the path was too long (9 images read as
  369 samples, ``b``'s and ``c``'s counted as ``a``, exit 0), and two such links made the walk
  grow as 2^depth (still listing after 60 s). A folder linked twice, or one image under two
  names, counted those images twice. The loader now walks the folder first remembering each
  folder and image by device and inode, and refuses the first one reached again, exit 2
  naming the link;
- ``py:`` factories (``--data py:mod:fn``, ``--arch py:mod:Class``) run the user's code, and
  what that code raised was curvcal's "internal error ... please report it", exit 70: the
  factory's call (``ValueError``), the Dataset's ``__getitem__`` (``KeyError``,
  ``ZeroDivisionError``), its ``__len__``, a label ``"cat"`` or an ``x`` of strings
  (``TypeError`` from torch), ``classes = 5``; an architecture whose constructor or forward
  raised anything but four builtin errors (a ``KeyError``). A Dataset whose ``targets`` held 5
  labels for 12 samples, or labels other than its items', was measured, exit 0 (the split
  read the targets, the metrics the items). A ``py:`` Dataset is now read through one wrapper
  that turns what its code raises into one line naming ``--data`` and the sample, exit 2, and
  checks each item against its targets; the architecture's build and first forward say what
  the model's code raised the same way;
- an ``.npz`` of data or scores holding an array of Python objects was refused as "cannot be
  read as a .npz file (Object arrays cannot be loaded when allow_pickle=False) (is it
  truncated?)", blaming a whole file for one array: the check of the archive's members now
  names the array and says why;
- a model folder whose file is a symbolic link to a file kept elsewhere (a shard, or what a
  Hugging Face cache's snapshot folder holds: links into its ``blobs``): ``calibrate FOLDER -o
  TARGET --force`` wrote the JSON report over the shard the model was read from, exit 0. Only
  the folder was recorded, and the target lies outside it. The input record now counts what
  the links beneath an input folder point to as part of it, for every output. (A hard link in
  an input folder to a file the run never opens is no such way in: an output replaces its own
  name with a new file, and the folder's name keeps the old file, shown here too.);
- a sharded model's ``model.safetensors.index.json``: two shards holding one tensor (the map
  naming one of them) loaded whichever transformers read last, exit 0 (NLL 1.1032 where the
  map's weights give 1.1036); the index's shards' headers are now read first and a tensor
  held twice is refused, naming both shards. A map naming ``../x.safetensors`` or an absolute
  path was refused as "a missing shard" though the file was there: it now says the name is
  not a file name in the index's folder;
- a torch.export archive (``.pt2``) with one entry outside its folder, loaded with
  ``--trust-checkpoint``: torch logged its traceback on stderr (a dozen ``W...`` lines before
  curvcal's error line), then raised "please check the warnings above", which the error line
  quoted. Its records are now held while the archive loads and the cause they carry is the
  error's reason, on one line;
- ``device=`` from Python on a machine without CUDA: ``curvcal.hessian_eigenvalues(model,
  data, device="cuda")`` (and ``hessian_trace``, ``hessian_operator``) said "the model's
  parameters are on cpu, not cuda (move the model...)", which no move could satisfy, and
  ``device="bogus"`` was torch's ``RuntimeError``; ``curvcal.fit_map("ts", ..., device="cuda")``
  was torch's "Found no NVIDIA driver" ``RuntimeError``. ``--device`` had one rule of its own
  (CUDA absent: one line, exit 2); that rule now lives in one function (``curvcal.devices``)
  that ``--device``, the operator's ``device`` and ``fit_map``'s ``device`` all go through;
- an image folder holding a decompression bomb: a 49 KB PNG of 20,000² pixels was PIL's
  ``DecompressionBombError``, "internal error", exit 70; one of 10,000² (12 KB) printed PIL's
  ``DecompressionBombWarning`` raw, then decoded to 1.2 GB of float32 pixels (3.9 GB resident).
  Both are now refused, naming the file, exit 2, before the image is decoded;
- a checkpoint whose weight holds a NaN (a training run that diverged) was measured until its
  logits were NaN, then exit 3 blaming the data ("--data d.pt: the model's logits are NaN or
  Inf ... check the weights and inputs"); a float32 weight of 1e6 read with ``--dtype float16``
  became infinite in the cast, the same way. Every loaded model goes through one place
  (``loaded_model.place``), which now refuses a parameter holding a NaN or an infinity, exit 2,
  naming the file (or ``--dtype`` for float16's overflow) and the parameter;
- a Lightning checkpoint whose ``hyper_parameters`` record ``arch`` as a 200,000-character
  string: ``inspect`` showed it whole as the "recorded model" (thousands of table lines); a
  recorded model name is now at most 200 characters, else none is shown;
- a policy saved with a UTF-8 byte-order mark (Windows Notepad's) was "not valid TOML: Invalid
  statement (at line 1, column 1)", and a report so saved "Unexpected UTF-8 BOM"; the one
  reader of policy and report text now drops the mark (as the CSV readers already did).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from console_text import said, shown

from curvcal.errors import InputError
from curvcal.load.datasets.loaded_data import LoadedData


def _images(root: Path, classes: tuple[str, ...] = ("a", "b"), per_class: int = 2) -> Path:
    from PIL import Image

    for number, label in enumerate(classes):
        (root / label).mkdir(parents=True)
        for index in range(per_class):
            Image.new("RGB", (5, 5), (40 * number, 10 * index, 0)).save(
                root / label / f"{index}.png"
            )
    return root


def _load(root: Path) -> LoadedData:
    from curvcal.load.data import load_dataset
    from curvcal.settings.data import DataSettings

    return load_dataset(DataSettings(data=f"folder:{root}", resize=4, crop=4))


@pytest.mark.parametrize(
    ("link", "target", "again"),
    [
        ("a/up", "..", "."),  # a loop: every image again, under class a
        ("a/bb", "../b", "b"),  # b's images counted under a as well
    ],
)
def test_an_image_folder_reaching_a_folder_twice_is_refused(
    tmp_path: Path, link: str, target: str, again: str
) -> None:
    root = _images(tmp_path / "img")
    os.symlink(target, root / link)
    with pytest.raises(InputError) as caught:
        _load(root)
    assert caught.value.what == str(root / link)
    assert f"is the folder {os.path.normpath(root / again)} again" in caught.value.why
    assert caught.value.exit_code == 2


def test_two_loops_in_an_image_folder_are_refused_before_the_walk_runs_away(
    tmp_path: Path,
) -> None:
    """Before: two links to the folder above made torchvision's walk grow as 2^depth (still
    running after 60 s); each is now one look-up."""
    root = _images(tmp_path / "img")
    os.symlink("..", root / "a" / "u1")
    os.symlink("..", root / "a" / "u2")
    with pytest.raises(InputError) as caught:
        _load(root)
    assert caught.value.what == str(root / "a" / "u1")


def test_one_image_under_two_names_is_refused(tmp_path: Path) -> None:
    root = _images(tmp_path / "img")
    os.link(root / "b" / "0.png", root / "a" / "9.png")
    with pytest.raises(InputError) as caught:
        _load(root)
    assert caught.value.what == str(root / "b" / "0.png")
    assert f"is the image {root / 'a' / '9.png'} again" in caught.value.why


def test_an_image_folder_linking_outside_itself_once_is_read(tmp_path: Path) -> None:
    """A class folder that is a link to images kept elsewhere, reached once, is a dataset."""
    pool = _images(tmp_path / "pool", classes=("c",), per_class=3)
    root = _images(tmp_path / "img", classes=("a",))
    os.symlink(pool / "c", root / "c")
    data = _load(root)
    assert len(data.dataset) == 5
    assert sorted(int(label) for label in data.labels) == [0, 0, 1, 1, 1]


# ---------------------------------------------------------------------------------------------
# py: factories: what the user's code raises is the data's (or the model's) error, exit 2

FACTORIES = """
import torch
from torch.utils.data import Dataset

X = torch.randn(6, 1, 8, 8)
Y = torch.arange(6) % 3


class Items(Dataset):
    def __init__(self, item=None, length=6, **attributes):
        self.item, self.length = item, length
        self.__dict__.update(attributes)

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return self.item(index) if self.item else (X[index], int(Y[index]))


def raises():
    raise ValueError("no data today")


def item_raises():
    return Items(item=lambda index: {}["x"])


def length_raises():
    return Items(length=-1)


def label_is_text():
    return Items(item=lambda index: (X[index], "cat"))


def x_is_text():
    return Items(item=lambda index: ("hello", 0))


def classes_is_a_number():
    return Items(classes=5)


def too_few_targets():
    return Items(targets=Y[:5])


def other_targets():
    return Items(targets=(Y + 1) % 3)


def right_targets():
    return Items(targets=Y)


class ForwardRaises(torch.nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.fc = torch.nn.Linear(4, num_classes)

    def forward(self, x):
        return {}["x"]


class Linear4(torch.nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.fc = torch.nn.Linear(4, num_classes)

    def forward(self, x):
        return self.fc(x)


class ModelRaises(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        {}["width"]
"""


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    import sys

    (tmp_path / "user_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_factories", raising=False)
    return "user_factories"


def _read_all(spec: str) -> None:
    from curvcal.load.data import load_dataset
    from curvcal.load.datasets.batches import iter_batches
    from curvcal.settings.data import DataSettings

    data = load_dataset(DataSettings(data=spec, trust_checkpoint=True))
    list(iter_batches(data.dataset, 4))


@pytest.mark.parametrize(
    ("factory", "why"),
    [
        ("raises", "calling raises() failed: ValueError: no data today"),
        ("item_raises", "reading sample 0 failed: KeyError: 'x'"),
        ("length_raises", "asking its length failed: ValueError: __len__() should return >= 0"),
        ("label_is_text", "sample 0 has label 'cat', not one integer class"),
        ("x_is_text", "reading x of sample 0 failed: TypeError:"),
        ("classes_is_a_number", "its classes attribute is of type int, not a list of class"),
        ("too_few_targets", "has 6 samples but 5 targets (labels)"),
        ("other_targets", "sample 0 has label 0 but its targets say 1"),
    ],
)
def test_what_a_py_dataset_raises_or_misstates_is_the_data_s_error(
    factories: str, factory: str, why: str
) -> None:
    spec = f"py:{factories}:{factory}"
    with pytest.raises(InputError) as caught:
        _read_all(spec)
    assert caught.value.what == f"--data {spec}"
    assert caught.value.why.startswith(why), caught.value.why
    assert caught.value.exit_code == 2


def test_a_py_dataset_whose_targets_are_its_items_labels_is_read(factories: str) -> None:
    _read_all(f"py:{factories}:right_targets")


def test_an_architecture_whose_code_raises_is_the_architecture_s_error(factories: str) -> None:
    from curvcal.load.models.architecture import build_architecture

    with pytest.raises(InputError) as caught:
        build_architecture(f"py:{factories}:ModelRaises", {}, trust=True)
    assert caught.value.what == "--arch"
    assert caught.value.why == f"building py:{factories}:ModelRaises failed: KeyError: 'width'"


def test_a_model_whose_forward_raises_is_named_with_the_data(
    run_cli, factories: str, tmp_path: Path
) -> None:
    """Before: ``internal error: KeyError: 'x'``, exit 70."""
    import torch
    from safetensors.torch import save_file

    weights = {"fc.weight": torch.zeros(3, 4), "fc.bias": torch.zeros(3)}
    save_file(weights, str(tmp_path / "m.safetensors"))
    torch.save({"x": torch.randn(6, 4), "y": torch.arange(6) % 3}, tmp_path / "d.pt")
    result = run_cli(
        "calibrate", tmp_path / "m.safetensors", "--arch", f"py:{factories}:ForwardRaises",
        "--trust-checkpoint", "--data", tmp_path / "d.pt",
    )  # fmt: skip
    assert result.code == 2, result.stderr
    assert said("the model cannot run on inputs of shape (4,): KeyError: 'x'", result.stderr)
    assert result.stderr.count("\n") == 1


def test_an_npz_array_of_python_objects_is_named(run_cli, tmp_path: Path) -> None:
    import numpy as np

    scores = np.zeros((4, 3))
    np.savez(tmp_path / "s.npz", logits=scores, labels=np.array(["a", 1, 2, 0], dtype=object))
    result = run_cli("metrics", tmp_path / "s.npz")
    assert result.code == 2, result.stderr
    assert said("array 'labels' holds Python objects (dtype object)", result.stderr)
    assert "truncated" not in result.stderr and result.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# what a link inside an input folder points to is an input too


@pytest.fixture(scope="module")
def sharded_vit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny ViT classifier saved in four shards, and 6 images for it."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    folder = tmp_path_factory.mktemp("vit")
    config = ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=8, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=8, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    ViTForImageClassification(config).save_pretrained(folder / "vit", max_shard_size="1KB")
    data = folder / "d.pt"
    torch.save({"x": torch.randn(6, 3, 8, 8), "y": torch.arange(6) % 3}, data)
    return folder / "vit", data


@pytest.fixture
def vit_copy(sharded_vit: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the sharded ViT folder in this test's own folder (``m``), and its data."""
    import shutil

    source, data = sharded_vit
    folder = tmp_path / "m"
    shutil.copytree(source, folder)
    return folder, data


def test_a_file_a_model_folder_links_to_is_never_overwritten(
    run_cli, vit_copy: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = vit_copy
    shard = sorted(folder.glob("model-0*.safetensors"))[0]
    kept = tmp_path / "blobs" / "shard.bin"
    kept.parent.mkdir()
    shard.rename(kept)
    shard.symlink_to(kept)
    before = kept.read_bytes()
    result = run_cli("calibrate", folder, "--data", data, "-o", kept, "--force")
    assert result.code == 2, result.stderr
    assert said(f"is what {shown(folder / shard.name)} links to", result.stderr)
    assert result.stderr.count("\n") == 1
    assert kept.read_bytes() == before


def test_a_hard_link_in_an_input_folder_keeps_its_file_when_an_output_takes_its_other_name(
    run_cli, vit_copy: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = vit_copy
    (folder / "notes.txt").write_text("kept")
    os.link(folder / "notes.txt", tmp_path / "out.json")
    result = run_cli("calibrate", folder, "--data", data, "--method", "ts", "-o",
                     tmp_path / "out.json", "--force")  # fmt: skip
    assert result.code == 0, result.stderr
    assert (folder / "notes.txt").read_text() == "kept"
    assert (tmp_path / "out.json").read_text().startswith("{")


def _sharded_copy(source: Path, folder: Path) -> tuple[Path, dict, list[Path]]:
    import json
    import shutil

    shutil.copytree(source, folder)
    index = folder / "model.safetensors.index.json"
    shards = [
        folder / name
        for name in dict.fromkeys(json.loads(index.read_text())["weight_map"].values())
    ]
    return index, json.loads(index.read_text()), shards


def test_a_tensor_held_by_two_shards_is_refused(
    run_cli, sharded_vit: tuple[Path, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    source, data = sharded_vit
    index, _content, shards = _sharded_copy(source, tmp_path / "m")
    first, second = load_file(str(shards[0])), load_file(str(shards[1]))
    name = next(iter(first))
    second[name] = first[name] + 1.0
    save_file(second, str(shards[1]), {"format": "pt"})
    result = run_cli("calibrate", tmp_path / "m", "--data", data, "--method", "ts")
    assert result.code == 2, result.stderr
    assert said(f"{shown(index, ':')} its shards {shards[0].name} and {shards[1].name} both "
                f"hold tensor '{name}'", result.stderr)  # fmt: skip


@pytest.mark.parametrize("where", ["../outside.safetensors", "ABSOLUTE"])
def test_a_shard_named_outside_the_index_folder_is_said_so(
    run_cli, sharded_vit: tuple[Path, Path], tmp_path: Path, where: str
) -> None:
    import json
    import shutil

    source, data = sharded_vit
    index, content, shards = _sharded_copy(source, tmp_path / "m")
    outside = tmp_path / "outside.safetensors"
    shutil.copy(shards[0], outside)
    name = str(outside) if where == "ABSOLUTE" else where
    content["weight_map"] = {k: (name if v == shards[0].name else v)
                             for k, v in content["weight_map"].items()}  # fmt: skip
    index.write_text(json.dumps(content))
    result = run_cli("calibrate", tmp_path / "m", "--data", data, "--method", "ts")
    assert result.code == 2, result.stderr
    assert said("that is not a file name in its folder", result.stderr), result.stderr
    assert "missing" not in result.stderr


def test_a_torch_export_archive_that_cannot_load_says_why_on_one_line(
    run_cli, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import zipfile

    import torch

    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
    program = torch.export.export(module, (torch.randn(2, 4),))
    archive = tmp_path / "m.pt2"
    torch.export.save(program, archive)
    with zipfile.ZipFile(archive, "a") as extended:
        extended.writestr("extra/notes.txt", "an entry outside the archive's folder")
    torch.save({"x": torch.randn(6, 4), "y": torch.arange(6) % 3}, tmp_path / "d.pt")
    capfd.readouterr()
    result = run_cli("calibrate", archive, "--data", tmp_path / "d.pt", "--trust-checkpoint")
    leaked = capfd.readouterr().err  # what reached the process's stderr, past the CLI's stream
    assert result.code == 2, result.stderr
    assert said("cannot load exported program:", result.stderr)
    assert said("is not in a subdirectory", result.stderr), result.stderr
    assert "warnings above" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in leaked and "deserializing" not in leaked, leaked


# ---------------------------------------------------------------------------------------------
# device= from Python: one rule with --device's


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("call", ["eigenvalues", "trace", "operator"])
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_device_without_cuda_is_said_so_from_python(
    no_cuda: None, call: str, device: str
) -> None:
    import torch

    import curvcal

    model = torch.nn.Linear(4, 3)
    data = (torch.randn(8, 4), torch.arange(8) % 3)
    function = {"eigenvalues": curvcal.hessian_eigenvalues, "trace": curvcal.hessian_trace,
                "operator": curvcal.hessian_operator}[call]  # fmt: skip
    with pytest.raises(InputError) as caught:
        function(model, data, device=device)
    assert caught.value.what == "device"
    assert caught.value.why == f"{device} requested but CUDA is not available"


@pytest.mark.parametrize("device", ["bogus", "mps", 5])
def test_a_name_that_is_no_device_is_said_so_from_python(device: object) -> None:
    import torch

    import curvcal

    with pytest.raises(InputError) as caught:
        curvcal.hessian_operator(
            torch.nn.Linear(4, 3), (torch.randn(8, 4), torch.arange(8) % 3), device=device
        )
    assert caught.value.why == f"{device!r} is not a device"


@pytest.mark.parametrize("stage", ["ts", "focal_ts", "ets"])
def test_fit_map_on_cuda_without_cuda_is_said_so(no_cuda: None, stage: str) -> None:
    import curvcal

    logits, labels = _scores_for_maps()
    with pytest.raises(InputError) as caught:
        curvcal.fit_map(stage, logits, labels, device="cuda")
    assert caught.value.why == "cuda requested but CUDA is not available"
    curvcal.fit_map(stage, logits, labels, device="cpu")


def _scores_for_maps() -> tuple[object, object]:
    import torch

    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(40) % 3
    logits = torch.randn(40, 3, generator=generator, dtype=torch.float64)
    logits[torch.arange(40), labels] += 1.5
    return logits, labels


# ---------------------------------------------------------------------------------------------
# decompression bombs in an image folder


@pytest.mark.parametrize("side", [40, 50])  # past PIL's limit (a warning), past twice it (an error)
def test_an_image_past_pil_s_pixel_limit_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, side: int
) -> None:
    """PIL's limit is lowered to 1,000 pixels here, so a 40² image stands for a 10,000² one
    (which warned, raw, then decoded) and a 50² one for a 20,000² one (exit 70)."""
    import warnings

    from PIL import Image

    from curvcal.load.datasets.batches import iter_batches

    root = _images(tmp_path / "img")
    Image.new("RGB", (side, side)).save(root / "a" / "1.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing reaches the terminal as a warning
        with pytest.raises(InputError) as caught:
            data = _load(root)
            list(iter_batches(data.dataset, 4))
    assert caught.value.what == str(root / "a" / "1.png")
    assert caught.value.why.startswith(f"decodes to {side * side:,} pixels, more than the 1,000")


# ---------------------------------------------------------------------------------------------
# weights that are no numbers: the file's fault, not the data's


@pytest.mark.parametrize(
    ("value", "dtype", "what", "why"),
    [
        (
            float("nan"),
            "float32",
            "FILE",
            "parameter fc.weight holds 1 NaN or infinite value (of 12)",
        ),
        (float("inf"), "bfloat16", "FILE", "parameter fc.weight holds 1 NaN or infinite value"),
        (1e6, "float16", "--dtype", "float16 cannot hold the model's parameter fc.weight: 1 of"),
    ],
)
def test_a_weight_that_is_no_number_is_refused_naming_the_file(
    run_cli, factories: str, tmp_path: Path, value: float, dtype: str, what: str, why: str
) -> None:
    import torch

    weight = torch.zeros(3, 4)
    weight[1, 2] = value
    torch.save({"fc.weight": weight, "fc.bias": torch.zeros(3)}, tmp_path / "m.pt")
    torch.save({"x": torch.randn(6, 4), "y": torch.arange(6) % 3}, tmp_path / "d.pt")
    result = run_cli(
        "calibrate", tmp_path / "m.pt", "--arch", f"py:{factories}:Linear4", "--trust-checkpoint",
        "--data", tmp_path / "d.pt", "--dtype", dtype,
    )  # fmt: skip
    assert result.code == 2, result.stderr
    named = shown(tmp_path / "m.pt", ":") if what == "FILE" else "--dtype:"
    assert said(f"{named} {why}", result.stderr), result.stderr
    assert result.stderr.count("\n") == 1


def test_a_weight_within_float16_s_range_is_read_in_float16(
    run_cli, factories: str, tmp_path: Path
) -> None:
    import torch

    weight = torch.full((3, 4), 60000.0)
    torch.save({"fc.weight": weight, "fc.bias": torch.zeros(3)}, tmp_path / "m.pt")
    torch.save({"x": torch.rand(6, 4) * 1e-6, "y": torch.arange(6) % 3}, tmp_path / "d.pt")
    result = run_cli(
        "calibrate", tmp_path / "m.pt", "--arch", f"py:{factories}:Linear4", "--trust-checkpoint",
        "--data", tmp_path / "d.pt", "--dtype", "float16", "--method", "none",
    )  # fmt: skip
    assert result.code == 0, result.stderr


def test_a_recorded_model_name_of_any_length_is_not_a_model_name(run_cli, tmp_path: Path) -> None:
    import torch

    state = {"model.fc.weight": torch.zeros(3, 4), "model.fc.bias": torch.zeros(3)}
    for name, shown_name in (("resnet18", True), ("resnet" + "1" * 200_000, False)):
        torch.save({"state_dict": state, "hyper_parameters": {"arch": name}}, tmp_path / "m.ckpt")
        result = run_cli("--json", "inspect", tmp_path / "m.ckpt")
        assert result.code == 0, result.stderr
        assert ("resnet" in result.stdout) is shown_name
        assert len(result.stdout) < 20_000


def test_a_policy_and_a_report_saved_with_a_byte_order_mark_are_read(
    run_cli, tmp_path: Path
) -> None:
    import numpy as np

    logits = np.eye(3)[np.arange(30) % 3] * 2.0
    np.savez(tmp_path / "s.npz", logits=logits, labels=np.arange(30) % 3)
    assert run_cli("-o", tmp_path / "r.json", "metrics", tmp_path / "s.npz").code == 0
    marked = tmp_path / "marked.json"
    marked.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "r.json").read_bytes())
    policy = tmp_path / "p.toml"
    policy.write_bytes(b"\xef\xbb\xbf[ece]\nmax_increase = 0.01\n")
    result = run_cli("compare", marked, tmp_path / "r.json", "--policy", policy)
    assert result.code == 0, result.stderr
    assert said("PASS: all 1 bounds hold", result.stdout)
