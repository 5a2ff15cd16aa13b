"""What every rank of a torchrun run must have alike, as fingerprints the run session compares
(:func:`curvcal.distributed.agree`) before any product is summed across ranks.

- settings: the record of every settings object the run was given (``--option`` to value);
- checkpoint: the SHA-256 of the checkpoint file or folder (and of an adapter's base folder),
  the form it loaded as, its parameter count, and the SHA-256 of every other file its load
  opened (:func:`curvcal.inputs.opened_within`: the source of a ``py:`` architecture, the
  ``config.json`` of an ``--arch hf:FOLDER``, an adapter's configs), so two ranks that build
  different models around the same weights disagree; and the versions of Python, curvcal and
  every library that takes part in a product and is imported by then (torch, and transformers,
  peft, timm, torchvision, safetensors where the load used them): another version may build
  another model from the same files or take another path through its kernels;
- data: the SHA-256 of each file the data was read from, the number of samples (with the world
  size this is the shard plan: rank r takes r, r + W, ...), the number of classes, a digest of
  the labels, and a digest of the samples themselves as the model sees them: every
  ⌈N/64⌉-th sample plus the last (at most 65 samples, cheap at any N). A folder's file
  digest covers only its files' names and sizes, so the samples' own digest is what tells two
  folders of same-size images with other pixels apart, and it is taken for every kind of data;
  and the digest of each other lone file the data's load opened (a ``py:`` factory's source).
"""

from __future__ import annotations

import hashlib
import platform
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from curvcal.inputs import Input
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.datasets.loaded_data import LoadedData
    from curvcal.settings.fields import Settings


def settings_fingerprint(settings: Iterable[Settings]) -> dict[str, Any]:
    """``{--option: value}`` over every settings object of the run."""
    from curvcal.settings.fields import option_name, record

    fingerprint: dict[str, Any] = {}
    for group in settings:
        for name, value in record(group).items():
            fingerprint[option_name(name)] = value
    return fingerprint


def model_fingerprint(loaded: LoadedModel, opened: Iterable[Input] = ()) -> dict[str, Any]:
    """The checkpoint's SHA-256 (its base folder's too, for an adapter), form and size, and the
    SHA-256 of each file among ``opened`` (the inputs its load recorded, in order) that is not
    the checkpoint nor inside its folder: the code and configs the model was built from."""
    from curvcal.inputs import identity
    from curvcal.load.checkpoints.digest import file_info

    checkpoint = identity(loaded.path)
    built_from = [
        entry.path
        for entry in opened
        if not entry.identity.is_dir
        and not entry.identity.same_file(checkpoint)
        and not entry.identity.inside(checkpoint)
    ]
    return {
        "checkpoint sha256": file_info(loaded.path).sha256,
        "base model sha256": loaded.metadata.get("base_model_sha256"),
        "form": loaded.form,
        "parameter count": loaded.parameter_count,
        "files it was built from sha256": [file_info(path).sha256 for path in built_from],
        **{f"{name} version": version for name, version in library_versions().items()},
    }


#: the libraries whose version may change the model built from a file or a product's kernels
LIBRARIES = ("torch", "transformers", "peft", "timm", "torchvision", "safetensors")


def library_versions() -> dict[str, str]:
    """``{name: version}`` for Python, curvcal and each of :data:`LIBRARIES` this process has
    imported (one not imported took no part in the load)."""
    from curvcal import __version__

    versions = {"python": platform.python_version(), "curvcal": __version__}
    for name in LIBRARIES:
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = str(getattr(module, "__version__", "unknown"))
    return versions


def data_fingerprint(
    data: LoadedData, world_size: int, opened: Iterable[Input] = ()
) -> dict[str, Any]:
    """The data's files' SHA-256, N and the shard plan, K, and digests of the labels and of
    the strided samples (:func:`strided_indices`), whatever holds the data; and the SHA-256 of
    each lone file among ``opened`` (the inputs the data's load recorded) that is not one of
    the data's files nor beneath a folder the load read (an image folder's images, a
    tokenizer's configs: the samples' digest covers those): the source of a ``py:`` factory,
    whose samples off the strided ones could differ unseen."""
    from curvcal.inputs import identity
    from curvcal.load.checkpoints.digest import file_info

    files = [identity(path) for path in data.files]
    folders = [entry.identity for entry in opened if entry.identity.is_dir]
    lone = [
        entry.path
        for entry in opened
        if not entry.identity.is_dir
        and not any(entry.identity.same_file(file) for file in files)
        and not any(entry.identity.inside(folder) for folder in folders)
    ]
    fingerprint: dict[str, Any] = {
        "files sha256": [file_info(path).sha256 for path in data.files],
        "other files read sha256": [file_info(path).sha256 for path in lone],
        "samples": data.n_samples,
        "shard plan": f"rank r of {world_size} takes samples r, r + {world_size}, ...",
        "classes": data.num_classes,
        "labels sha256": _tensor_digest(data.labels),
    }
    if data.n_samples:
        indices = strided_indices(data.n_samples)
        fingerprint["strided samples sha256"] = _samples_digest(data, indices)
    return fingerprint


SAMPLES_DIGESTED = 64


def strided_indices(n_samples: int, count: int = SAMPLES_DIGESTED) -> list[int]:
    """Samples 0, s, 2s, ... with s = ⌈N/count⌉, and N − 1: at most count + 1 of them, so the
    digest costs the same at any N and still sees the first, the last and a spread between."""
    stride = -(-n_samples // count)
    return sorted({*range(0, n_samples, stride), n_samples - 1})


def _tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes."""
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest = hashlib.sha256(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _samples_digest(data: LoadedData, indices: list[int]) -> str:
    import torch

    digest = hashlib.sha256()
    for index in indices:
        x, _y = data.dataset[index]
        parts = x.values() if isinstance(x, dict) else x if isinstance(x, tuple | list) else (x,)
        for part in parts:
            if isinstance(part, torch.Tensor):
                digest.update(_tensor_digest(part).encode())
            else:
                digest.update(repr(part).encode())
    return digest.hexdigest()
