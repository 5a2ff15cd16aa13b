"""Model folders as checkpoints: a transformers ``save_pretrained`` folder or a timm
``save_for_hf`` folder, its ``config.json`` naming the architecture (:mod:`curvcal.load.hf`).

A folder's ``.bin`` weights go through a weights-only load whatever the options; custom code
named by its config (``auto_map``) needs ``--trust-checkpoint``.
"""

from __future__ import annotations

import os
from pathlib import Path

from curvcal.errors import InputError
from curvcal.load.loaded_model import ModuleFound
from curvcal.load.pickles import load_state_file
from curvcal.load.state_dict import match_keys
from curvcal.load.weights import refuse_unloadable
from curvcal.settings.checkpoint import CheckpointSettings


def is_folder(path: Path) -> bool:
    """A directory given as a checkpoint: a model folder, or an error saying what one is."""
    if not os.path.isdir(path):  # never raises (a name too long is simply not a folder)
        return False
    from curvcal.load.hf import CONFIG_NAME, is_model_folder

    if not is_model_folder(path):
        raise InputError(
            str(path),
            f"is a directory, not a checkpoint file nor a model folder (it has no {CONFIG_NAME})",
            "a model folder holds config.json and its weights, as save_pretrained writes them",
        )
    return True


def folder_form(library: str) -> str:
    """The form (:data:`curvcal.load.checkpoint.FORMS`) of a folder saved by ``library``."""
    return "hf_folder" if library == "transformers" else "timm_folder"


def load_folder(path: Path, options: CheckpointSettings) -> ModuleFound:
    """The model of the folder at ``path``, with its labels, modality and preprocessing."""
    from curvcal.load.hf import build_folder_model, load_pretrained, read_folder, read_state

    if options.arch is not None:
        raise InputError(
            "--arch",
            f"{path} is a model folder, whose config.json names its architecture",
            "drop --arch (hf:FOLDER is for a separate weights file)",
        )
    folder = read_folder(path)
    if folder.library == "timm":
        module = build_folder_model(folder, options.trust_checkpoint)
        state = read_state(folder, lambda file: load_state_file(file, options))
        match = match_keys(state, module.state_dict())
        if not match.ok:
            raise InputError(
                str(path), f"weights do not fit its config.json: {match.describe_problems()}"
            )
        refuse_unloadable(path, match.renamed, module)
        module.load_state_dict(match.renamed, strict=True)
    else:
        for file in folder.weights:
            if file.suffix != ".safetensors":  # scanned, refused if it needs any global
                load_state_file(file, options)
        module = load_pretrained(folder, options.trust_checkpoint)
    metadata = {"library": folder.library}
    if folder.custom_code:
        metadata["custom_code"] = ", ".join(folder.custom_code)
    return ModuleFound(
        module=module,
        form=folder_form(folder.library),
        arch=None,
        metadata=metadata,
        architecture=folder.architecture,
        labels=folder.labels,
        modality=folder.modality,
        preprocessing=folder.preprocessing,
    )
