"""Load a classifier checkpoint safely, or describe one without running it.

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
====================  ==========================================  ===========================

A state dict saved from a transformers model loads with ``--arch hf:FOLDER`` (the folder's
``config.json``), one from timm with ``--arch timm:NAME`` (:mod:`curvcal.load.hf`).

Without trust every pickle goes through ``torch.load(weights_only=True)``; nothing here ever
falls back to an unsafe load by itself. The loaded module is a fresh object in eval mode on the
requested device and dtype.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import re
import struct
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from curvcal import jsontext
from curvcal.errors import InputError, TrustError
from curvcal.load.allowlist import allowed_classes, could_be_allowed
from curvcal.load.architecture import accepts_keyword, build_architecture
from curvcal.load.formats import (
    Container,
    TensorSpec,
    dtype_name,
    plain_pickle_globals,
    pt2_weight_specs,
    safetensors_metadata,
    safetensors_specs,
    sniff,
    torch_safe_globals,
    unsafe_globals,
)
from curvcal.load.limits import check_zip_sizes
from curvcal.load.state_dict import (
    find_state_dict,
    infer_num_classes,
    is_state_dict,
    match_keys,
    scalar_extras,
    top_level_keys,
    unloadable_tensors,
    wrapper_prefix,
)
from curvcal.settings.checkpoint import CheckpointSettings

PLAIN_PICKLE = "plain_pickle"
PLAIN_PICKLE_NOTE = "a plain Python pickle, not a torch.save checkpoint: curvcal cannot load it"
FORMS = (
    "state_dict",
    "safetensors",
    "pickled_module",
    "torchscript",
    "exported_program",
    "hf_folder",
    "timm_folder",
)
DTYPES = {"float32": torch.float32, "float64": torch.float64}
ARCH_METADATA_KEY = "curvcal.arch"
ARCH_KWARGS_METADATA_KEY = "curvcal.arch_kwargs"
LOSS_METADATA_KEY = "curvcal.loss"
GAMMA_METADATA_KEY = "curvcal.gamma"
_LOSS_NAMES = {
    "ce": "ce",
    "cross_entropy": "ce",
    "cross-entropy": "ce",
    "focal": "focal",
    "flsd53": "flsd53",
}
EXPORTED_MODE_NOTE = (
    "exported programs keep the train/eval mode they were exported in; eval()/train() cannot "
    "switch them"
)
_TRUST_HINT = "pass --trust-checkpoint only if you trust the file's source"
_DICT_GLOBALS = frozenset({"collections.OrderedDict", "builtins.dict"})


@dataclass(frozen=True)
class LoadedModel:
    """A module loaded from ``path`` (eval mode, on ``device``, in ``dtype``, owned by us) and
    how it was found."""

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
        from curvcal.load.digest import file_info

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


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint holds, read without running any of its code.

    ``format`` is one of :data:`FORMS`; ``container`` the file layout (``torch-zip``,
    ``torch-legacy``, ``safetensors``, ``torchscript``, ``pt2``). ``detected_prefix`` is a
    ``module.``/``_orig_mod.`` prefix shared by every key (others need the architecture to
    tell). ``parameter_count`` counts the elements of all floating-point tensors (a state dict
    does not say which are parameters and which are buffers such as BatchNorm statistics).
    ``num_classes`` is the row count of the last 2-D weight. ``unsafe_globals`` are the classes
    and functions a pickle would import that a weights-only load refuses; when there are any,
    or the format carries code, ``needs_trust`` is true and the tensors are not listed (pickles).
    A plain Python pickle (not written by :func:`torch.save`) has format ``plain_pickle``, lists
    every global it would import in ``pickle_globals`` and cannot be loaded as a checkpoint.
    A model folder (``hf_folder``, ``timm_folder``) also gives its ``architecture`` and its
    ``labels`` (``id2label`` in index order), and needs trust when its config names custom code.
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


def resolve_device(spec: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; ``cpu``; ``cuda``; ``cuda:N``."""
    text = spec.strip().lower()
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise InputError("--device", f"{spec!r} is not a device", "use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise InputError(
            "--device", f"{spec} requested but CUDA is not available", "use --device cpu"
        )
    index = int(match.group(1)) if match.group(1) else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise InputError(
            "--device", f"{spec}: only {torch.cuda.device_count()} CUDA device(s) present"
        )
    return torch.device("cuda", index)


