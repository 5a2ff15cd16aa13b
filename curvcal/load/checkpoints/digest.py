"""Digests of the files a run read: size and SHA-256 of a file, a model folder or a directory.

Lives with the loaders because a model folder's identity is the files its loader reads
(:func:`curvcal.load.models.hf.folder_files`; an adapter folder's config and weights,
:func:`curvcal.load.models.adapters.adapter_files`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from curvcal.inputs import record
from curvcal.load.models.adapters import adapter_files, is_adapter_folder
from curvcal.load.models.hf import folder_files
from curvcal.results import FileInfo

_CHUNK = 1 << 20


def file_info(path: str | Path) -> FileInfo:
    """Size and SHA-256 of a file (read in 1 MiB chunks; never modified). A model folder
    (``config.json`` and weights; an adapter folder's ``adapter_config.json`` and weights):
    total size of the files its loader reads, digest of each one's relative name, a NUL byte
    and its contents, in load order. Other directories: size 0, digest of the sorted relative
    names and sizes of the files beneath. What is digested was read: it is recorded as an
    input of the run (:mod:`curvcal.inputs`)."""
    p = Path(path)
    record(p, "digested folder" if p.is_dir() else "digested file")
    digest = hashlib.sha256()
    model_files = folder_files(p) or (adapter_files(p) if is_adapter_folder(p) else ())
    if model_files:  # a model folder: its config and weights are what identify the model
        for child in model_files:
            digest.update(f"{child.relative_to(p)}\0".encode())
            with child.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
        size = sum(child.stat().st_size for child in model_files)
        return FileInfo(path=str(path), size_bytes=size, sha256=digest.hexdigest())
    if p.is_dir():
        for child in sorted(q for q in p.rglob("*") if q.is_file()):
            digest.update(f"{child.relative_to(p)}\0{child.stat().st_size}\n".encode())
        return FileInfo(path=str(path), size_bytes=0, sha256=digest.hexdigest())
    with p.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return FileInfo(path=str(path), size_bytes=p.stat().st_size, sha256=digest.hexdigest())
