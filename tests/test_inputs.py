"""Every file or folder a run reads is recorded as it is opened, and no output replaces one.

The record (:mod:`curvcal.inputs`) is filled by the one opener (:func:`curvcal.paths.readable_file`,
:func:`curvcal.paths.readable_folder`, digests), not by lists the commands keep: a loader that
reads through it is protected without a line of its own. The checks here read nothing but
that record: the inputs the commands name are switched off where a case says "record only".
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import numpy as np
import pytest

from curvcal import inputs
from curvcal.errors import CurvcalError, InputError
from curvcal.paths import readable_file, readable_folder

# ---------------------------------------------------------------------------------------------
# the record itself


def test_a_new_loader_that_reads_through_the_opener_is_recorded_without_a_list(
    tmp_path: Path,
) -> None:
    file = tmp_path / "weights.bin"
    file.write_bytes(b"new format")
    link = tmp_path / "hard-link.bin"
    os.link(file, link)

    def new_loader(path: Path) -> bytes:  # a loader no list knows
        readable_file(path, "new-format file")
        return path.read_bytes()

    with inputs.recording():
        new_loader(file)
        (entry,) = inputs.recorded()
        status = os.stat(file)
        assert entry.name == "new-format file" and entry.path == file
        assert entry.identity.resolved == str(file.resolve())
        assert entry.identity.inode == (status.st_dev, status.st_ino)
        assert not entry.identity.is_dir
        for target in (file, link, tmp_path / "." / "weights.bin"):
            with pytest.raises(
                InputError, match=r"would replace the input .* \(new-format file\)"
            ) as refused:
                inputs.refuse_output(target)
            assert refused.value.what == f"output {target}"
        inputs.refuse_output(tmp_path / "report.json")  # any other file may be written


def test_a_folder_handed_to_a_library_protects_everything_beneath_it(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    with inputs.recording():
        readable_folder(folder, "model folder")
        for target in (folder / "config.json", folder / "sub" / "new" / "r.json", folder):
            with pytest.raises(
                InputError,
                match=r"(lies inside|would replace) the input folder .* \(model folder\)",
            ):
                inputs.refuse_output(target, "--plot")
        inputs.refuse_output(tmp_path / "model.json")  # a sibling whose name starts alike


def test_symbolic_links_are_followed_to_the_file_they_name(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "real.png").write_bytes(b"a")
    (outside / "dir" / "x.png").write_bytes(b"b")
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "link.png").symlink_to(outside / "real.png")
    (folder / "sub").symlink_to(outside / "dir")
    (folder / "own.png").write_bytes(b"c")
    with inputs.recording():
        for name in ("own.png", "link.png", "sub/x.png"):  # one folder's files, one by one
            readable_file(folder / name, "image file")
        resolved = [entry.identity.resolved for entry in inputs.recorded()]
        assert resolved == [
            str((folder / "own.png").resolve()),
            str((outside / "real.png").resolve()),
            str((outside / "dir" / "x.png").resolve()),
        ]
        for target in (outside / "real.png", outside / "dir" / "x.png", folder / "own.png"):
            with pytest.raises(InputError, match="would replace the input"):
                inputs.refuse_output(target)
        inputs.refuse_output(outside / "dir" / "y.png")  # not read: the folder is no input


def test_outside_a_run_nothing_is_recorded_nor_refused(tmp_path: Path) -> None:
    file = tmp_path / "a.json"
    file.write_text("{}")
    readable_file(file)
    assert not inputs.active() and inputs.recorded() == ()
    inputs.refuse_output(file)  # the library used directly: the caller decides


def test_each_run_has_its_own_record(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("1")
    second.write_text("2")
    with inputs.recording():
        readable_file(first)
        with inputs.recording():
            assert inputs.recorded() == ()
            readable_file(second)
            assert [e.path for e in inputs.recorded()] == [second]
        assert [e.path for e in inputs.recorded()] == [first]
    assert inputs.recorded() == ()


def test_atomic_output_refuses_an_input_opened_at_any_time(tmp_path: Path) -> None:
    from curvcal.atomic import atomic_output

    source = tmp_path / "config.json"
    source.write_text('{"a": 1}')
    with inputs.recording():
        readable_file(source)
        with (
            pytest.raises(InputError, match=r"would replace the input .*config.json \(file\)"),
            atomic_output(source) as out,
        ):
            out.write(b"report")
    assert source.read_text() == '{"a": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # no temporary file


def test_no_record_leaks_from_one_cli_run_into_the_next(run_cli, tmp_path: Path) -> None:
    for name in ("a.npz", "b.npz"):
        np.savez(tmp_path / name, logits=np.eye(3, dtype=np.float32), labels=np.arange(3))
    assert run_cli("metrics", tmp_path / "a.npz").code == 0
    # a.npz was the first run's input, not this one's: with --force it may be replaced
    result = run_cli("metrics", tmp_path / "b.npz", "-o", tmp_path / "a.npz", "--force")
    assert result.code == 0, result.output


# ---------------------------------------------------------------------------------------------
# every loader records what it opens, as it opens it (whether or not the content is good)


def _write_module(folder: Path) -> Path:
    source = folder / "inputs_factory_module.py"
    source.write_text(
        "import torch\n\n"
        "def make():\n"
        "    return torch.zeros(3, 2), torch.arange(3)\n\n"
        "class Net(torch.nn.Linear):\n"
        "    def __init__(self):\n"
        "        super().__init__(2, 3)\n"
    )
    return source


def _loaders() -> dict[str, Callable[[Path], tuple[Path, Callable[[], object]]]]:
    """Each case builds its input under a folder and returns it with the loader's call; the
    record must hold it once the loader ran (a bad content is fine: the record is made when
    the file is opened, before it is parsed)."""

    def checkpoint(root: Path) -> tuple[Path, Callable[[], object]]:
        from catalogue_inputs import digits_model

        from curvcal.load.checkpoint import load_model
        from curvcal.settings.checkpoint import CheckpointSettings

        path = digits_model(root)
        return path, lambda: load_model(path, CheckpointSettings(device="cpu"))

    def logits(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.scores.logits import load_logits

        path = root / "l.npz"
        np.savez(path, logits=np.eye(3, dtype=np.float32), labels=np.arange(3))
        return path, lambda: load_logits(path)

    def logits_table(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.scores.logits import load_logits

        path = root / "l.csv"
        path.write_text("logits_0,logits_1,label\n1,0,0\n0,1,1\n")
        return path, lambda: load_logits(path)

    def text_table(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.texts.text import read_table

        path = root / "t.jsonl"
        path.write_text('{"text": "a", "label": 0}\n')
        return path, lambda: read_table(str(path))

    def saved_dataset(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.texts.text import read_table

        folder = root / "saved"
        folder.mkdir()
        (folder / "state.json").write_text("{}")
        return folder, lambda: read_table(str(folder))

    def policy(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.policy.parse import load_policy

        path = root / "policy.toml"
        path.write_text("[ece]\nmax = 1\n")
        return path, lambda: load_policy(path)

    def baseline(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.policy.baseline import load_report

        path = root / "baseline.json"
        path.write_text("{}")
        return path, lambda: load_report(path)

    def calibrator(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.pipeline.calibrator import load_calibrators

        path = root / "calibrator.json"
        path.write_text("{}")
        return path, lambda: load_calibrators(path)

    def model_folder(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.models.hf import read_folder

        folder = root / "hf"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        return folder, lambda: read_folder(folder)

    def adapter_folder(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.models.adapters import read_adapter

        folder = root / "adapter"
        folder.mkdir()
        (folder / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        return folder, lambda: read_adapter(folder)

    def base_named_by_option(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.models.adapters import AdapterFolder, base_folder

        folder = root / "base"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        adapter = AdapterFolder(root, {}, "LORA", "elsewhere/base", root / "w", ())
        return folder, lambda: base_folder(adapter, folder)

    def base_named_by_adapter_config(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.models.adapters import AdapterFolder, base_folder

        folder = root / "base"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (root / "adapter").mkdir()
        adapter = AdapterFolder(root / "adapter", {}, "LORA", "../base", root / "w", ())
        return folder, lambda: base_folder(adapter, None)

    def tokenizer(root: Path) -> tuple[Path, Callable[[], object]]:
        pytest.importorskip("transformers")
        from curvcal.load.texts.text import load_tokenizer

        folder = root / "tok"
        folder.mkdir()
        return folder, lambda: load_tokenizer(folder, None, False, [])

    def image_folder(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.datasets.image_folder import load_image_folder
        from curvcal.settings.data import DataSettings

        folder = root / "images"
        folder.mkdir()
        return folder, lambda: load_image_folder(DataSettings(data=f"folder:{folder}"), None)

    def torchvision_root(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.datasets.torchvision_dataset import load_torchvision
        from curvcal.settings.data import DataSettings

        folder = root / "raw"
        folder.mkdir()
        settings = DataSettings(data="tv:mnist", data_root=folder)
        return folder, lambda: load_torchvision(settings, None)

    def py_dataset(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.datasets.py_dataset import load_py_dataset
        from curvcal.settings.data import DataSettings

        settings = DataSettings(data="py:inputs_factory_module:make", trust_checkpoint=True)
        return _write_module(root), lambda: load_py_dataset(settings)

    def py_architecture(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.models.architecture import build_architecture

        source = _write_module(root)
        return source, lambda: build_architecture("py:inputs_factory_module:Net", {}, True, [])

    def digest(root: Path) -> tuple[Path, Callable[[], object]]:
        from curvcal.load.checkpoints.digest import file_info

        folder = root / "anything"
        folder.mkdir()
        return folder, lambda: file_info(folder)

    cases = (
        checkpoint, logits, logits_table, text_table, saved_dataset, policy, baseline,
        calibrator, model_folder, adapter_folder, base_named_by_option,
        base_named_by_adapter_config, tokenizer, image_folder, torchvision_root, py_dataset,
        py_architecture, digest,
    )  # fmt: skip
    return {case.__name__: case for case in cases}


LOADERS = _loaders()


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path`` on ``sys.path``, its factory module forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("inputs_factory_module", None)


@pytest.mark.parametrize("case", sorted(LOADERS))
def test_every_loader_records_what_it_opens(case: str, importable: Path) -> None:
    expected, load = LOADERS[case](importable)
    with inputs.recording():
        with suppress(CurvcalError):
            load()
        recorded = {entry.identity.resolved for entry in inputs.recorded()}
        assert str(expected.resolve()) in recorded, (case, recorded)
        target = expected / "sub" / "out.json" if expected.is_dir() else expected
        with pytest.raises(InputError, match="never writes over a file it reads"):
            inputs.refuse_output(target, "-o/--output")
    with suppress(CurvcalError):
        load()  # outside a run: nothing recorded
    assert inputs.recorded() == ()


# ---------------------------------------------------------------------------------------------
# an adapter's base model folder, named either way, through the CLI


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    } | {str(p.relative_to(folder)) + "/": "" for p in folder.rglob("*") if p.is_dir()}


class Lora:
    def __init__(self, root: Path) -> None:
        from hf_decoder_builders import copy_adapter, save_decoder, save_lora, write_reviews

        self.base = save_decoder(root / "base", "llama", seed=4)
        save_lora(self.base, root / "trained")
        #: names its base in adapter_config.json (an absolute path)
        self.named = copy_adapter(root / "trained", root / "named")
        #: names a base that is not here: the base comes from --base-model
        self.moved = copy_adapter(
            root / "trained", root / "moved", base_model_name_or_path="elsewhere/base"
        )
        self.data = write_reviews(root / "reviews.jsonl")


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> Lora:
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parent / "load"))
    try:
        return Lora(tmp_path_factory.mktemp("opener_lora"))
    finally:
        sys.path.remove(str(Path(__file__).parent / "load"))


#: (output options, the file under BASE they name: one of its own, or a new one)
TARGETS = [
    (("-o",), "config.json"),
    (("-o",), "report.json"),
    (("--save-calibrator",), "tokenizer.json"),
    (("--save-calibrator",), "calibrator.json"),
    (("--plot",), "reliability.png"),
]
NAMING = ["adapter-config", "base-model-option"]


def _adapter_args(lora: Lora, naming: str) -> list[str]:
    if naming == "adapter-config":
        return [str(lora.named)]
    return [str(lora.moved), "--base-model", str(lora.base)]


def _refused(result: object, option: str, lora: Lora) -> str:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.code == 2, result.output  # type: ignore[attr-defined]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"curvcal: error: {option}"), lines[0]
    assert "never writes over a file it reads" in lines[0]
    return lines[0]


@pytest.mark.parametrize("force", [True, False], ids=["force", "no-force"])
@pytest.mark.parametrize("naming", NAMING)
@pytest.mark.parametrize(("option", "name"), TARGETS, ids=[t[1] for t in TARGETS])
def test_the_base_folder_is_refused_before_any_work(
    run_cli,
    lora: Lora,
    monkeypatch: pytest.MonkeyPatch,
    option: tuple[str, ...],
    name: str,
    naming: str,
    force: bool,
) -> None:
    before = _digest(lora.base)

    def forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("work started before the output was refused")

    monkeypatch.setattr("curvcal.load.checkpoint.load_model", forbidden)
    args = ["calibrate", *_adapter_args(lora, naming), "--data", lora.data, "--device", "cpu"]
    result = run_cli(*args, *option, lora.base / name, *(["--force"] if force else []))
    line = _refused(result, option[0], lora)  # the clash comes before "already exists"
    assert str(lora.base) in line
    assert _digest(lora.base) == before


@pytest.mark.parametrize("force", [True, False], ids=["force", "no-force"])
@pytest.mark.parametrize("naming", NAMING)
def test_a_plot_folder_inside_the_base_is_refused_and_not_created(
    run_cli, lora: Lora, naming: str, force: bool
) -> None:
    before = _digest(lora.base)
    result = run_cli(
        "study", *_adapter_args(lora, naming), "--data", lora.data, "--device", "cpu",
        "--plot", lora.base / "plots", *(["--force"] if force else []),
    )  # fmt: skip
    _refused(result, "--plot", lora)
    assert not (lora.base / "plots").exists()
    assert _digest(lora.base) == before


@pytest.fixture
def record_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inputs the command line names (and the adapter's base that the early check reads
    from its config) are not told to anyone: only what the loaders open is recorded."""
    from curvcal.commands import clashes, common

    original = common.refuse_clashes
    monkeypatch.setattr(common, "refuse_clashes", lambda outputs, _inputs: original(outputs, []))
    monkeypatch.setattr(inputs, "declare", lambda _named: None)
    monkeypatch.setattr(clashes, "checkpoint_inputs", lambda name, path, *_: [(name, path)])


