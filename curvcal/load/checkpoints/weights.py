"""Weights into the module they belong to: a state dict (from a pickle, scanned and loaded by
:mod:`curvcal.load.files.pickles`, or a safetensors file) loaded into the architecture that
``--arch``, or the file's own metadata, names; a pickled module as it is.

The architecture's ``num_classes`` is ``--num-classes``, else the row count of the last 2-D
weight when the architecture takes that keyword. The keys must match the module's after a
wrapper prefix (``module.``, ``_orig_mod.``) is stripped (:mod:`curvcal.load.files.state_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from curvcal.errors import InputError, TrustError, one_line
from curvcal.load.checkpoints.loaded_model import ModuleFound, library_notes
from curvcal.load.checkpoints.metadata import ARCH_METADATA_KEY, recorded_arch_kwargs
from curvcal.load.files.formats import Container, safetensors_metadata, unsafe_globals
from curvcal.load.files.pickles import (
    full_load,
    is_module_like,
    refusal_hint,
    type_name,
    weights_only_load,
)
from curvcal.load.files.state_dict import (
    find_state_dict,
    infer_num_classes,
    is_state_dict,
    match_keys,
    scalar_extras,
    top_level_keys,
    unloadable_tensors,
)
from curvcal.load.models.architecture import accepts_keyword, build_architecture
from curvcal.settings.checkpoint import CheckpointSettings


def load_pickle(
    path: Path, container: Container, options: CheckpointSettings, allowed: list[Any]
) -> ModuleFound:
    """A pickled module, or the state dict in a pickle (under ``--state-dict-key`` or a
    wrapper key such as ``state_dict``) loaded into ``--arch``."""
    scan = unsafe_globals(path, container, options.allow_global, allowed)
    if scan.names and not options.trust_checkpoint:
        module_like = is_module_like(scan)
        what = f"is a pickled {scan.top_level} object" if module_like else "is a pickle"
        raise TrustError(
            str(path),
            f"{what} that needs {', '.join(scan.names)} to load, which a weights-only load refuses "
            "and a full unpickling could use to run code",
            refusal_hint(scan.names, module_like),
        )
    # With trust and globals outside the allowlist, the full unpickler; otherwise weights-only.
    obj = full_load(path) if scan.names else weights_only_load(path, allowed)
    if isinstance(obj, nn.Module):
        return ModuleFound(module=obj, form="pickled_module")
    try:
        key, state = find_state_dict(obj, options.state_dict_key)
    except KeyError:
        keys = ", ".join(top_level_keys(obj)[:20]) or "none: the file holds no mapping"
        raise InputError(
            "--state-dict-key", f"{options.state_dict_key!r} is not a key of {path} (keys: {keys})"
        ) from None
    except LookupError:
        keys = ", ".join(top_level_keys(obj)[:20])
        raise InputError(
            str(path),
            f"holds a {type_name(obj)} with no state dict"
            + (f" (top-level keys: {keys})" if keys else ""),
            "name the key holding the weights with --state-dict-key",
        ) from None
    extras = scalar_extras(obj, key)
    if isinstance(state, nn.Module):
        return ModuleFound(state, "pickled_module", state_dict_key=key, metadata=extras)
    if not is_state_dict(state):
        raise InputError(str(path), f"the value under {key!r} is not a state dict (str -> tensor)")
    return from_state_dict(
        path, "state_dict", state, key, options.arch, dict(options.keywords), options, extras
    )


def load_safetensors(path: Path, container: Container, options: CheckpointSettings) -> ModuleFound:
    """A safetensors file: its state dict into ``--arch``, or into the architecture its
    metadata records (``curvcal.arch``, ``curvcal.arch_kwargs``) when ``--arch`` is not given."""
    from safetensors.torch import load_file

    metadata = safetensors_metadata(container.header)
    arch, kwargs = options.arch, dict(options.keywords)
    from_metadata = arch is None and ARCH_METADATA_KEY in metadata
    if from_metadata:
        arch = metadata[ARCH_METADATA_KEY]
        kwargs = {**recorded_arch_kwargs(path, metadata), **kwargs}
    try:
        state = load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(str(path), f"cannot read safetensors file: {one_line(exc)}") from exc
    try:
        return from_state_dict(path, "safetensors", state, None, arch, kwargs, options, metadata)
    except InputError as error:
        if not (from_metadata and error.what.startswith("--arch")):
            raise
        # the architecture was named by the file, not by --arch: say so
        what = f"{path} (its metadata {ARCH_METADATA_KEY} = {arch!r})"
        raise type(error)(what, error.why, error.hint) from None


def from_state_dict(
    path: Path,
    form: str,
    state: Mapping[str, torch.Tensor],
    key: str | None,
    arch: str | None,
    kwargs: dict[str, Any],
    options: CheckpointSettings,
    metadata: dict[str, str],
) -> ModuleFound:
    """Build ``arch`` with ``kwargs`` and load ``state`` into it, strictly. ``metadata`` is
    what the file recorded beside the weights; the result's adds how ``num_classes`` was
    chosen and how many keys outside the prefix were ignored."""
    if arch is None:
        recorded = metadata.get("arch")
        hint = "pass --arch tv:NAME, timm:NAME, hf:FOLDER, curvcal:NAME or py:package.module:Class"
        if recorded:  # timm's training script records the model name under "arch"
            hint = (
                f"the file records arch {recorded!r}: pass --arch timm:{recorded} if it is timm's"
            )
        raise InputError(
            str(path), "holds only weights; the architecture they belong to is not recorded", hint
        )
    metadata = dict(metadata)
    if options.num_classes is not None:
        if kwargs.get("num_classes", options.num_classes) != options.num_classes:
            raise InputError(
                "--num-classes",
                f"{options.num_classes} conflicts with num_classes={kwargs['num_classes']} "
                "in the architecture keyword arguments",
            )
        kwargs["num_classes"] = options.num_classes
    elif "num_classes" not in kwargs and accepts_keyword(
        arch, "num_classes", options.trust_checkpoint
    ):
        inferred = infer_num_classes([(k, tuple(v.shape)) for k, v in state.items()])
        if inferred is not None:
            kwargs["num_classes"] = inferred
            metadata["num_classes_source"] = "inferred from the last 2-D weight"
    notes: list[str] = []
    module = build_architecture(arch, kwargs, options.trust_checkpoint, notes)
    metadata.update(library_notes(notes))
    match = match_keys(state, module.state_dict())
    if not match.ok:
        hint = "check --arch, --arch-kwargs, --num-classes and --state-dict-key"
        if "num_classes_source" in metadata:
            hint += f"; num_classes={kwargs['num_classes']} was inferred from the checkpoint"
        raise InputError(str(path), f"weights do not fit {arch}: {match.describe_problems()}", hint)
    refuse_unloadable(path, match.renamed, module)
    module.load_state_dict(match.renamed, strict=True)
    if match.ignored:
        metadata["ignored_keys"] = f"{match.ignored} keys outside prefix {match.prefix!r}"
    facts = architecture_facts(arch, module)
    return ModuleFound(
        module=module,
        form=form,
        arch=arch,
        state_dict_key=key,
        stripped_prefix=match.prefix or None,
        metadata=metadata,
        **facts,
    )


def refuse_unloadable(path: Path, state: Mapping[str, torch.Tensor], module: nn.Module) -> None:
    """Weights that cannot become the module's (:func:`~curvcal.load.files.state_dict.unloadable_tensors`:
    a sparse or meta tensor, complex or boolean into real) are an :class:`InputError` listing
    the first three."""
    bad = unloadable_tensors(state, module.state_dict())
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise InputError(str(path), f"{len(bad)} weights cannot be loaded: {shown}")


def architecture_facts(arch: str, module: nn.Module) -> dict[str, Any]:
    """Architecture name, labels, input modality and preprocessing of a module built from
    ``arch`` (``hf:FOLDER`` reads the folder's config; ``timm:NAME`` the model's
    ``pretrained_cfg``); nothing for other architectures."""
    scheme, _, name = arch.partition(":")
    if scheme == "hf":
        from curvcal.load.models.hf import read_folder

        folder = read_folder(Path(name).expanduser(), need_weights=False)
        return {
            "architecture": folder.architecture,
            "labels": folder.labels,
            "modality": folder.modality,
            "preprocessing": folder.preprocessing,
        }
    if scheme == "timm":
        from curvcal.load.models.hf import timm_preprocessing

        return {
            "architecture": name,
            "modality": "image",
            "preprocessing": timm_preprocessing(module, name),
        }
    return {}
