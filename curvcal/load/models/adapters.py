"""PEFT adapter folders (``adapter_config.json`` + ``adapter_model.safetensors``, as
``PeftModel.save_pretrained`` writes them) as checkpoints: the base model from a local model
folder, the adapter put on it by the peft library.

The base is ``--base-model DIR`` or, without it, the adapter config's
``base_model_name_or_path`` when that names a local model folder (as given, else beside the
adapter folder). A hub id is never downloaded: it is an error naming ``--base-model``. The base
folder loads as any model folder does (:mod:`curvcal.load.models.hf`) and must hold the classifier the
adapter was trained on.

peft loads the adapter with ``is_trainable=True``: the adapter's parameters (LoRA A and B
matrices, the ``modules_to_save`` copies such as a classification head) have
``requires_grad``, the base model's do not, so curvature is taken with respect to the adapter's
parameters; calibration uses the adapted model's logits. After loading, peft's own export of the
adapter's state (``get_peft_model_state_dict``) must name exactly the tensors of the file: an
adapter saved for another base leaves tensors that found no module, which peft's non-strict
load would otherwise drop without a word.

An adapter config may name code: ``auto_mapping`` (a custom base class) and ``megatron_config``
(peft imports the module named by ``megatron_core``); both need ``--trust-checkpoint``.
``adapter_model.bin`` goes through the weights-only load like any pickle.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from curvcal.errors import InputError, TrustError
from curvcal.load.extras import require
from curvcal.load.models.hf import LogitsModule, is_model_folder, read_json
from curvcal.load.models.library_limits import (
    check_adapter_on_base,
    library_refusal,
    library_warnings,
)
from curvcal.paths import readable_folder

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"
#: adapter config keys that make peft import code named in the file
_CODE_KEYS = ("auto_mapping", "megatron_config")


@dataclass(frozen=True)
class AdapterFolder:
    """What an adapter folder says about itself: its config, peft type, the base model it
    names, the weight file and the ``modules_to_save`` (trained copies of base modules)."""

    path: Path
    config: Mapping[str, Any]
    peft_type: str
    base_named: str | None
    weights: Path
    modules_to_save: tuple[str, ...]


def is_adapter_folder(path: Path) -> bool:
    """A directory holding ``adapter_config.json``."""
    return os.path.isdir(path) and os.path.isfile(path / ADAPTER_CONFIG)  # never raise


def adapter_files(path: Path) -> tuple[Path, ...]:
    """The files the adapter loader reads from ``path`` (config, weights), for digests."""
    files = [path / ADAPTER_CONFIG]
    files += [path / n for n in (ADAPTER_SAFETENSORS, ADAPTER_PICKLE) if (path / n).is_file()]
    return tuple(files[:2])


def read_adapter(path: Path) -> AdapterFolder:
    """Describe the adapter folder at ``path`` from ``adapter_config.json`` and its files'
    names, without importing peft."""
    readable_folder(path, "adapter folder")  # peft reads its files itself
    config = read_json(path / ADAPTER_CONFIG)
    if not isinstance(config, dict):
        raise InputError(str(path / ADAPTER_CONFIG), "is not a JSON object")
    peft_type = config.get("peft_type")
    if not isinstance(peft_type, str):
        raise InputError(
            str(path / ADAPTER_CONFIG),
            "names no peft_type",
            "save the adapter with PeftModel.save_pretrained, which records it",
        )
    weights = next(
        (path / n for n in (ADAPTER_SAFETENSORS, ADAPTER_PICKLE) if (path / n).is_file()), None
    )
    if weights is None:
        raise InputError(
            str(path), f"has {ADAPTER_CONFIG} but no {ADAPTER_SAFETENSORS} (nor {ADAPTER_PICKLE})"
        )
    named = config.get("base_model_name_or_path")
    modules = config.get("modules_to_save")
    return AdapterFolder(
        path=path,
        config=config,
        peft_type=peft_type,
        base_named=named if isinstance(named, str) and named else None,
        weights=weights,
        modules_to_save=tuple(str(m) for m in modules) if isinstance(modules, list) else (),
    )


def code_entries(adapter: AdapterFolder) -> tuple[str, ...]:
    """The adapter config's entries that make peft import code (``key=value``)."""
    return tuple(f"{k}={adapter.config[k]}" for k in _CODE_KEYS if adapter.config.get(k))