def resolve_dtype(spec: str) -> torch.dtype:
    """``float32`` or ``float64``."""
    try:
        return DTYPES[spec.strip().lower()]
    except KeyError:
        raise InputError(
            "--dtype", f"{spec!r} is not supported", "use float32 or float64"
        ) from None


def load_model(path: str | Path, options: CheckpointSettings) -> LoadedModel:
    """Load the checkpoint at ``path`` as a fresh module in eval mode on the options' device
    and dtype. Raises :class:`InputError` for a bad file or option and :class:`TrustError` when
    loading would run code from the file without ``options.trust_checkpoint``."""
    path = Path(path)
    device = resolve_device(options.device)
    dtype = resolve_dtype(options.dtype)
    allowed = import_globals(options.allow_global)
    if _is_folder(path):
        _refuse_state_dict_key(path, "model folder", options)
        loaded = _load_folder(path, options)
        return _finish(path, loaded, device, dtype)
    container = sniff(path)
    if container.kind == "pickle":
        _refuse_plain_pickle(path)
    if container.kind in _KEYLESS:
        _refuse_state_dict_key(path, _KEYLESS[container.kind], options)
    if container.kind == "safetensors":
        loaded = _load_safetensors(path, container, options)
    elif container.kind == "torchscript":
        loaded = _load_torchscript(path, options, device)
    elif container.kind == "pt2":
        loaded = _load_exported(path, options, device)
    else:
        loaded = _load_pickle(path, container, options, allowed)
    return _finish(path, loaded, device, dtype)


#: containers that hold one set of weights with no keys above it, and what to call them
_KEYLESS = {
    "safetensors": "safetensors file",
    "torchscript": "TorchScript archive",
    "pt2": "torch.export archive",
}


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


