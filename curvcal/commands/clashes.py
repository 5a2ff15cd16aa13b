"""No output replaces an input: every file a run writes is compared with every file it reads.

A run names its inputs (checkpoints, model folders, data files or folders, fit data, logits,
policy, baseline, calibrators) and its outputs (``-o``, ``--plot``, ``--save-logits``, ``--save-calibrator``, the
files of a plot folder) once, and :func:`refuse_clashes` refuses, before any work and whatever
``--force`` says:

* an output that is an input: the same resolved path (symlinks and ``..`` followed) or, when
  both exist, the same file (``st_dev``, ``st_ino``: a hard link);
* an output inside an input folder (an image folder or a model folder, say): a plot written
  there would become one more sample of the dataset, and the folder's digest in the report
  would no longer describe what was read;
* two outputs naming the same file (one would silently replace the other).

The inputs named here are those known when the options are parsed; they join the run's record
of every file it opens (:mod:`curvcal.inputs`), whose check at publication covers the files
found later (an adapter's base model folder). Both checks use the same identity and the same
refusal. Each refusal is one line naming the output with its option and the input it would
replace.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from curvcal.errors import InputError
from curvcal.inputs import Identity, Input, Named, identity, recorded, refuse_input_target

if TYPE_CHECKING:
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings

__all__ = [
    "Named",
    "arch_inputs",
    "checkpoint_inputs",
    "data_inputs",
    "model_and_data_inputs",
    "refuse_clashes",
    "tokenizer_inputs",
]


def data_inputs(option: str, spec: object, data_root: object = None) -> list[Named]:
    """The files or folder a ``--data``-style SPEC reads: a ``folder:`` dataset, a tensor
    file, a text table (``.jsonl``, ``.csv``, ``.parquet``), a ``save_to_disk`` folder (its
    ``state.json`` and ``.arrow`` files), and for ``tv:`` the dataset root (``data_root``,
    ``./data`` by default) whose raw files torchvision reads. Nothing for ``py:``, whose files
    its own code finds, nor for a missing or malformed SPEC, which the data loader reports."""
    if not isinstance(spec, str) or not spec:
        return []
    if spec.startswith("folder:"):
        return [(option, Path(spec[len("folder:") :]))]
    if spec.startswith("curvcal:"):
        from curvcal.assets import demo_data

        return [(option, demo_data())]
    if spec.startswith("tv:"):
        root = Path(str(data_root)) if data_root else Path("data")
        return [("--data-root" if option.startswith("--") else "data_root", root)]
    if spec.startswith("py:"):
        return []
    from curvcal.load.files.tensorfile import is_tensor_file

    path = Path(spec)
    if is_tensor_file(path):
        return [(option, path)]
    from curvcal.load.texts.text import TEXT_SUFFIXES, is_text_spec, split_spec

    if path.suffix.lower() in TEXT_SUFFIXES:
        return [(option, path)]
    if is_text_spec(spec):
        return [(option, split_spec(spec)[0])]  # the whole saved-dataset folder
    return []


def tokenizer_inputs(option: str, folder: object) -> list[Named]:
    """The ``--tokenizer`` folder (its ``tokenizer.json``, vocabulary and configs are read).
    A tokenizer found in the model folder is covered by that folder's own entry."""
    if isinstance(folder, str | Path) and str(folder):
        return [(option, Path(folder))]
    return []


def checkpoint_inputs(
    name: str, path: Path, arch: object = None, base_model: object = None
) -> list[Named]:
    """The checkpoint, and what it names that is read with it: a model folder its safetensors
    metadata names (``curvcal.arch = hf:FOLDER``) when no ``--arch`` is given (that folder's
    ``config.json`` is read too), and an adapter folder's base model folder (``--base-model``,
    else the one its ``adapter_config.json`` names). Only headers and JSON configs are read;
    no tensor and no code is loaded. A base model folder found later is refused all the same,
    when the output is published (:mod:`curvcal.inputs`); named here, it is refused before any
    work."""
    named: list[Named] = [(name, path)]
    if isinstance(base_model, str | Path) and str(base_model):
        named.append(("--base-model", Path(base_model)))
    from curvcal.errors import CurvcalError

    if base_model is None:
        from curvcal.load.models.adapters import base_folder, is_adapter_folder, read_adapter

        # a missing or bad base: the loader reports it in its own words
        if is_adapter_folder(path):
            with suppress(CurvcalError, OSError, ValueError):
                named.append((f"{name}'s base model", base_folder(read_adapter(path), None)))
    if arch is not None or path.suffix.lower() != ".safetensors" or not path.is_file():
        return named
    from curvcal.load.checkpoints.metadata import ARCH_METADATA_KEY
    from curvcal.load.files.tensorfile import read_safetensors_metadata

    try:
        metadata = read_safetensors_metadata(path)
    except (CurvcalError, OSError, ValueError):
        return named  # the loader reports a bad header in its own words
    label = f"{name}'s metadata {ARCH_METADATA_KEY}"
    return [*named, *arch_inputs(label, metadata.get(ARCH_METADATA_KEY))]


def arch_inputs(option: str, spec: object) -> list[Named]:
    """The model folder an ``--arch hf:FOLDER`` spec reads (nothing for other specs, whose
    code comes from installed packages)."""
    if isinstance(spec, str) and spec.startswith("hf:") and len(spec) > len("hf:"):
        return [(option, Path(spec[len("hf:") :]))]
    return []


def model_and_data_inputs(
    checkpoint: Path,
    checkpoint_options: CheckpointSettings,
    data_options: DataSettings,
    more_data: Sequence[tuple[str, object]] = (),
) -> list[Named]:
    """The inputs of a command that runs CHECKPOINT on ``--data``: the checkpoint and what it
    names (:func:`checkpoint_inputs`), ``--arch``, ``--data`` and the command's other data
    options (``more_data``: ``(option, SPEC)`` pairs such as ``("--fit-data", spec)``), and
    ``--tokenizer``."""
    arch, root = checkpoint_options.arch, data_options.data_root
    return [
        *checkpoint_inputs("CHECKPOINT", checkpoint, arch, checkpoint_options.base_model),
        *arch_inputs("--arch", arch),
        *data_inputs("--data", data_options.data, root),
        *(named for option, spec in more_data for named in data_inputs(option, spec, root)),
        *tokenizer_inputs("--tokenizer", data_options.tokenizer),
    ]


def refuse_clashes(outputs: Sequence[Named], inputs: Sequence[Named]) -> None:
    """Raise :class:`InputError` when an output is an input, lies inside an input folder, or
    names the same file as another output. ``outputs`` are ``(option, path)``; ``inputs`` are
    ``(option or argument, path)``, checked together with every input the run has recorded so
    far (:func:`curvcal.inputs.recorded`)."""
    read = [
        *(Input(name, Path(path), identity(Path(path)), declared=True) for name, path in inputs),
        *recorded(),
    ]
    written: list[tuple[str, Path, Identity]] = []
    for option, path in outputs:
        target = refuse_input_target(option, path, read)
        for other_option, other, other_identity in written:
            if target.same_file(other_identity):
                raise InputError(
                    f"{option} {path}",
                    f"names the same file as {other_option} {other}",
                    "give each output its own file",
                )
        written.append((option, path, target))
