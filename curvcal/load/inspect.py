"""Describe a checkpoint without running any code it carries (``curvcal inspect``).

Pickles are scanned opcode by opcode; only when every global they need is allowlisted (torch's
weights-only list plus ``--allow-global``) are they loaded, with
``torch.load(weights_only=True)``. TorchScript and exported programs are read as archives,
safetensors files from their header, model folders from their ``config.json`` and weights.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from curvcal.load.folders import folder_form, is_folder
from curvcal.load.formats import (
    Container,
    TensorSpec,
    dtype_name,
    plain_pickle_globals,
    pt2_weight_specs,
    safetensors_metadata,
    safetensors_specs,
    sniff,
    unsafe_globals,
)
from curvcal.load.pickles import (
    import_globals,
    is_module_like,
    outside_torch_allowlist,
    type_name,
    weights_only_load,
)
from curvcal.load.state_dict import (
    find_state_dict,
    infer_num_classes,
    is_state_dict,
    scalar_extras,
    top_level_keys,
    wrapper_prefix,
)

PLAIN_PICKLE = "plain_pickle"
PLAIN_PICKLE_NOTE = "a plain Python pickle, not a torch.save checkpoint: curvcal cannot load it"


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint holds, read without running any of its code.

    ``format`` is one of :data:`curvcal.load.checkpoint.FORMS`; ``container`` the file layout
    (``torch-zip``, ``torch-legacy``, ``safetensors``, ``torchscript``, ``pt2``).
    ``detected_prefix`` is a ``module.``/``_orig_mod.`` prefix shared by every key (others need
    the architecture to tell). ``parameter_count`` counts the elements of all floating-point
    tensors (a state dict does not say which are parameters and which are buffers such as
    BatchNorm statistics). ``num_classes`` is the row count of the last 2-D weight.
    ``unsafe_globals`` are the classes and functions a pickle would import that a weights-only
    load refuses; when there are any, or the format carries code, ``needs_trust`` is true and
    the tensors are not listed (pickles). A plain Python pickle (not written by
    :func:`torch.save`) has format ``plain_pickle``, lists every global it would import in
    ``pickle_globals`` and cannot be loaded as a checkpoint. A model folder (``hf_folder``,
    ``timm_folder``) also gives its ``architecture`` and its ``labels`` (``id2label`` in index
    order), and needs trust when its config names custom code.
    """

    path: Path
    format: str
    container: str
    top_level_type: str | None
    top_level_keys: tuple[str, ...]
    state_dict_key: str | None
    detected_prefix: str | None
    parameter_count: int | None
    tensors: tuple[TensorSpec, ...]
    num_classes: int | None
    metadata: dict[str, str]
    unsafe_globals: tuple[str, ...]
    needs_trust: bool
    pickle_globals: tuple[str, ...] = ()
    architecture: str | None = None
    labels: tuple[str, ...] = ()


def inspect_checkpoint(path: str | Path, allow_globals: tuple[str, ...] = ()) -> CheckpointInfo:
    """Describe the checkpoint at ``path`` without running any code it carries.

    Pickles are scanned opcode by opcode; only when every global they need is allowlisted
    (torch's weights-only list plus ``allow_globals``) are they loaded, with
    ``torch.load(weights_only=True)``. TorchScript and exported programs are read as archives.
    """
    path = Path(path)
    allowed = import_globals(allow_globals)
    if is_folder(path):
        return _inspect_folder(path, allow_globals)
    container = sniff(path)
    if container.kind == "safetensors":
        specs = safetensors_specs(container.header)
        return _info(
            path, "safetensors", container, specs, metadata=safetensors_metadata(container.header)
        )
    if container.kind == "pt2":
        return _info(path, "exported_program", container, pt2_weight_specs(path), needs_trust=True)
    if container.kind == "torchscript":
        return _info(path, "torchscript", container, (), needs_trust=True)
    if container.kind == "pickle":
        names = plain_pickle_globals(path)
        info = _info(path, PLAIN_PICKLE, container, (), unsafe=outside_torch_allowlist(names))
        return dataclasses.replace(info, pickle_globals=names, metadata={"note": PLAIN_PICKLE_NOTE})
    scan = unsafe_globals(path, container, allow_globals, allowed)
    form = "pickled_module" if is_module_like(scan) else "state_dict"
    if scan.names:
        return _info(
            path,
            form,
            container,
            (),
            top_level_type=scan.top_level,
            unsafe=scan.names,
            needs_trust=True,
        )
    obj = weights_only_load(path, allowed)
    if isinstance(obj, nn.Module):
        specs = _specs(obj.state_dict())
        return _info(path, "pickled_module", container, specs, top_level_type=type_name(obj))
    try:
        key, state = find_state_dict(obj)
    except LookupError:
        key, state = None, {}
    specs = _specs(state) if is_state_dict(state) else ()
    return _info(
        path,
        "state_dict",
        container,
        specs,
        top_level_type=type_name(obj),
        top_level_keys=top_level_keys(obj),
        state_dict_key=key,
        metadata=scalar_extras(obj, key),
    )


