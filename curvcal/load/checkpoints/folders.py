"""Model folders as checkpoints: a transformers ``save_pretrained`` folder or a timm
``save_for_hf`` folder, its ``config.json`` naming the architecture (:mod:`curvcal.load.models.hf`),
and a PEFT adapter folder over a local base model folder (:mod:`curvcal.load.models.adapters`): the
classifier it was trained on, a causal language model the classifier is built from
(:mod:`curvcal.load.models.causal_base`), or a causal language model it adapts (``task_type
CAUSAL_LM``), which scores the answers of multiple-choice data
(:mod:`curvcal.load.models.choice_scorer`) as a causal-LM folder does.

A folder's ``.bin`` weights go through a weights-only load whatever the options; custom code
named by its config (``auto_map``) needs ``--trust-checkpoint``. A Hugging Face Trainer
``checkpoint-N`` folder is one of these with the Trainer's files beside it: only
``trainer_state.json`` is read (for the step); ``optimizer.pt``, ``scheduler.pt``,
``rng_state.pth`` and ``training_args.bin`` (a pickle of arbitrary objects) are never opened.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from curvcal.errors import InputError
from curvcal.load.checkpoints.loaded_model import LIBRARY_NOTES, ModuleFound, library_notes
from curvcal.load.checkpoints.weights import refuse_unloadable
from curvcal.load.files.pickles import load_state_file
from curvcal.load.files.state_dict import match_keys
from curvcal.load.models.library_limits import library_warnings
from curvcal.settings.checkpoint import CheckpointSettings

if TYPE_CHECKING:
    from curvcal.load.models.adapters import AdapterFolder


def is_folder(path: Path) -> bool:
    """A directory given as a checkpoint: a model folder, or an error saying what one is."""
    if not os.path.isdir(path):  # never raises (a name too long is simply not a folder)
        return False
    from curvcal.load.models.adapters import is_adapter_folder
    from curvcal.load.models.hf import CONFIG_NAME, is_model_folder

    if not is_model_folder(path) and not is_adapter_folder(path):
        why = (
            f"is a directory, not a checkpoint file nor a model folder (it has no {CONFIG_NAME} "
            "nor adapter_config.json)"
        )
        saved = trainer_checkpoints(path)
        if saved:
            shown = ", ".join(folder.name for folder in saved[:_NAMED])
            more = f" and {len(saved) - _NAMED} more" if len(saved) > _NAMED else ""
            raise InputError(
                str(path),
                f"{why}; it holds Trainer checkpoints {shown}{more}",
                f"name one of them, such as the latest, {saved[-1]}",
            )
        raise InputError(
            str(path),
            why,
            "a model folder holds config.json and its weights, as save_pretrained writes them",
        )
    return True


_NAMED = 6  # Trainer checkpoints named in an error; the rest are counted
_TRAINER_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def trainer_checkpoints(path: Path) -> list[Path]:
    """The ``checkpoint-N`` folders a Hugging Face Trainer output folder holds, by step N (the
    latest last); names only, nothing inside is read."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return []
    found = []
    for entry in entries:
        match = _TRAINER_CHECKPOINT.fullmatch(entry.name)
        with contextlib.suppress(OSError):
            if match and entry.is_dir():
                found.append((int(match.group(1)), Path(path) / entry.name))
    return [folder for _, folder in sorted(found)]


def folder_form(library: str) -> str:
    """The form (:data:`curvcal.load.checkpoint.FORMS`) of a folder saved by ``library``."""
    return {"transformers": "hf_folder", "peft": "peft_adapter"}.get(library, "timm_folder")


def trainer_step(path: Path) -> dict[str, str]:
    """``{"trainer_checkpoint": "step N"}`` for a Hugging Face Trainer ``checkpoint-N`` folder
    (one holding ``trainer_state.json``, whose ``global_step`` is N); empty otherwise. Reads
    that JSON file only."""
    from curvcal.load.models.hf import read_json

    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        return {}
    state = read_json(state_file)
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        raise InputError(str(state_file), "has no integer global_step")
    return {"trainer_checkpoint": f"step {step}"}


def load_folder(
    path: Path, options: CheckpointSettings, supplied: tuple[str, ...] = ()
) -> ModuleFound:
    """The model of the folder at ``path``, with its labels, modality and preprocessing.
    ``supplied``: modules whose weights an adapter put on this folder holds (its
    ``modules_to_save``), which the folder may lack."""
    from curvcal.load.models.hf import (
        build_folder_model,
        is_model_folder,
        load_pretrained,
        read_folder,
        read_state,
    )

    if options.arch is not None:
        raise InputError(
            "--arch",
            f"{path} is a model folder, whose config.json names its architecture",
            "drop --arch (hf:FOLDER is for a separate weights file)",
        )
    from curvcal.load.models.adapters import is_adapter_folder

    if is_adapter_folder(path) and not is_model_folder(path):
        return _load_adapter(path, options)
    folder = read_folder(path)
    notes: list[str] = []  # what the libraries warned about, said once by the run
    if folder.library == "timm":
        with library_warnings(folder.library, notes):
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
        module = load_pretrained(folder, options.trust_checkpoint, notes, supplied)
    metadata = {"library": folder.library, **trainer_step(path), **library_notes(notes)}
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


