"""Describe a checkpoint without running any code it carries (``curvcal inspect``).

Pickles are scanned opcode by opcode; only when every global they need is allowlisted (torch's
weights-only list plus ``--allow-global``) are they loaded, with
``torch.load(weights_only=True)``. TorchScript and exported programs are read as archives,
safetensors files from their header, model folders from their ``config.json`` and weights.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from curvcal import jsontext
from curvcal.errors import InputError
from curvcal.inputs import record
from curvcal.load.checkpoints.folders import folder_form, is_folder
from curvcal.load.files.allowlist import could_be_allowed
from curvcal.load.files.formats import (
    Container,
    TensorSpec,
    dtype_name,
    pickle_string_pairs,
    plain_pickle_globals,
    pt2_weight_specs,
    refuse_foreign_folder,
    safetensors_metadata,
    safetensors_specs,
    sniff,
    unsafe_globals,
)
from curvcal.load.files.pickles import (
    import_globals,
    is_module_like,
    outside_torch_allowlist,
    type_name,
    weights_only_load,
)
from curvcal.load.files.state_dict import (
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
    ``detected_prefix`` is a ``module.``/``_orig_mod.`` prefix shared by every key, or else the
    first part every key shares (a Lightning module's attribute, ``net.``), which loading
    strips when the architecture's keys lack it (``prefix_is_wrapper``: the first kind, always
    stripped). ``parameter_count`` counts the elements of the
    floating-point tensors that are parameters: a pickled module says which; in a state dict,
    every floating-point tensor but BatchNorm's running statistics (:data:`BUFFER_NAMES`),
    counted in ``buffer_count``. ``num_classes`` is the row count of the last 2-D weight.
    ``unsafe_globals`` are the classes and functions a pickle would import that a weights-only
    load refuses; the tensors of such a pickle are not listed. When each of them is a plain
    data class ``--allow-global`` admits (``argparse.Namespace``), they are also in
    ``needs_allow_global`` and ``needs_trust`` is false; otherwise, or when the format carries
    code, ``needs_trust`` is true. ``recorded_arch`` is the model name the file records
    (``model = 'resnet18'``, torchvision's reference scripts' ``args.model``, timm's ``arch``, a
    Lightning hyper-parameter, or the ``architectures`` of a ``config.json`` beside the file)
    and ``suggested_arch`` the ``--arch`` it names, when curvcal knows one. A plain Python pickle (not written by
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
    buffer_count: int | None = None
    prefix_is_wrapper: bool = False
    needs_allow_global: tuple[str, ...] = ()
    recorded_arch: str | None = None
    suggested_arch: str | None = None


#: The floating-point tensors of a state dict that are buffers, not parameters, by their last
#: name part: BatchNorm's (and InstanceNorm's) running statistics.
BUFFER_NAMES = ("running_mean", "running_var")
#: Keys under which training code records the model's name: torchvision's reference scripts
#: (``args.model``), timm's train.py (``arch``), Lightning hyper-parameters.
ARCH_HINT_KEYS = ("arch", "model", "model_name", "architecture", "backbone", "network")
#: what a model name recorded in a file looks like: a 200,000-character string under ``arch``
#: is none (it filled thousands of lines of ``inspect``'s table)
_MODEL_NAME = re.compile(r"[A-Za-z][\w.-]{0,199}\Z")


def inspect_checkpoint(path: str | Path, allow_globals: tuple[str, ...] = ()) -> CheckpointInfo:
    """Describe the checkpoint at ``path`` without running any code it carries.

    Pickles are scanned opcode by opcode; only when every global they need is allowlisted
    (torch's weights-only list plus ``allow_globals``) are they loaded, with
    ``torch.load(weights_only=True)``. TorchScript and exported programs are read as archives.
    """
    path = Path(path)
    allowed = import_globals(allow_globals)
    refuse_foreign_folder(path)
    if is_folder(path):
        return _inspect_folder(path, allow_globals)
    container = sniff(path)
    if container.kind == "safetensors":
        specs = safetensors_specs(container.header)
        info = _info(
            path, "safetensors", container, specs, metadata=safetensors_metadata(container.header)
        )
        recorded, suggested = _arch_hint(path, container)
        return dataclasses.replace(info, recorded_arch=recorded, suggested_arch=suggested)
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
    hints = _arch_hint(path, container)
    if scan.names:
        admissible = form == "state_dict" and all(could_be_allowed(n) for n in scan.names)
        info = _info(
            path,
            form,
            container,
            (),
            top_level_type=scan.top_level,
            unsafe=scan.names,
            needs_trust=not admissible,
        )
        return dataclasses.replace(
            info,
            needs_allow_global=scan.names if admissible else (),
            recorded_arch=hints[0],
            suggested_arch=hints[1],
        )
    obj = weights_only_load(path, allowed)
    if isinstance(obj, nn.Module):
        specs = _specs(obj.state_dict())
        info = _info(path, "pickled_module", container, specs, top_level_type=type_name(obj))
        parameters = sum(p.numel() for p in obj.parameters() if p.is_floating_point())
        return dataclasses.replace(
            info,
            parameter_count=parameters,
            buffer_count=sum(b.numel() for b in obj.buffers() if b.is_floating_point()),
        )
    try:
        key, state = find_state_dict(obj)
    except LookupError:
        key, state = None, {}
    specs = _specs(state) if is_state_dict(state) else ()
    info = _info(
        path,
        "state_dict",
        container,
        specs,
        top_level_type=type_name(obj),
        top_level_keys=top_level_keys(obj),
        state_dict_key=key,
        metadata=scalar_extras(obj, key),
    )
    recorded = obj.get("arch") if isinstance(obj, Mapping) else None
    if isinstance(recorded, str) and _MODEL_NAME.match(recorded):
        # a top-level "arch" is what timm's train.py records: timm's model of that name first
        hints = f"arch = {recorded!r}", _arch_spec(recorded, timm_first=True)
    return dataclasses.replace(info, recorded_arch=hints[0], suggested_arch=hints[1])


def _inspect_folder(path: Path, allow_globals: tuple[str, ...]) -> CheckpointInfo:
    from curvcal.load.checkpoints.folders import trainer_step
    from curvcal.load.models.adapters import is_adapter_folder
    from curvcal.load.models.hf import is_causal_lm, is_model_folder, read_folder

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
    causal = is_causal_lm(folder.architecture)
    if causal:
        metadata["scores"] = "the answers of multiple-choice data (K from the data)"
    info = _info(
        path,
        folder_form(folder.library),
        Container(kind="folder"),
        tuple(specs),
        metadata=metadata,
        needs_trust=bool(folder.custom_code),
    )
    num_classes = len(folder.labels) if folder.labels else info.num_classes
    if causal:  # a classifier over the answers of its data: K is the data's
        num_classes = None
    return dataclasses.replace(
        info, architecture=folder.architecture, labels=folder.labels, num_classes=num_classes
    )


def _inspect_adapter(path: Path, allow_globals: tuple[str, ...]) -> CheckpointInfo:
    """A PEFT adapter folder from its config and weight header: its tensors, peft type, the
    base model it names, rank and targets (the base is not read)."""
    from curvcal.load.checkpoints.folders import trainer_step
    from curvcal.load.models.adapters import code_entries, read_adapter

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
    buffers = [s for s in floating if s.name.rsplit(".", 1)[-1] in BUFFER_NAMES]
    count = sum(_numel(s.shape) for s in floating) if specs else None
    buffer_count = sum(_numel(s.shape) for s in buffers) if specs else None
    names = [s.name for s in specs]
    return CheckpointInfo(
        path=path,
        format=form,
        container=container.kind,
        top_level_type=top_level_type,
        top_level_keys=top_level_keys,
        state_dict_key=state_dict_key,
        detected_prefix=_shared_prefix(names),
        prefix_is_wrapper=bool(names) and wrapper_prefix(names) is not None,
        parameter_count=None if count is None else count - (buffer_count or 0),
        buffer_count=buffer_count,
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


def _shared_prefix(names: list[str]) -> str | None:
    """A wrapper's ``module.``/``_orig_mod.`` prefix, else the first name part every key
    shares (``net.`` of a Lightning module's ``self.net``); ``None`` when there is none."""
    if not names:
        return None
    found = wrapper_prefix(names)
    if found is not None:
        return found
    first = {name.split(".", 1)[0] for name in names}
    if len(first) == 1 and all("." in name for name in names):
        return f"{first.pop()}."
    return None


def _arch_hint(path: Path, container: Container) -> tuple[str | None, str | None]:
    """(``recorded_arch``, ``suggested_arch``) (see :class:`CheckpointInfo`): a model name
    recorded in the pickle's dicts (read opcode by opcode, never run), else the architecture a
    ``config.json`` beside the file names."""
    for key, value in pickle_string_pairs(path, container):
        if key in ARCH_HINT_KEYS and _MODEL_NAME.match(value):
            return f"{key} = {value!r}", _arch_spec(value)
    config = path.parent / "config.json"
    if config.is_file() and config.stat().st_size < 1_000_000:
        record(config, "config.json beside the checkpoint")
        try:
            names = jsontext.loads(config.read_bytes(), str(config)).get("architectures")
        except (ValueError, UnicodeDecodeError, AttributeError, InputError):
            names = None
        if isinstance(names, list) and names and isinstance(names[0], str):
            return f"config.json beside it: architectures = {names[0]!r}", f"hf:{path.parent}"
    return None, None


def _arch_spec(name: str, timm_first: bool = False) -> str | None:
    """The ``--arch`` of a recorded model name: ``tv:NAME`` for a torchvision classifier,
    ``timm:NAME`` for a timm model (when timm is installed), the one of timm first when
    ``timm_first``; ``None`` when neither has it."""
    import importlib.util

    import torchvision

    found = []
    if name in torchvision.models.list_models(module=torchvision.models):
        found.append(f"tv:{name}")
    if importlib.util.find_spec("timm") is not None:
        import timm

        if timm.is_model(name):
            found.insert(0 if timm_first else len(found), f"timm:{name}")
    return found[0] if found else None