def _inspect_folder(path: Path, allow_globals: tuple[str, ...]) -> CheckpointInfo:
    from curvcal.load.adapters import is_adapter_folder
    from curvcal.load.folders import trainer_step
    from curvcal.load.hf import is_model_folder, read_folder

    if is_adapter_folder(path) and not is_model_folder(path):
        return _inspect_adapter(path, allow_globals)
    folder = read_folder(path)
    specs: list[TensorSpec] = []
    for file in folder.weights:
        if file.suffix == ".safetensors":
            specs.extend(safetensors_specs(sniff(file).header))
        else:
            specs.extend(inspect_checkpoint(file, allow_globals).tensors)
    metadata = {"library": folder.library, "modality": folder.modality, **trainer_step(path)}
    for key in ("model_type", "problem_type"):
        if isinstance(folder.config.get(key), str):
            metadata[key] = folder.config[key]
    if folder.custom_code:
        metadata["custom_code"] = ", ".join(folder.custom_code)
    if folder.preprocessing:
        metadata["preprocessing"] = json.dumps(folder.preprocessing)
    info = _info(
        path,
        folder_form(folder.library),
        Container(kind="folder"),
        tuple(specs),
        metadata=metadata,
        needs_trust=bool(folder.custom_code),
    )
    num_classes = len(folder.labels) if folder.labels else info.num_classes
    return dataclasses.replace(
        info, architecture=folder.architecture, labels=folder.labels, num_classes=num_classes
    )


def _inspect_adapter(path: Path, allow_globals: tuple[str, ...]) -> CheckpointInfo:
    """A PEFT adapter folder from its config and weight header: its tensors, peft type, the
    base model it names, rank and targets (the base is not read)."""
    from curvcal.load.adapters import code_entries, read_adapter
    from curvcal.load.folders import trainer_step

    adapter = read_adapter(path)
    if adapter.weights.suffix == ".safetensors":
        specs = safetensors_specs(sniff(adapter.weights).header)
    else:
        specs = inspect_checkpoint(adapter.weights, allow_globals).tensors
    metadata = {"library": "peft", "peft_type": adapter.peft_type, **trainer_step(path)}
    metadata["base_model"] = adapter.base_named or "(none named: pass --base-model)"
    for key in ("task_type", "r", "lora_alpha", "target_modules", "modules_to_save"):
        value = adapter.config.get(key)
        if value is not None and value != []:
            metadata[key] = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    entries = code_entries(adapter)
    if entries:
        metadata["custom_code"] = ", ".join(entries)
    info = _info(
        path,
        "peft_adapter",
        Container(kind="folder"),
        tuple(specs),
        metadata=metadata,
        needs_trust=bool(entries),
    )
    # classes: rows of a saved head (modules_to_save), never of a LoRA matrix
    heads = [
        spec.shape[0]
        for spec in specs
        if len(spec.shape) == 2
        and "lora_" not in spec.name
        and any(f".{m}." in f".{spec.name}" for m in adapter.modules_to_save)
    ]
    return dataclasses.replace(info, num_classes=heads[-1] if heads else None)


def _info(
    path: Path,
    form: str,
    container: Container,
    specs: tuple[TensorSpec, ...],
    *,
    top_level_type: str | None = None,
    top_level_keys: tuple[str, ...] = (),
    state_dict_key: str | None = None,
    metadata: dict[str, str] | None = None,
    unsafe: tuple[str, ...] = (),
    needs_trust: bool = False,
) -> CheckpointInfo:
    floating = [s for s in specs if s.dtype.startswith(("float", "bfloat", "complex"))]
    count = sum(_numel(s.shape) for s in floating) if specs else None
    names = [s.name for s in specs]
    return CheckpointInfo(
        path=path,
        format=form,
        container=container.kind,
        top_level_type=top_level_type,
        top_level_keys=top_level_keys,
        state_dict_key=state_dict_key,
        detected_prefix=wrapper_prefix(names) if names else None,
        parameter_count=count,
        tensors=specs,
        num_classes=infer_num_classes([(s.name, s.shape) for s in specs]),
        metadata=metadata or {},
        unsafe_globals=unsafe,
        needs_trust=needs_trust,
    )


def _specs(state: Mapping[str, Any]) -> tuple[TensorSpec, ...]:
    return tuple(
        TensorSpec(str(k), tuple(v.shape), dtype_name(v.dtype))
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
    )


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
