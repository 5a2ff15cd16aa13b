"""A loaded model: what a container loader found, and the result placed on its device and dtype."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from curvcal.errors import InputError
from curvcal.load.files.formats import dtype_name
from curvcal.load.files.state_dict import infer_num_classes

#: the metadata key of what the libraries warned about while loading, one line each
#: (:func:`~curvcal.load.models.library_limits.library_warnings`), said once by the run
LIBRARY_NOTES = "library_notes"


def library_notes(notes: list[str]) -> dict[str, str]:
    """``{LIBRARY_NOTES: notes one a line}`` for a loader's metadata; empty for no notes."""
    return {LIBRARY_NOTES: "\n".join(dict.fromkeys(notes))} if notes else {}


@dataclass(frozen=True)
class ModuleFound:
    """What a loader read from one checkpoint: the module (on the CPU, or where the archive
    put it) and how it was found."""

    module: nn.Module
    form: str
    arch: str | None = None
    state_dict_key: str | None = None
    stripped_prefix: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    architecture: str | None = None
    labels: tuple[str, ...] = ()
    modality: str | None = None
    preprocessing: dict[str, Any] | None = None


@dataclass(frozen=True)
class LoadedModel:
    """A module loaded from ``path`` (eval mode, on ``device``, in ``dtype``, owned by us) and
    how it was found: the fields of :class:`ModuleFound`, and where it was placed."""

    module: nn.Module
    form: str
    path: Path
    arch: str | None
    state_dict_key: str | None
    stripped_prefix: str | None
    num_classes: int | None
    metadata: dict[str, str]
    device: torch.device
    dtype: torch.dtype
    architecture: str | None = None
    labels: tuple[str, ...] = ()
    modality: str | None = None
    preprocessing: dict[str, Any] | None = None

    def _model_facts(self) -> dict[str, Any]:
        """Architecture, ``id2label``, modality and preprocessing, for the models that record
        them (model folders, ``hf:`` and ``timm:`` architectures)."""
        if self.architecture is None:
            return {}
        return {
            "architecture": self.architecture,
            "id2label": list(self.labels) or None,
            "modality": self.modality,
            "preprocessing": self.preprocessing,
        }

    @property
    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary for a report's inputs (everything but the module): the file's
        path, size and SHA-256, then how it was loaded."""
        from curvcal.load.checkpoints.digest import file_info

        return {
            **asdict(file_info(self.path)),
            "form": self.form,
            "arch": self.arch,
            "state_dict_key": self.state_dict_key,
            "stripped_prefix": self.stripped_prefix,
            "num_classes": self.num_classes,
            "parameter_count": self.parameter_count,
            **self._model_facts(),
            "metadata": dict(self.metadata),
            "device": str(self.device),
            "dtype": dtype_name(self.dtype),
        }


def place(path: Path, found: ModuleFound, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Move the found module to ``device`` and ``dtype`` in eval mode (an exported program
    keeps the mode it was exported in); ``num_classes`` from its labels, else its last 2-D
    weight."""
    from curvcal.load.models.choice_scorer import as_choice_scorer, scores_choices

    # a causal language model (or an adapter over one) is a classifier over answers, whatever
    # loaded it
    found = replace(found, module=as_choice_scorer(found.module))
    _refuse_non_finite(found.module, str(path), "the file's")
    found.module.to(device=device, dtype=dtype)
    if dtype == torch.float16:  # the one dtype of a narrower range than the weights' own
        _refuse_non_finite(found.module, "--dtype", "float16's", overflow=True)
    if found.form != "exported_program":
        found.module.eval()
    shapes = [(name, tuple(t.shape)) for name, t in found.module.state_dict().items()]
    if scores_choices(found.module):  # K is the data's answer count, not a head's width
        num_classes = None
    else:
        num_classes = len(found.labels) if found.labels else infer_num_classes(shapes)
    return LoadedModel(
        **vars(found), path=path, num_classes=num_classes, device=device, dtype=dtype
    )


def _refuse_non_finite(module: nn.Module, what: str, whose: str, overflow: bool = False) -> None:
    """An :class:`InputError` naming ``what`` and the first parameter holding a NaN or an
    infinity: a model whose training diverged, or (``overflow``) a weight past float16's range
    (65504) once cast. Every product and metric computed from it would be NaN, and the error
    would otherwise fall on the data, exit 3. Buffers are left alone: a mask of -inf is one on
    purpose."""
    for name, parameter in module.named_parameters():
        if not parameter.is_floating_point() or parameter.is_meta:
            continue
        values = parameter.detach()
        # a NaN or an infinity makes the sum one too, so a finite sum clears the whole tensor
        # (18 times faster than isfinite over it); an infinite sum may be an overflow of finite
        # values, which the element-wise test tells apart
        wide = torch.float32 if values.dtype in (torch.float16, torch.bfloat16) else None
        if bool(torch.isfinite(values.sum(dtype=wide))):
            continue
        bad = int((~torch.isfinite(values)).sum())
        if not bad:
            continue
        if overflow:
            raise InputError(
                what,
                f"float16 cannot hold the model's parameter {name}: {bad} of its "
                f"{parameter.numel()} values overflow float16's range (±65504)",
                "use --dtype bfloat16 or float32",
            )
        raise InputError(
            what,
            f"parameter {name} holds {bad} NaN or infinite value{'s' if bad > 1 else ''} (of "
            f"{parameter.numel()}) in {whose} weights; every product and metric would be NaN",
            "check the training run that saved it",
        )