def _finish(path: Path, loaded: _Loaded, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    module = loaded.module
    module.to(device=device, dtype=dtype)
    if loaded.form != "exported_program":
        module.eval()
    shapes = [(name, tuple(t.shape)) for name, t in module.state_dict().items()]
    num_classes = len(loaded.labels) if loaded.labels else infer_num_classes(shapes)
    return LoadedModel(
        module=module,
        form=loaded.form,
        path=path,
        arch=loaded.arch,
        state_dict_key=loaded.state_dict_key,
        stripped_prefix=loaded.stripped_prefix,
        num_classes=num_classes,
        metadata=loaded.metadata,
        device=device,
        dtype=dtype,
        architecture=loaded.architecture,
        labels=loaded.labels,
        modality=loaded.modality,
        preprocessing=loaded.preprocessing,
    )


def recorded_loss(loaded: LoadedModel) -> tuple[str, float]:
    """The training loss a checkpoint records in its metadata, as ``(criterion, gamma)``.

    ``curvcal.loss`` is ``ce`` (also ``cross_entropy``), ``focal`` or ``flsd53``;
    ``curvcal.gamma`` is the focal γ (required for ``focal``; absent or 0 for ``ce`` and
    ``flsd53``, whose γ is per sample). :func:`curvcal.losses.loss_from_name` turns the pair into
    a loss. Raises :class:`InputError`, naming the checkpoint, when the metadata is missing or
    unusable.
    """
    where = str(loaded.path)
    hint = "pass --loss ce or --loss focal --gamma G"
    raw = loaded.metadata.get(LOSS_METADATA_KEY)
    if raw is None:
        raise InputError(
            where, f"the checkpoint records no training loss (metadata {LOSS_METADATA_KEY})", hint
        )
    criterion = _LOSS_NAMES.get(raw.strip().lower())
    if criterion is None:
        raise InputError(
            where, f"metadata {LOSS_METADATA_KEY} is {raw!r}, not a loss curvcal knows", hint
        )
    gamma_raw = loaded.metadata.get(GAMMA_METADATA_KEY)
    if gamma_raw is None:
        if criterion == "focal":
            raise InputError(where, f"focal loss recorded without {GAMMA_METADATA_KEY}", hint)
        return criterion, 0.0
    try:
        gamma = float(gamma_raw)
    except ValueError:
        raise InputError(
            where, f"metadata {GAMMA_METADATA_KEY} is {gamma_raw!r}, not a number", hint
        ) from None
    if not math.isfinite(gamma) or gamma < 0:
        raise InputError(where, f"metadata {GAMMA_METADATA_KEY} is {gamma_raw!r}; γ must be ≥ 0")
    if criterion != "focal" and gamma != 0:
        raise InputError(
            where, f"metadata says loss {criterion} with {GAMMA_METADATA_KEY} {gamma_raw!r}", hint
        )
    return criterion, gamma


def inspect_checkpoint(path: str | Path, allow_globals: tuple[str, ...] = ()) -> CheckpointInfo:
    """Describe the checkpoint at ``path`` without running any code it carries.

    Pickles are scanned opcode by opcode; only when every global they need is allowlisted
    (torch's weights-only list plus ``allow_globals``) are they loaded, with
    ``torch.load(weights_only=True)``. TorchScript and exported programs are read as archives.
    """
    path = Path(path)
    allowed = import_globals(allow_globals)
    if _is_folder(path):
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
        info = _info(path, PLAIN_PICKLE, container, (), unsafe=_outside_torch_allowlist(names))
        return dataclasses.replace(info, pickle_globals=names, metadata={"note": PLAIN_PICKLE_NOTE})
    scan = unsafe_globals(path, container, allow_globals, allowed)
    module_like = scan.top_level is not None and scan.top_level not in _DICT_GLOBALS
    form = "pickled_module" if module_like else "state_dict"
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
    obj = _weights_only_load(path, allowed)
    if isinstance(obj, nn.Module):
        specs = _specs(obj.state_dict())
        return _info(path, "pickled_module", container, specs, top_level_type=_type_name(obj))
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
        top_level_type=_type_name(obj),
        top_level_keys=top_level_keys(obj),
        state_dict_key=key,
        metadata=scalar_extras(obj, key),
    )


def import_globals(names: tuple[str, ...]) -> list[Any]:
    """Import each ``module.Class`` given with ``--allow-global``, refusing anything but plain
    data classes (the rule is :mod:`curvcal.load.allowlist`)."""
    return list(allowed_classes(names))


def _refuse_plain_pickle(path: Path) -> None:
    names = plain_pickle_globals(path)
    listed = f"; it imports {', '.join(names)}" if names else ""
    raise InputError(
        str(path),
        f"is a plain Python pickle, not a torch.save checkpoint{listed}",
        "curvcal reads files written by torch.save or safetensors; "
        "curvcal inspect lists a pickle's globals without running it",
    )


def _outside_torch_allowlist(names: tuple[str, ...]) -> tuple[str, ...]:
    safe = torch_safe_globals()
    return tuple(name for name in names if name not in safe)


# --- loaders, one per container -------------------------------------------------------------


@dataclass
class _Loaded:
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


def _load_safetensors(path: Path, container: Container, options: CheckpointSettings) -> _Loaded:
    from safetensors.torch import load_file

    metadata = safetensors_metadata(container.header)
    arch, kwargs = options.arch, dict(options.keywords)
    from_metadata = arch is None and ARCH_METADATA_KEY in metadata
    if from_metadata:
        arch = metadata[ARCH_METADATA_KEY]
        kwargs = {**_metadata_kwargs(path, metadata), **kwargs}
    try:
        state = load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(str(path), f"cannot read safetensors file: {_one_line(exc)}") from exc
    try:
        return _from_state_dict(path, "safetensors", state, None, arch, kwargs, options, metadata)
    except InputError as error:
        if not (from_metadata and error.what.startswith("--arch")):
            raise
        # the architecture was named by the file, not by --arch: say so
        what = f"{path} (its metadata {ARCH_METADATA_KEY} = {arch!r})"
        raise type(error)(what, error.why, error.hint) from None


