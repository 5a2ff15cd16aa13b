"""Checkpoint loading: every form loads back to the same outputs; unsafe files are refused."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from curvcal.errors import InputError, TrustError
from curvcal.load.checkpoint import FORMS, load_model
from curvcal.load.checkpoints.device import resolve_device, resolve_dtype
from curvcal.load.checkpoints.inspect import inspect_checkpoint
from curvcal.models import DigitsCNN
from curvcal.settings.checkpoint import CheckpointSettings

DIGITS = "curvcal:DigitsCNN"


class MLP(nn.Module):
    """A small classifier with BatchNorm (so eval and train mode differ)."""

    def __init__(self, num_classes: int = 3, hidden: int = 6) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, hidden), nn.BatchNorm1d(hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@dataclass
class TrainConfig:
    """Plain data pickled next to the weights (needs --allow-global)."""

    lr: float
    epochs: int


MLP_ARCH = f"py:{__name__}:MLP"


def _mlp() -> MLP:
    torch.manual_seed(0)
    model = MLP()
    bn = model.body[1]
    assert isinstance(bn, nn.BatchNorm1d)
    bn.running_mean.copy_(torch.randn(6))
    bn.running_var.copy_(torch.rand(6) + 0.5)
    return model  # left in train mode on purpose: loading must not depend on it


def _digits(width: int = 8, num_classes: int = 10) -> DigitsCNN:
    torch.manual_seed(1)
    return DigitsCNN(num_classes=num_classes, width=width)


def _reference(
    model: nn.Module, x: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    twin = copy.deepcopy(model).eval().to(dtype)
    with torch.no_grad():
        return twin(x.to(dtype))


def _outputs(loaded: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return loaded(x)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor], training: bool) -> bool:
    after = model.state_dict()
    return model.training == training and all(
        torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in before.items()
    )


# --- every weights-only form of DigitsCNN (safe architecture, no trust) -----------------------

# a saver returns (file, options to load it, expected state-dict key, expected prefix)
Saved = tuple[Path, CheckpointSettings, str | None, str | None]
Saver = Callable[[nn.Module, Path], Saved]


def _plain(model: nn.Module, d: Path) -> Saved:
    torch.save(model.state_dict(), d / "w.pt")
    return d / "w.pt", CheckpointSettings(arch=DIGITS), None, None


def _wrapped(key: str) -> Saver:
    def save(model: nn.Module, d: Path) -> Saved:
        torch.save({key: model.state_dict(), "epoch": 7, "best_acc": 0.5}, d / "w.pth")
        return d / "w.pth", CheckpointSettings(arch=DIGITS), key, None

    return save


def _prefixed(prefix: str, suffix: str = ".pt") -> Saver:
    def save(model: nn.Module, d: Path) -> Saved:
        state = {prefix + k: v for k, v in model.state_dict().items()}
        torch.save(state, d / f"w{suffix}")
        return d / f"w{suffix}", CheckpointSettings(arch=DIGITS), None, prefix

    return save


def _lightning(model: nn.Module, d: Path) -> Saved:
    state = {"net." + k: v for k, v in model.state_dict().items()}
    state["criterion.weight"] = torch.ones(10)  # another attribute of the LightningModule
    checkpoint = {
        "state_dict": state,
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": "2.4.0",
    }
    torch.save(checkpoint, d / "last.ckpt")
    return d / "last.ckpt", CheckpointSettings(arch=DIGITS), "state_dict", "net."


def _legacy(model: nn.Module, d: Path) -> Saved:
    torch.save(model.state_dict(), d / "w.pth", _use_new_zipfile_serialization=False)
    return d / "w.pth", CheckpointSettings(arch=DIGITS), None, None


def _safetensors(model: nn.Module, d: Path) -> Saved:
    save_file(model.state_dict(), str(d / "w.safetensors"))
    return d / "w.safetensors", CheckpointSettings(arch=DIGITS), None, None


def _safetensors_metadata(model: nn.Module, d: Path) -> Saved:
    metadata = {"curvcal.arch": DIGITS, "curvcal.arch_kwargs": json.dumps({"width": 8})}
    save_file(model.state_dict(), str(d / "w.safetensors"), metadata=metadata)
    return d / "w.safetensors", CheckpointSettings(), None, None


STATE_DICT_FORMS: dict[str, Saver] = {
    "plain": _plain,
    **{
        f"wrapped-{k}": _wrapped(k)
        for k in ("state_dict", "model", "model_state_dict", "state_dict_ema", "model_ema")
    },
    "module-prefix": _prefixed("module."),
    "orig-mod-prefix": _prefixed("_orig_mod."),
    "ddp-and-compile-prefix": _prefixed("module._orig_mod.", ".bin"),
    "lightning-net": _lightning,
    "legacy-pickle": _legacy,
    "safetensors": _safetensors,
    "safetensors-metadata": _safetensors_metadata,
}


@pytest.mark.parametrize("name", list(STATE_DICT_FORMS))
def test_weights_only_forms_reproduce_outputs(name: str, tmp_path: Path) -> None:
    model = _digits()
    before, training = _snapshot(model), model.training
    path, options, key, prefix = STATE_DICT_FORMS[name](model, tmp_path)
    x = torch.randn(4, 1, 8, 8)

    loaded = load_model(path, replace(options, device="cpu"))

    assert torch.equal(_outputs(loaded.module, x), _reference(model, x))
    assert loaded.form == ("safetensors" if name.startswith("safetensors") else "state_dict")
    assert loaded.state_dict_key == key
    assert loaded.stripped_prefix == prefix
    assert loaded.arch == DIGITS
    assert loaded.num_classes == 10
    assert not loaded.module.training
    assert loaded.module is not model
    assert _unchanged(model, before, training)
    json.dumps(loaded.describe())


def test_lightning_keys_outside_the_prefix_are_reported(tmp_path: Path) -> None:
    path, options, _, _ = _lightning(_digits(), tmp_path)
    loaded = load_model(path, replace(options, device="cpu"))
    assert "1 keys outside prefix 'net.'" in loaded.metadata["ignored_keys"]
    assert loaded.metadata["epoch"] == "3"


def test_state_dict_key_option_picks_the_ema_weights(tmp_path: Path) -> None:
    live, ema = _digits(), _digits()
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(0.5)
    torch.save(
        {"state_dict": live.state_dict(), "state_dict_ema": ema.state_dict()}, tmp_path / "w.pt"
    )
    x = torch.randn(2, 1, 8, 8)
    default = load_model(tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, device="cpu"))
    chosen = load_model(
        tmp_path / "w.pt",
        CheckpointSettings(arch=DIGITS, state_dict_key="state_dict_ema", device="cpu"),
    )
    assert default.state_dict_key == "state_dict"
    assert torch.equal(_outputs(default.module, x), _reference(live, x))
    assert torch.equal(_outputs(chosen.module, x), _reference(ema, x))


def test_num_classes_inferred_and_passed(tmp_path: Path) -> None:
    model = _digits(num_classes=4)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    inferred = load_model(tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, device="cpu"))
    given = load_model(
        tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, num_classes=4, device="cpu")
    )
    assert inferred.num_classes == given.num_classes == 4
    assert inferred.metadata["num_classes_source"].startswith("inferred")
    with pytest.raises(InputError, match="mis-shaped"):
        load_model(tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, num_classes=5, device="cpu"))


# --- code-carrying forms of the BatchNorm MLP (trust) ----------------------------------------


def _whole(model: nn.Module, d: Path) -> Path:
    torch.save(model, d / "whole.pt")
    return d / "whole.pt"


def _whole_in_wrapper(model: nn.Module, d: Path) -> Path:
    torch.save({"model": model, "epoch": 2}, d / "wrapped.pt")
    return d / "wrapped.pt"


def _script(model: nn.Module, d: Path) -> Path:
    with pytest.warns(FutureWarning):
        scripted = torch.jit.script(copy.deepcopy(model).eval())
        torch.jit.save(scripted, str(d / "scripted.pt"))
    return d / "scripted.pt"


def _export(model: nn.Module, d: Path) -> Path:
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(
        copy.deepcopy(model).eval(), (torch.randn(3, 5),), dynamic_shapes=({0: batch},)
    )
    torch.export.save(program, str(d / "exported.pt2"))
    return d / "exported.pt2"


def _mlp_state_dict(model: nn.Module, d: Path) -> Path:
    torch.save(model.state_dict(), d / "mlp.pt")
    return d / "mlp.pt"


TRUSTED_FORMS: dict[str, tuple[Callable[[nn.Module, Path], Path], str]] = {
    "pickled-module": (_whole, "pickled_module"),
    "pickled-module-in-wrapper": (_whole_in_wrapper, "pickled_module"),
    "torchscript": (_script, "torchscript"),
    "exported-program": (_export, "exported_program"),
    "py-arch-state-dict": (_mlp_state_dict, "state_dict"),
}


@pytest.mark.parametrize("name", list(TRUSTED_FORMS))
def test_trusted_forms_reproduce_outputs(name: str, tmp_path: Path) -> None:
    model = _mlp()
    before = _snapshot(model)
    saver, form = TRUSTED_FORMS[name]
    path = saver(model, tmp_path)
    arch = MLP_ARCH if form == "state_dict" else None
    x = torch.randn(7, 5)  # a batch size other than the one exported with

    with pytest.raises(TrustError, match="--trust-checkpoint") as refused:
        load_model(path, CheckpointSettings(arch=arch, device="cpu"))
    # the file is at fault, or for a py: architecture the --arch option
    assert refused.value.what == (str(path) if arch is None else "--arch")
    loaded = load_model(path, CheckpointSettings(arch=arch, trust_checkpoint=True, device="cpu"))

    assert loaded.form == form
    assert form in FORMS
    assert torch.equal(_outputs(loaded.module, x), _reference(model, x))
    assert loaded.num_classes == 3
    assert _unchanged(model, before, training=True)
    if form == "exported_program":
        assert "cannot switch" in loaded.metadata["note"]
    else:
        assert not loaded.module.training


def test_pickled_module_refusal_lists_the_globals(tmp_path: Path) -> None:
    path = _whole(_mlp(), tmp_path)
    with pytest.raises(TrustError) as refused:
        load_model(path, CheckpointSettings(device="cpu"))
    message = str(refused.value)
    assert f"{__name__}.MLP" in message
    assert "torch.nn.modules.batchnorm.BatchNorm1d" in message
    assert "builtins.set" not in message  # allowlisted by torch, spelt __builtin__ in the pickle


@pytest.mark.parametrize("form", ["eager", "pickled", "torchscript", "exported"])
def test_float64_option(form: str, tmp_path: Path) -> None:
    model = _mlp()
    before = _snapshot(model)
    if form == "eager":
        path, options = _mlp_state_dict(model, tmp_path), CheckpointSettings(arch=MLP_ARCH)
    else:
        saver = {"pickled": _whole, "torchscript": _script, "exported": _export}[form]
        path, options = saver(model, tmp_path), CheckpointSettings()
    loaded = load_model(
        path,
        replace(options, trust_checkpoint=True, dtype="float64", device="cpu"),
    )
    x = torch.randn(4, 5, dtype=torch.float64)
    assert loaded.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in loaded.module.parameters())
    assert torch.equal(_outputs(loaded.module, x), _reference(model, x, torch.float64))
    assert _unchanged(model, before, training=True)


def test_torchvision_architecture(tmp_path: Path) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(2)
    model = torchvision.models.resnet18(num_classes=10)
    torch.save({"model": model.state_dict()}, tmp_path / "resnet.pth")
    x = torch.randn(2, 3, 32, 32)
    loaded = load_model(
        tmp_path / "resnet.pth", CheckpointSettings(arch="tv:resnet18", device="cpu")
    )
    assert loaded.num_classes == 10
    assert loaded.metadata["num_classes_source"].startswith("inferred")
    assert torch.equal(_outputs(loaded.module, x), _reference(model, x))


# --- allowlisted plain-data globals ----------------------------------------------------------


def test_allow_global_admits_a_plain_data_class(tmp_path: Path) -> None:
    model = _digits()
    torch.save({"state_dict": model.state_dict(), "config": TrainConfig(0.1, 3)}, tmp_path / "w.pt")
    name = f"{__name__}.TrainConfig"
    with pytest.raises(TrustError, match=name) as refused:
        load_model(tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, device="cpu"))
    assert f"--allow-global {name} admits them and runs no code" in refused.value.message
    loaded = load_model(
        tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, allow_global=(name,), device="cpu")
    )
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(_outputs(loaded.module, x), _reference(model, x))
    info = inspect_checkpoint(tmp_path / "w.pt", (name,))
    assert info.unsafe_globals == () and info.state_dict_key == "state_dict"
    with pytest.raises(InputError, match="--allow-global"):
        load_model(
            tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, allow_global=("no.such.Thing",))
        )


# --- a malicious pickle ----------------------------------------------------------------------


class _Payload:
    """Unpickling this creates ``marker`` (what an attacker's code would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@pytest.fixture
def malicious(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "pwned"
    path = tmp_path / "innocent.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "extra": _Payload(marker)}, path)
    assert not marker.exists()
    return path, marker


def test_malicious_pickle_is_refused_without_running(malicious: tuple[Path, Path]) -> None:
    path, marker = malicious
    with pytest.raises(TrustError) as refused:
        load_model(path, CheckpointSettings(arch=DIGITS, device="cpu"))
    message = str(refused.value)
    assert str(path) in message and "io.open" in message and "--trust-checkpoint" in message
    info = inspect_checkpoint(path)
    assert info.unsafe_globals == ("io.open",) and info.needs_trust
    assert not marker.exists()


def test_malicious_payload_is_real(malicious: tuple[Path, Path]) -> None:
    """The payload above does run under a full unpickling (so the refusal test can fail)."""
    path, marker = malicious
    with pytest.raises(InputError):  # the weights do not fit DigitsCNN
        load_model(path, CheckpointSettings(arch=DIGITS, trust_checkpoint=True, device="cpu"))
    assert marker.exists()


# --- bad inputs ------------------------------------------------------------------------------


def _truncated_zip(d: Path) -> Path:
    torch.save(_digits().state_dict(), d / "full.pt")
    data = (d / "full.pt").read_bytes()
    (d / "cut.pt").write_bytes(data[: len(data) // 2])
    return d / "cut.pt"


def _truncated_safetensors(d: Path) -> Path:
    save_file(_digits().state_dict(), str(d / "full.safetensors"))
    data = (d / "full.safetensors").read_bytes()
    (d / "cut.safetensors").write_bytes(data[:-100])
    return d / "cut.safetensors"


def _random_bytes(d: Path) -> Path:
    (d / "noise.pt").write_bytes(os.urandom(4096)[:1] + b"\x00" * 7 + os.urandom(4000))
    return d / "noise.pt"


def _empty(d: Path) -> Path:
    (d / "empty.pth").write_bytes(b"")
    return d / "empty.pth"


def _directory(d: Path) -> Path:
    (d / "ckpt.pt").mkdir()
    return d / "ckpt.pt"


def _missing(d: Path) -> Path:
    return d / "absent.pt"


def _unknown_extension(d: Path) -> Path:
    # (an ONNX file is named as one: tests/test_bad_inputs_formats.py)
    (d / "model.xyz").write_bytes(b"\x08\x07\x12\x07pytorch" + bytes(100))
    return d / "model.xyz"


def _foreign_zip(d: Path) -> Path:
    import numpy as np

    np.savez(d / "arrays.npz", a=np.zeros(3))
    return d / "arrays.npz"


BAD_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated-zip": (_truncated_zip, "truncated or corrupt"),
    "truncated-safetensors": (_truncated_safetensors, "truncated safetensors"),
    "random-bytes": (_random_bytes, "not a checkpoint"),
    "empty": (_empty, "empty"),
    "directory": (_directory, "directory"),
    "missing": (_missing, "no such file"),
    "unknown-extension": (_unknown_extension, "unknown checkpoint extension .xyz"),
    "foreign-zip": (_foreign_zip, "not a torch checkpoint"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_files_name_the_file_and_the_problem(name: str, tmp_path: Path) -> None:
    make, problem = BAD_FILES[name]
    path = make(tmp_path)
    for call in (
        lambda: load_model(path, CheckpointSettings(arch=DIGITS, device="cpu")),
        lambda: inspect_checkpoint(path),
    ):
        with pytest.raises(InputError) as caught:
            call()
        assert caught.value.what == str(path)
        assert problem in caught.value.message


def test_wrong_architecture_lists_the_keys(tmp_path: Path) -> None:
    torch.save(_mlp().state_dict(), tmp_path / "mlp.pt")
    with pytest.raises(InputError) as caught:
        load_model(tmp_path / "mlp.pt", CheckpointSettings(arch=DIGITS, device="cpu"))
    message = caught.value.message
    assert caught.value.what == str(tmp_path / "mlp.pt")
    assert "missing (features.0.weight, features.0.bias" in message
    assert "9 unexpected (body.0.weight" in message
    assert "... and 4 more" in message  # long lists are cut with a count
    assert "num_classes=3 was inferred" in message


def test_misshaped_weights_are_listed_with_shapes(tmp_path: Path) -> None:
    torch.save(_digits(width=4).state_dict(), tmp_path / "w.pt")
    with pytest.raises(
        InputError, match=r"features\.0\.weight: checkpoint \[4, 1, 3, 3\] vs model \[8, 1, 3, 3\]"
    ):
        load_model(tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, device="cpu"))
    loaded = load_model(
        tmp_path / "w.pt", CheckpointSettings(arch=DIGITS, arch_kwargs={"width": 4}, device="cpu")
    )
    assert loaded.num_classes == 10


@pytest.mark.parametrize(
    ("options", "what", "text"),
    [
        (CheckpointSettings(), "{path}", "pass --arch"),
        (CheckpointSettings(arch="tv:resnet181"), "--arch", "did you mean resnet18"),
        (CheckpointSettings(arch="curvcal:DigitCNN"), "--arch", "did you mean DigitsCNN"),
        (CheckpointSettings(arch="resnet18"), "--arch", "not an architecture spec"),
        (
            CheckpointSettings(arch=DIGITS, arch_kwargs={"depth": 3}),
            "--arch-kwargs",
            "does not accept depth",
        ),
        (
            CheckpointSettings(arch="tv:resnet18", arch_kwargs={"depth": 3}),
            "--arch-kwargs",
            "depth",
        ),
        (
            CheckpointSettings(arch=DIGITS, state_dict_key="ema"),
            "--state-dict-key",
            "'ema' is not a key",
        ),
        (
            CheckpointSettings(arch=DIGITS, num_classes=3, arch_kwargs={"num_classes": 4}),
            "--num-classes",
            "conflicts",
        ),
        (CheckpointSettings(arch=DIGITS, device="tpu"), "--device", "not a device"),
    ],
)
def test_bad_options(options: CheckpointSettings, what: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "w.pt"
    torch.save(_digits().state_dict(), path)
    with pytest.raises(InputError) as caught:
        load_model(path, options)
    assert caught.value.what == what.format(path=path)
    assert text in caught.value.message


def test_unsupported_dtype_is_refused_when_the_settings_are_made() -> None:
    with pytest.raises(InputError) as caught:
        CheckpointSettings(arch=DIGITS, dtype="int8")
    assert caught.value.what == "dtype"  # the field from Python; --dtype on the command line
    assert "int8" in caught.value.message and "float32, float64" in caught.value.message


def test_py_architecture_needs_trust(tmp_path: Path) -> None:
    torch.save(_mlp().state_dict(), tmp_path / "w.pt")
    with pytest.raises(TrustError, match="--trust-checkpoint"):
        load_model(tmp_path / "w.pt", CheckpointSettings(arch=MLP_ARCH, device="cpu"))
    metadata = {"curvcal.arch": MLP_ARCH}
    save_file(_mlp().state_dict(), str(tmp_path / "w.safetensors"), metadata=metadata)
    with pytest.raises(TrustError, match="imports and runs Python code") as info:
        load_model(tmp_path / "w.safetensors", CheckpointSettings(device="cpu"))
    # the file named the architecture, not --arch: the error says so
    assert info.value.what.startswith(f"{tmp_path / 'w.safetensors'} (its metadata curvcal.arch")
    assert "--arch" not in info.value.what


def test_an_unknown_architecture_in_the_metadata_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file(_digits().state_dict(), str(path), metadata={"curvcal.arch": "curvcal:Nope"})
    with pytest.raises(InputError, match="no bundled architecture 'Nope'") as info:
        load_model(path, CheckpointSettings(device="cpu"))
    assert info.value.what == f"{path} (its metadata curvcal.arch = 'curvcal:Nope')"
    with pytest.raises(InputError) as given:  # a bad --arch is still blamed on --arch
        load_model(path, CheckpointSettings(arch="curvcal:Nope", device="cpu"))
    assert given.value.what.startswith("--arch")


# --- inspect ---------------------------------------------------------------------------------


def test_inspect_state_dict_without_architecture(tmp_path: Path) -> None:
    model = _digits(num_classes=6)
    state = {"module." + k: v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 4}, tmp_path / "w.pt")
    info = inspect_checkpoint(tmp_path / "w.pt")
    assert info.format == "state_dict" and info.container == "torch-zip"
    assert info.top_level_keys == ("state_dict", "epoch")
    assert info.state_dict_key == "state_dict"
    assert info.detected_prefix == "module."
    assert info.num_classes == 6
    assert info.parameter_count == sum(p.numel() for p in model.parameters())
    assert [t.name for t in info.tensors] == list(state)
    assert info.tensors[0].shape == (8, 1, 3, 3) and info.tensors[0].dtype == "float32"
    assert info.metadata == {"epoch": "4"}
    assert not info.needs_trust


def test_inspect_reads_safetensors_header_and_code_archives(tmp_path: Path) -> None:
    model = _mlp()
    save_file(
        model.state_dict(), str(tmp_path / "w.safetensors"), metadata={"curvcal.arch": MLP_ARCH}
    )
    info = inspect_checkpoint(tmp_path / "w.safetensors")
    assert info.format == "safetensors" and info.metadata == {"curvcal.arch": MLP_ARCH}
    assert {t.name: t.shape for t in info.tensors} == {
        k: tuple(v.shape) for k, v in model.state_dict().items()
    }
    exported = inspect_checkpoint(_export(model, tmp_path))
    assert (
        exported.format == "exported_program" and exported.needs_trust and exported.num_classes == 3
    )
    scripted = inspect_checkpoint(_script(model, tmp_path))
    assert scripted.format == "torchscript" and scripted.needs_trust
    whole = inspect_checkpoint(_whole(model, tmp_path))
    assert whole.format == "pickled_module" and whole.top_level_type == f"{__name__}.MLP"


def test_resolve_device_and_dtype() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("float64") == torch.float64
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_old_state_dict_without_num_batches_tracked(tmp_path: Path) -> None:
    model = _mlp()
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "old.pt")
    loaded = load_model(
        tmp_path / "old.pt", CheckpointSettings(arch=MLP_ARCH, trust_checkpoint=True, device="cpu")
    )
    x = torch.randn(3, 5)
    assert torch.equal(_outputs(loaded.module, x), _reference(model, x))