def base_folder(adapter: AdapterFolder, base_model: Path | None) -> Path:
    """The local model folder the adapter goes on: ``base_model`` (``--base-model``), else the
    config's ``base_model_name_or_path`` as given or relative to the adapter folder, recorded
    as an input folder of the run either way (transformers reads its files itself).
    :class:`InputError` when there is none (never a download)."""
    if base_model is not None:
        folder = Path(base_model).expanduser()
        if not is_model_folder(folder):
            raise InputError(
                f"--base-model {base_model}",
                "is not a model folder (no config.json)" if folder.is_dir() else "does not exist",
                "name the base model's save_pretrained folder",
            )
        return readable_folder(folder, "base model folder, from --base-model")
    config_file = str(adapter.path / ADAPTER_CONFIG)
    named = adapter.base_named
    if named is None:
        raise InputError(
            config_file,
            "names no base_model_name_or_path",
            "pass --base-model DIR naming the base model's save_pretrained folder",
        )
    given = Path(named).expanduser()
    candidates = [given] if given.is_absolute() else [given, adapter.path / given]
    for folder in candidates:
        if is_model_folder(folder):
            return readable_folder(folder, f"base model folder, named in {config_file}")
    looks_like_hub_id = not given.is_absolute() and not any(c.exists() for c in candidates)
    why = (
        f"names base model {named!r}, which is not a local folder (a hub id? curvcal never "
        "downloads)"
        if looks_like_hub_id and named.count("/") <= 1 and not named.startswith(".")
        else f"names base model {named!r}, which is not a model folder here"
    )
    raise InputError(
        config_file, why, "pass --base-model DIR naming the base model's save_pretrained folder"
    )


def apply_adapter(
    adapter: AdapterFolder, base: nn.Module, trust: bool
) -> tuple[nn.Module, tuple[str, ...]]:
    """``base`` (a :class:`~curvcal.load.models.hf.LogitsModule`) with the adapter put on it by peft,
    as a :class:`LogitsModule` around the ``PeftModel``: adapter parameters trainable, base
    parameters frozen; and what peft warned about while loading, for the run to say once
    (:func:`~curvcal.load.models.library_limits.library_warnings`). :class:`InputError` when the
    adapter does not fit the base, or its config asks peft for more than
    :mod:`curvcal.load.models.library_limits` allows."""
    entries = code_entries(adapter)
    if entries and not trust:
        raise TrustError(
            str(adapter.path / ADAPTER_CONFIG),
            f"asks for code ({', '.join(entries)}), which peft would import and run",
            "pass --trust-checkpoint only if you trust the folder's source",
        )
    peft = require("peft", "peft", str(adapter.path))
    if not isinstance(base, LogitsModule):
        raise InputError(str(adapter.path), "the base model is not a transformers model")
    library_model = base.__dict__["library_model"]
    check_adapter_on_base(adapter.path / ADAPTER_CONFIG, adapter.config, library_model)
    notes: list[str] = []
    with (
        library_refusal(
            str(adapter.path),
            "the adapter does not fit its base model",
            "pass --base-model DIR naming the model the adapter was trained on",
        ),
        offline(),
        library_warnings("peft", notes),
    ):
        model = peft.PeftModel.from_pretrained(
            library_model, str(adapter.path), is_trainable=True, local_files_only=True
        )
        _check_every_tensor_loaded(adapter, model, peft)
    return LogitsModule(model, base.modality), tuple(notes)


@contextmanager
def offline() -> Iterator[None]:
    """Hugging Face hub offline mode while peft runs (the hub client's constant and the
    ``HF_HUB_OFFLINE`` variable peft reads): whatever path of peft would look a name up on the
    hub answers "not found" instead of going to the network."""
    import huggingface_hub.constants as hub

    saved, saved_env = hub.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE")
    hub.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = "1"  # peft reads the variable itself
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = saved
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env


def _check_every_tensor_loaded(adapter: AdapterFolder, model: nn.Module, peft: Any) -> None:
    """Every tensor of the adapter file found its place in the model, and every adapter
    parameter of the model came from the file: peft's export of the loaded adapter names the
    same tensors as the file."""
    if adapter.weights.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(adapter.weights), framework="pt") as handle:
            saved = set(handle.keys())
    else:
        saved = set(peft.utils.load_peft_weights(str(adapter.path), device="cpu"))
    # no embedding-layer guess: "auto" asks the hub about the base model's config
    exported = set(peft.get_peft_model_state_dict(model, save_embedding_layers=False))
    if saved == exported:
        return
    lost = sorted(saved - exported)
    missing = sorted(exported - saved)
    parts = []
    if lost:
        parts.append(f"{len(lost)} saved tensors fit no module of the base ({', '.join(lost[:3])})")
    if missing:
        parts.append(
            f"{len(missing)} adapter tensors are not in the file ({', '.join(missing[:3])})"
        )
    raise InputError(
        str(adapter.weights),
        "the adapter does not fit its base model: " + "; ".join(parts),
        "pass --base-model DIR naming the model the adapter was trained on",
    )