def _metadata_kwargs(path: Path, metadata: Mapping[str, str]) -> dict[str, Any]:
    raw = metadata.get(ARCH_KWARGS_METADATA_KEY)
    if raw is None:
        return {}
    try:
        kwargs = jsontext.loads(raw, f"{path} (its metadata {ARCH_KWARGS_METADATA_KEY})")
    except json.JSONDecodeError as exc:
        raise InputError(
            str(path), f"metadata {ARCH_KWARGS_METADATA_KEY} is not JSON: {exc}"
        ) from exc
    if not isinstance(kwargs, dict):
        raise InputError(str(path), f"metadata {ARCH_KWARGS_METADATA_KEY} is not a JSON object")
    return kwargs


def _load_pickle(
    path: Path, container: Container, options: CheckpointSettings, allowed: list[Any]
) -> _Loaded:
    scan = unsafe_globals(path, container, options.allow_global, allowed)
    if scan.names and not options.trust_checkpoint:
        module_like = scan.top_level is not None and scan.top_level not in _DICT_GLOBALS
        what = f"is a pickled {scan.top_level} object" if module_like else "is a pickle"
        raise TrustError(
            str(path),
            f"{what} that needs {', '.join(scan.names)} to load, which a weights-only load refuses "
            "and a full unpickling could use to run code",
            _refusal_hint(scan.names, module_like),
        )
    # With trust and globals outside the allowlist, the full unpickler; otherwise weights-only.
    obj = _full_load(path) if scan.names else _weights_only_load(path, allowed)
    if isinstance(obj, nn.Module):
        _refuse_state_dict_key(path, "pickled module", options)
        return _Loaded(module=obj, form="pickled_module", metadata=_arch_ignored(options))
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
            f"holds a {_type_name(obj)} with no state dict"
            + (f" (top-level keys: {keys})" if keys else ""),
            "name the key holding the weights with --state-dict-key",
        ) from None
    extras = scalar_extras(obj, key)
    if isinstance(state, nn.Module):
        return _Loaded(
            state,
            "pickled_module",
            state_dict_key=key,
            metadata={**extras, **_arch_ignored(options)},
        )
    if not is_state_dict(state):
        raise InputError(str(path), f"the value under {key!r} is not a state dict (str -> tensor)")
    return _from_state_dict(
        path, "state_dict", state, key, options.arch, dict(options.keywords), options, extras
    )


def _refusal_hint(names: tuple[str, ...], module_like: bool) -> str:
    """The trust hint, plus ``--allow-global`` only when every refused global could be a plain
    data class (never for whole modules, functions or anything from a denied module)."""
    if module_like or not all(could_be_allowed(name) for name in names):
        return _TRUST_HINT
    flags = " ".join(f"--allow-global {name}" for name in names)
    return f"{_TRUST_HINT}; if these are plain data classes you trust, {flags} admits them and runs no code from the file"


def _arch_ignored(options: CheckpointSettings) -> dict[str, str]:
    return {"arch_ignored": options.arch} if options.arch else {}


def _weights_only_load(path: Path, allowed: list[Any]) -> Any:
    check_zip_sizes(path)
    try:
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            # torch warns while validating a sparse tensor: the refusal of the layout says it
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only load failed" in str(exc).lower():
            refused = re.findall(r"GLOBAL ([\w.]+)", str(exc))
            raise TrustError(
                str(path),
                f"a weights-only load refused it{' (needs ' + ', '.join(refused) + ')' if refused else ''}",
                _TRUST_HINT,
            ) from exc
        raise InputError(str(path), f"corrupt pickle: {_one_line(exc)}") from exc
    except (
        RuntimeError,
        EOFError,
        ValueError,
        OSError,
        IndexError,
        KeyError,
        # a corrupt legacy pickle calls torch's allow-listed rebuild functions with the wrong
        # arguments, or names a storage it never defines
        TypeError,
        AssertionError,
        # a corrupt legacy persistent id whose storage type is some other allowed object
        # (a dict: "'dict' object has no attribute 'dtype'"); no code from the file runs here
        AttributeError,
        struct.error,  # a legacy file cut inside a storage's size
    ) as exc:
        raise InputError(
            str(path), f"cannot be read (truncated or corrupt?): {_one_line(exc)}"
        ) from exc