LATE = [
    (("-o",), "config.json", True),
    (("-o",), "report.json", False),
    (("--save-calibrator",), "tokenizer.json", True),
    (("--plot",), "reliability.png", True),
]


@pytest.mark.parametrize("naming", NAMING)
@pytest.mark.parametrize(("option", "name", "force"), LATE, ids=[t[1] for t in LATE])
def test_a_base_found_while_loading_is_refused_when_the_output_is_published(
    run_cli,
    lora: Lora,
    record_only: None,
    option: tuple[str, ...],
    name: str,
    force: bool,
    naming: str,
) -> None:
    before = _digest(lora.base)
    args = ["calibrate", *_adapter_args(lora, naming), "--data", lora.data, "--device", "cpu"]
    result = run_cli(
        *args, "--method", "ts", *option, lora.base / name, *(["--force"] if force else [])
    )
    line = _refused(result, option[0], lora)
    assert str(lora.base) in line and "the input" in line
    assert _digest(lora.base) == before


# ---------------------------------------------------------------------------------------------
# the files of every command's loaders, with only the record to protect them


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A digits checkpoint and its data, logits, a policy and two saved reports."""
    from catalogue_inputs import digit_images, digits_model

    folder = tmp_path_factory.mktemp("opener_small")
    digits_model(folder)
    digit_images(folder, 12)
    generator = np.random.default_rng(0)
    for name in ("l.npz", "f.npz"):
        np.savez(
            folder / name,
            logits=generator.normal(size=(40, 3)).astype(np.float32),
            labels=np.arange(40) % 3,
        )
    (folder / "policy.toml").write_text('[settings]\ndata = "data.pt"\n\n[ece]\nmax = 1\n')
    return folder


#: (command line, the input it reads that the output names); run in the folder of small_run
RECORDED = [
    ("metrics l.npz -o l.npz", "l.npz"),
    ("metrics l.npz --val-split 0.5 --save-calibrator l.npz", "l.npz"),
    ("metrics l.npz --fit f.npz -o f.npz", "f.npz"),
    ("calibrate model.safetensors --data data.pt --method ts -o data.pt", "data.pt"),
    (
        "calibrate model.safetensors --data data.pt --method ts --save-calibrator "
        "model.safetensors",
        "model.safetensors",
    ),
    ("check model.safetensors --policy policy.toml -o policy.toml", "policy.toml"),
]


@pytest.mark.parametrize(
    ("line", "victim"),
    RECORDED,
    ids=["logits", "logits-calibrator", "fit", "data", "checkpoint-calibrator", "policy"],
)
def test_what_a_loader_opened_is_refused_as_an_output(
    run_cli,
    small_run: Path,
    record_only: None,
    monkeypatch: pytest.MonkeyPatch,
    line: str,
    victim: str,
) -> None:
    monkeypatch.chdir(small_run)
    before = hashlib.sha256((small_run / victim).read_bytes()).hexdigest()
    listing = sorted(p.name for p in small_run.iterdir())
    result = run_cli(*line.split(), "--force")
    assert result.code == 2, result.output
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("curvcal: error: ") and f"would replace the input {victim}" in error
    assert hashlib.sha256((small_run / victim).read_bytes()).hexdigest() == before
    assert sorted(p.name for p in small_run.iterdir()) == listing
