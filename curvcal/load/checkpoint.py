"""Load a classifier checkpoint safely, whatever form it was saved in.

Forms (:data:`FORMS`) and what they need:

====================  ==========================================  ===========================
form                  written by                                  loading needs
====================  ==========================================  ===========================
``state_dict``        ``torch.save(model.state_dict())``, wrapped  ``--arch``
                      or not (``.pt .pth .bin .ckpt``)
``safetensors``       ``safetensors.torch.save_file``              ``--arch`` or the file's
                                                                   ``curvcal.arch`` metadata
``pickled_module``    ``torch.save(model)``                        ``--trust-checkpoint``
``torchscript``       ``torch.jit.save``                           ``--trust-checkpoint``
``exported_program``  ``torch.export.save`` (``.pt2``)             ``--trust-checkpoint``
``hf_folder``         transformers ``save_pretrained`` (a folder)  nothing (``auto_map``:
                                                                   ``--trust-checkpoint``)
``timm_folder``       ``timm.models.save_for_hf`` (a folder)       nothing
``peft_adapter``      peft ``PeftModel.save_pretrained`` (a        a local base model folder
                      folder)                                      (``--base-model``)
====================  ==========================================  ===========================

A state dict saved from a transformers model loads with ``--arch hf:FOLDER`` (the folder's
``config.json``), one from timm with ``--arch timm:NAME`` (:mod:`curvcal.load.models.hf`).

Without trust every pickle goes through ``torch.load(weights_only=True)``
(:mod:`curvcal.load.files.pickles`); nothing here ever falls back to an unsafe load by itself. The
loaded module is a fresh object in eval mode on the requested device and dtype.
:mod:`curvcal.load.checkpoints.inspect` describes a checkpoint without loading it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from curvcal.errors import InputError
from curvcal.load.checkpoints.device import resolve_device, resolve_dtype
from curvcal.load.checkpoints.folders import is_folder, load_folder
from curvcal.load.checkpoints.loaded_model import LoadedModel, ModuleFound, place
from curvcal.load.checkpoints.programs import load_exported, load_torchscript
from curvcal.load.checkpoints.weights import load_pickle, load_safetensors
from curvcal.load.files.formats import refuse_foreign_folder, sniff
from curvcal.load.files.pickles import import_globals, refuse_plain_pickle
from curvcal.settings.checkpoint import CheckpointSettings

FORMS = (
    "state_dict",
    "safetensors",
    "pickled_module",
    "torchscript",
    "exported_program",
    "hf_folder",
    "timm_folder",
    "peft_adapter",
)

#: containers that hold one set of weights with no keys above it, and what to call them
_KEYLESS = {
    "safetensors": "safetensors file",
    "torchscript": "TorchScript archive",
    "pt2": "torch.export archive",
}


def load_model(path: str | Path, options: CheckpointSettings) -> LoadedModel:
    """Load the checkpoint at ``path`` as a fresh module in eval mode on the options' device
    and dtype. Raises :class:`InputError` for a bad file or option and :class:`TrustError` when
    loading would run code from the file without ``options.trust_checkpoint``."""
    path = Path(path)
    device = resolve_device(options.device)
    dtype = resolve_dtype(options.dtype)
    allowed = import_globals(options.allow_global)
    refuse_foreign_folder(path)
    if is_folder(path):
        _refuse_state_dict_key(path, "model folder", options)
        return place(path, load_folder(path, options), device, dtype)
    container = sniff(path)
    if container.kind == "pickle":
        refuse_plain_pickle(path)
    if container.kind in _KEYLESS:
        _refuse_state_dict_key(path, _KEYLESS[container.kind], options)
    if container.kind == "safetensors":
        found = load_safetensors(path, container, options)
    elif container.kind == "torchscript":
        found = load_torchscript(path, options, device)
    elif container.kind == "pt2":
        found = load_exported(path, options, device)
    else:
        found = load_pickle(path, container, options, allowed)
        if found.form == "pickled_module" and found.state_dict_key is None:
            _refuse_state_dict_key(path, "pickled module", options)
    return place(path, _note_ignored_arch(found, options), device, dtype)


def _refuse_state_dict_key(path: Path, kind: str, options: CheckpointSettings) -> None:
    """``--state-dict-key`` names the entry of a pickled dict that holds the weights; for a
    file with no such dict it would be ignored, so a key the user meant for another file (or a
    wrong file) would go unnoticed."""
    if options.state_dict_key is not None:
        raise InputError(
            "--state-dict-key",
            f"{options.state_dict_key!r} means nothing for {path}: a {kind} has no keys "
            "above its weights",
            "drop --state-dict-key",
        )


def _note_ignored_arch(found: ModuleFound, options: CheckpointSettings) -> ModuleFound:
    """A form that carries its own architecture (a pickled module, a program) ignores
    ``--arch``: the metadata says so."""
    if not options.arch or found.arch is not None:
        return found
    return dataclasses.replace(found, metadata={**found.metadata, "arch_ignored": options.arch})