def _full_load(path: Path) -> Any:
    """Full unpickling: runs code from the file. Only reached with ``trust``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (ImportError, AttributeError) as exc:
        raise InputError(
            str(path),
            f"needs code that is not importable here: {_one_line(exc)}",
            "install the package that defined the model",
        ) from exc
    except (RuntimeError, EOFError, ValueError, OSError, pickle.UnpicklingError) as exc:
        raise InputError(
            str(path), f"cannot be read (truncated or corrupt?): {_one_line(exc)}"
        ) from exc


def _load_torchscript(path: Path, options: CheckpointSettings, device: torch.device) -> _Loaded:
    if not options.trust_checkpoint:
        raise TrustError(
            str(path),
            "is a TorchScript archive, which carries code that runs when loaded",
            _TRUST_HINT,
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(path), map_location=device)
    except RuntimeError as exc:
        raise InputError(str(path), f"cannot load TorchScript archive: {_one_line(exc)}") from exc
    return _Loaded(module=module, form="torchscript", metadata=_arch_ignored(options))


def _load_exported(path: Path, options: CheckpointSettings, device: torch.device) -> _Loaded:
    if not options.trust_checkpoint:
        raise TrustError(
            str(path),
            "is a torch.export archive, which carries a program that runs when loaded",
            _TRUST_HINT,
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.export.load(str(path))
            if device.type != "cpu":
                from torch.export.passes import move_to_device_pass

                program = move_to_device_pass(program, device)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise InputError(str(path), f"cannot load exported program: {_one_line(exc)}") from exc
    metadata = {"note": EXPORTED_MODE_NOTE, **_arch_ignored(options)}
    return _Loaded(module=program.module(), form="exported_program", metadata=metadata)


# --- state dict + architecture ---------------------------------------------------------------


def _from_state_dict(
    path: Path,
    form: str,
    state: Mapping[str, torch.Tensor],
    key: str | None,
    arch: str | None,
    kwargs: dict[str, Any],
    options: CheckpointSettings,
    metadata: dict[str, str],
) -> _Loaded:
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
    module = build_architecture(arch, kwargs, options.trust_checkpoint)
    match = match_keys(state, module.state_dict())
    if not match.ok:
        hint = "check --arch, --arch-kwargs, --num-classes and --state-dict-key"
        if "num_classes_source" in metadata:
            hint += f"; num_classes={kwargs['num_classes']} was inferred from the checkpoint"
        raise InputError(str(path), f"weights do not fit {arch}: {match.describe_problems()}", hint)
    _refuse_unloadable(path, match.renamed, module)
    module.load_state_dict(match.renamed, strict=True)
    if match.ignored:
        metadata["ignored_keys"] = f"{match.ignored} keys outside prefix {match.prefix!r}"
    facts = architecture_facts(arch, module)
    return _Loaded(
        module=module,
        form=form,
        arch=arch,
        state_dict_key=key,
        stripped_prefix=match.prefix or None,
        metadata=metadata,
        **facts,
    )


def _refuse_unloadable(path: Path, state: Mapping[str, torch.Tensor], module: nn.Module) -> None:
    bad = unloadable_tensors(state, module.state_dict())
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise InputError(str(path), f"{len(bad)} weights cannot be loaded: {shown}")


# --- model folders ---------------------------------------------------------------------------


def _is_folder(path: Path) -> bool:
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


def _load_folder(path: Path, options: CheckpointSettings) -> _Loaded:
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
        _refuse_unloadable(path, match.renamed, module)
        module.load_state_dict(match.renamed, strict=True)
    else:
        for file in folder.weights:
            if file.suffix != ".safetensors":  # scanned, refused if it needs any global
                load_state_file(file, options)
        module = load_pretrained(folder, options.trust_checkpoint)
    metadata = {"library": folder.library}
    if folder.custom_code:
        metadata["custom_code"] = ", ".join(folder.custom_code)
    return _Loaded(
        module=module,
        form="hf_folder" if folder.library == "transformers" else "timm_folder",
        arch=None,
        metadata=metadata,
        architecture=folder.architecture,
        labels=folder.labels,
        modality=folder.modality,
        preprocessing=folder.preprocessing,
    )


def architecture_facts(arch: str, module: nn.Module) -> dict[str, Any]:
    """Architecture name, labels, input modality and preprocessing of a module built from
    ``arch`` (``hf:FOLDER`` reads the folder's config; ``timm:NAME`` the model's
    ``pretrained_cfg``); nothing for other architectures."""
    scheme, _, name = arch.partition(":")
    if scheme == "hf":
        from curvcal.load.hf import read_folder

        folder = read_folder(Path(name).expanduser(), need_weights=False)
        return {
            "architecture": folder.architecture,
            "labels": folder.labels,
            "modality": folder.modality,
            "preprocessing": folder.preprocessing,
        }
    if scheme == "timm":
        from curvcal.load.hf import timm_preprocessing

        return {
            "architecture": name,
            "modality": "image",
            "preprocessing": timm_preprocessing(module, name),
        }
    return {}


def load_state_file(path: Path, options: CheckpointSettings) -> dict[str, torch.Tensor]:
    """The state dict in a ``torch.save`` file, through a weights-only load only (a model
    folder's ``pytorch_model.bin``: its globals are never trusted, whatever the options)."""
    allowed = import_globals(options.allow_global)
    container = sniff(path)
    if container.kind not in ("torch-zip", "torch-legacy"):
        raise InputError(str(path), f"is a {container.kind} file, not torch.save weights")
    scan = unsafe_globals(path, container, options.allow_global, allowed)
    if scan.names:
        raise TrustError(
            str(path),
            f"needs {', '.join(scan.names)} to load, which a weights-only load refuses",
            "re-save the folder with safetensors (save_pretrained does by default)",
        )
    obj = _weights_only_load(path, allowed)
    try:
        _key, state = find_state_dict(obj)
    except LookupError:
        raise InputError(str(path), "holds no state dict") from None
    if not is_state_dict(state):
        raise InputError(str(path), "holds no state dict (str -> tensor)")
    return dict(state)


def _inspect_folder(path: Path, allow_globals: tuple[str, ...]) -> CheckpointInfo:
    from curvcal.load.hf import read_folder

    folder = read_folder(path)
    specs: list[TensorSpec] = []
    for file in folder.weights:
        if file.suffix == ".safetensors":
            specs.extend(safetensors_specs(sniff(file).header))
        else:
            specs.extend(inspect_checkpoint(file, allow_globals).tensors)
    metadata = {"library": folder.library, "modality": folder.modality}
    for key in ("model_type", "problem_type"):
        if isinstance(folder.config.get(key), str):
            metadata[key] = folder.config[key]
    if folder.custom_code:
        metadata["custom_code"] = ", ".join(folder.custom_code)
    if folder.preprocessing:
        metadata["preprocessing"] = json.dumps(folder.preprocessing)
    info = _info(
        path,
        "hf_folder" if folder.library == "transformers" else "timm_folder",
        Container(kind="folder"),
        tuple(specs),
        metadata=metadata,
        needs_trust=bool(folder.custom_code),
    )
    num_classes = len(folder.labels) if folder.labels else info.num_classes
    return dataclasses.replace(
        info, architecture=folder.architecture, labels=folder.labels, num_classes=num_classes
    )


# --- helpers ---------------------------------------------------------------------------------


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


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
