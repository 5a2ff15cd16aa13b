"""Options that mean nothing for a checkpoint's form: ``--state-dict-key`` for a file with no
keys above its weights is refused, ``--arch`` for a form that carries its own architecture is
noted as ignored (in the metadata, after what the file records)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from curvcal.errors import InputError
from curvcal.load.checkpoint import load_model
from curvcal.settings.checkpoint import CheckpointSettings

MLP_ARCH = f"py:{__name__}:MLP"


class MLP(nn.Module):
    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.body = nn.Linear(5, 4)
        self.head = nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def _whole(tmp_path: Path) -> Path:
    torch.save(MLP(), tmp_path / "whole.pt")
    return tmp_path / "whole.pt"


def _wrapped(tmp_path: Path) -> Path:
    torch.save({"epoch": 2, "model": MLP()}, tmp_path / "wrapped.pt")
    return tmp_path / "wrapped.pt"


def _script(tmp_path: Path) -> Path:
    with pytest.warns(FutureWarning):
        torch.jit.save(torch.jit.script(MLP().eval()), str(tmp_path / "scripted.pt"))
    return tmp_path / "scripted.pt"


def _safetensors(tmp_path: Path) -> Path:
    save_file(MLP().state_dict(), str(tmp_path / "w.safetensors"))
    return tmp_path / "w.safetensors"


def _trusted(**values: Any) -> CheckpointSettings:
    return CheckpointSettings(trust_checkpoint=True, device="cpu", **values)


def test_a_state_dict_key_for_a_bare_pickled_module_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError) as refused:
        load_model(_whole(tmp_path), _trusted(state_dict_key="model"))
    assert refused.value.what == "--state-dict-key"
    assert "a pickled module has no keys above its weights" in refused.value.why


def test_a_state_dict_key_naming_a_pickled_module_loads_it(tmp_path: Path) -> None:
    loaded = load_model(_wrapped(tmp_path), _trusted(state_dict_key="model"))
    assert loaded.form == "pickled_module"
    assert loaded.state_dict_key == "model"
    assert loaded.metadata == {"epoch": "2"}


@pytest.mark.parametrize(
    ("save", "kind"),
    [(_safetensors, "safetensors file"), (_script, "TorchScript archive")],
)
def test_a_state_dict_key_for_a_keyless_file_is_refused_before_loading(
    save, kind: str, tmp_path: Path
) -> None:
    # without trust: the key is refused before the archive's need for trust is
    options = CheckpointSettings(arch=MLP_ARCH, state_dict_key="model", device="cpu")
    with pytest.raises(InputError) as refused:
        load_model(save(tmp_path), options)
    assert refused.value.what == "--state-dict-key"
    assert f"a {kind} has no keys above its weights" in refused.value.why


def test_arch_for_a_pickled_module_is_noted_after_the_files_own_entries(tmp_path: Path) -> None:
    loaded = load_model(_wrapped(tmp_path), _trusted(arch=MLP_ARCH))
    assert list(loaded.metadata.items()) == [("epoch", "2"), ("arch_ignored", MLP_ARCH)]
    assert loaded.arch is None


def test_arch_for_torchscript_is_noted(tmp_path: Path) -> None:
    loaded = load_model(_script(tmp_path), _trusted(arch=MLP_ARCH))
    assert loaded.metadata == {"arch_ignored": MLP_ARCH}


def test_arch_that_builds_the_module_is_not_noted(tmp_path: Path) -> None:
    torch.save(MLP().state_dict(), tmp_path / "w.pt")
    loaded = load_model(tmp_path / "w.pt", _trusted(arch=MLP_ARCH))
    assert loaded.arch == MLP_ARCH
    assert "arch_ignored" not in loaded.metadata
