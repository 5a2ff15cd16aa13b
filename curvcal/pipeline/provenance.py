"""Where numbers came from: the software and the machine (file digests: :mod:`curvcal.load.checkpoints.digest`)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

import torch

from curvcal import __version__


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    """Versions and the device the numbers were computed on."""
    env: dict[str, Any] = {
        "curvcal": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(terse=True),
        "command_line": list(sys.argv),
    }
    revision = source_revision(os.environ)
    if revision:
        env["revision"] = revision
    if device is not None:
        dev = torch.device(device)
        env["device"] = str(dev)
        if dev.type == "cuda" and torch.cuda.is_available():
            env["device_name"] = torch.cuda.get_device_name(dev)
        else:
            env["device_name"] = platform.processor() or platform.machine()
        env["torch_threads"] = torch.get_num_threads()
    return env


def source_revision(environ: Mapping[str, str]) -> dict[str, str]:
    """The commit (and tag) a CI job checked out, from the variables the CI service sets:
    GitHub Actions (``GITHUB_SHA``; ``GITHUB_REF_NAME`` when ``GITHUB_REF_TYPE`` is ``tag``)
    and GitLab CI (``CI_COMMIT_SHA``, ``CI_COMMIT_TAG``). Empty outside CI: a report made by
    a release job names its release, so a later check can say which one it was compared with.
    """
    revision: dict[str, str] = {}
    commit = environ.get("GITHUB_SHA") or environ.get("CI_COMMIT_SHA")
    if commit:
        revision["commit"] = commit
    tag = environ.get("CI_COMMIT_TAG")
    if not tag and environ.get("GITHUB_REF_TYPE") == "tag":
        tag = environ.get("GITHUB_REF_NAME")
    if tag:
        revision["tag"] = tag
    return revision