def _load_adapter(path: Path, options: CheckpointSettings) -> ModuleFound:
    """The base model folder with the adapter at ``path`` put on it; the adapter's parameters
    are the trainable ones."""
    from curvcal.load.checkpoints.digest import file_info
    from curvcal.load.models.adapters import apply_adapter, base_folder, read_adapter

    adapter = read_adapter(path)
    if adapter.weights.suffix != ".safetensors":  # scanned, refused if it needs any global
        load_state_file(adapter.weights, options)
    base_path = base_folder(adapter, options.base_model)
    built: dict[str, str] = {}
    from curvcal.load.models.causal_base import is_causal_lm_folder

    if is_causal_lm_folder(base_path) and adapter.config.get("task_type") == "CAUSAL_LM":
        # a language-model adapter: the causal LM with it scores multiple-choice answers
        _refuse_prompt_learning(adapter)
        base = load_folder(base_path, options.replace(base_model=None))
    elif is_causal_lm_folder(base_path):
        base, built = _causal_base(adapter, base_path, options)
    else:
        _refuse_base_without_head(base_path)
        base = load_folder(base_path, options.replace(base_model=None), adapter.modules_to_save)
    module, adapter_notes = apply_adapter(adapter, base.module, options.trust_checkpoint)
    notes = [*base.metadata.get(LIBRARY_NOTES, "").splitlines(), *adapter_notes]
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    metadata = {
        "library": "peft",
        "peft_type": adapter.peft_type,
        "base_model": str(base_path),
        "base_model_sha256": file_info(base_path).sha256,
        "adapter_parameters": f"{len(trainable)} tensors, "
        f"{sum(p.numel() for p in module.parameters() if p.requires_grad):,} elements",
        **built,
        **trainer_step(path),
        **library_notes(notes),
    }
    return ModuleFound(
        module=module,
        form="peft_adapter",
        arch=None,
        metadata=metadata,
        architecture=f"{adapter.peft_type} adapter on {base.architecture}",
        labels=base.labels,
        modality=base.modality,
        preprocessing=base.preprocessing,
    )


def _causal_base(
    adapter: AdapterFolder, base_path: Path, options: CheckpointSettings
) -> tuple[ModuleFound, dict[str, str]]:
    """The sequence classifier built from the causal-LM folder ``base_path`` for ``adapter``
    (:mod:`curvcal.load.models.causal_base`), and the metadata saying what was built."""
    from curvcal.load.files.formats import safetensors_specs, sniff
    from curvcal.load.models.causal_base import build_classifier, plan_classifier
    from curvcal.load.models.hf import folder_files

    for file in folder_files(base_path):
        if file.suffix == ".bin":  # scanned, refused if it needs any global
            load_state_file(file, options)
    if adapter.weights.suffix == ".safetensors":
        shapes = {s.name: s.shape for s in safetensors_specs(sniff(adapter.weights).header)}
    else:
        state = load_state_file(adapter.weights, options)
        shapes = {k: tuple(v.shape) for k, v in state.items()}
    plan = plan_classifier(adapter, base_path, shapes, options.trust_checkpoint)
    notes: list[str] = []
    found = ModuleFound(
        module=build_classifier(plan, options.trust_checkpoint, notes),
        form="hf_folder",
        metadata=library_notes(notes),
        architecture=plan.classifier,
        modality="text",
    )
    return found, {"sequence_classifier": plan.classifier, "classifier_built": plan.describe()}


#: peft's prompt-learning methods: they add virtual tokens to the inputs rather than act inside
#: the model's layers
PROMPT_LEARNING = frozenset(
    {"PROMPT_TUNING", "MULTITASK_PROMPT_TUNING", "P_TUNING", "PREFIX_TUNING", "CPT"}
)


def _refuse_prompt_learning(adapter: AdapterFolder) -> None:
    """A prompt-learning adapter changes the inputs the decoder reads (virtual tokens), which
    answers scored from the decoder's hidden states would leave out."""
    if adapter.peft_type in PROMPT_LEARNING:
        raise InputError(
            str(adapter.path / "adapter_config.json"),
            f"is a {adapter.peft_type} adapter, which adds virtual tokens to the inputs; "
            "answers are scored for adapters that act inside the layers (LoRA and its kin)",
        )


def _refuse_base_without_head(base_path: Path) -> None:
    """A base folder holding neither a classifier nor a causal language model (a bare
    ``LlamaModel``, say) is not what an adapter's head was trained on: say how to save that
    classifier."""
    from curvcal.load.models.hf import CONFIG_NAME, TASKS, read_json

    config = read_json(base_path / CONFIG_NAME)
    names = config.get("architectures") if isinstance(config, dict) else None
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    if name is not None and not name.endswith(tuple(TASKS)):
        raise InputError(
            str(base_path),
            f"holds a {name}, not the classifier the adapter was trained on",
            "save that classifier once with AutoModelForSequenceClassification.from_pretrained"
            "(BASE, num_labels=K).save_pretrained(DIR) and pass --base-model DIR",
        )
