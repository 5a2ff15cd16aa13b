"""Find the weights in a loaded checkpoint object, strip wrapper prefixes, check them against a
module.

Conventions:

- A *state dict* is a non-empty mapping from ``str`` to tensors.
- Training scripts wrap it: ``{"state_dict": ..., "epoch": 3}``. The wrapper keys tried, in
  order, are :data:`WRAPPER_KEYS` (the first that holds a state dict wins; EMA weights only when
  nothing else is there, or when asked for by name).
- Key prefixes come from ``DataParallel``/DDP (``module.``), ``torch.compile`` (``_orig_mod.``)
  and Lightning (the attribute name of the wrapped network, such as ``net.`` or ``model.``). The
  prefix kept is the one under which the most keys match the architecture; keys outside it
  belong to other attributes of the wrapper and are left out (their count is reported).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "state_dict_ema", "model_ema")
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_LIST_LIMIT = 5


def is_state_dict(value: Any) -> bool:
    """A non-empty mapping whose keys are strings and whose values are all tensors."""
    return (
        isinstance(value, Mapping)
        and len(value) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
    )


def find_state_dict(obj: Any, key: str | None = None) -> tuple[str | None, Any]:
    """The state dict inside ``obj`` (or the object under ``key`` when given) and the key it
    was under (``None`` when ``obj`` itself is one).

    Raises ``KeyError`` with the available keys when ``key`` is missing, ``LookupError`` when no
    state dict can be found. The returned value under an explicit key may be a module (a
    pickled whole model inside a wrapper dict).
    """
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            raise KeyError(key)
        return key, obj[key]
    if is_state_dict(obj):
        return None, obj
    if isinstance(obj, Mapping):
        for candidate in WRAPPER_KEYS:
            value = obj.get(candidate)
            if is_state_dict(value) or isinstance(value, torch.nn.Module):
                return candidate, value
    raise LookupError("no state dict found")


def top_level_keys(obj: Any) -> tuple[str, ...]:
    return tuple(str(k) for k in obj) if isinstance(obj, Mapping) else ()


def scalar_extras(obj: Any, exclude: str | None) -> dict[str, str]:
    """Scalar entries of a wrapper dict (``epoch``, ``global_step``, ...) as strings."""
    if not isinstance(obj, Mapping) or is_state_dict(obj):
        return {}
    return {
        str(k): str(v)
        for k, v in obj.items()
        if k != exclude and isinstance(v, bool | int | float | str)
    }


def wrapper_prefix(keys: Sequence[str]) -> str | None:
    """The ``module.``/``_orig_mod.`` prefixes (possibly nested) shared by every key, found
    without knowing the architecture; ``None`` when there is none."""
    prefix = ""
    changed = True
    while changed and keys:
        changed = False
        for candidate in WRAPPER_PREFIXES:
            if all(k.startswith(prefix + candidate) for k in keys):
                prefix += candidate
                changed = True
    return prefix or None


def candidate_prefixes(keys: Sequence[str], depth: int = 3) -> list[str]:
    """Prefixes made of the first 1..depth dotted parts of the keys, plus ``""``."""
    found = {""}
    for key in keys:
        parts = key.split(".")
        for n in range(1, min(depth, len(parts) - 1) + 1):
            found.add(".".join(parts[:n]) + ".")
    return sorted(found, key=lambda p: (p.count("."), p))


@dataclass(frozen=True)
class KeyMatch:
    """The state dict renamed to the architecture's keys, and what did not fit."""

    prefix: str
    renamed: dict[str, torch.Tensor]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    misshaped: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    ignored: int  # keys outside the prefix, left out

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped)

    def describe_problems(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing ({_names(self.missing)})")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected ({_names(self.unexpected)})")
        if self.misshaped:
            shown = [
                f"{name}: checkpoint {list(got)} vs model {list(want)}"
                for name, got, want in self.misshaped
            ]
            parts.append(f"{len(self.misshaped)} mis-shaped ({_names(shown)})")
        return "; ".join(parts)


def match_keys(state: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]) -> KeyMatch:
    """Strip the prefix under which the most keys of ``state`` name a tensor of ``target``
    (ties: the shorter prefix), and compare keys and shapes.

    ``num_batches_tracked`` buffers may be missing: old checkpoints lack them and BatchNorm
    fills them in.
    """
    keys = list(state)
    best: tuple[int, int, str] | None = None
    for prefix in candidate_prefixes(keys):
        hits = sum(1 for k in keys if k.startswith(prefix) and k[len(prefix) :] in target)
        score = (hits, -len(prefix), prefix)
        if best is None or score[:2] > best[:2]:
            best = score
    prefix = best[2] if best is not None else ""
    renamed = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    ignored = len(state) - len(renamed)
    missing = tuple(k for k in target if k not in renamed and not k.endswith("num_batches_tracked"))
    unexpected = tuple(k for k in renamed if k not in target)
    misshaped = tuple(
        (k, tuple(v.shape), tuple(target[k].shape))
        for k, v in renamed.items()
        if k in target and tuple(v.shape) != tuple(target[k].shape)
    )
    return KeyMatch(prefix, renamed, missing, unexpected, misshaped, ignored)


def unloadable_tensors(
    state: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]
) -> tuple[str, ...]:
    """The tensors of ``state`` (keys as the architecture names them) that cannot become the
    weights they are matched with, each as ``name (why)``: a sparse or other non-strided
    layout, a tensor on the meta device (a shape without data), a complex tensor for a real
    weight (``copy_`` would drop the imaginary part) and a boolean one for a number (it would
    become 0 and 1). Integer weights for floating ones are left to torch's conversion."""
    found = []
    for name, tensor in state.items():
        want = target.get(name)
        if want is None:
            continue
        why = tensor_problem(tensor)
        if why is None and tensor.is_complex() and not want.is_complex():
            why = f"dtype {str(tensor.dtype).removeprefix('torch.')} for a real weight"
        elif why is None and tensor.dtype == torch.bool and want.dtype != torch.bool:
            why = f"bool for a {str(want.dtype).removeprefix('torch.')} weight"
        if why is not None:
            found.append(f"{name} ({why})")
    return tuple(found)


def tensor_problem(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` holds no plain array of numbers curvcal can compute with (``None`` when
    it does): a layout other than strided (sparse COO/CSR/CSC/BSR/BSC, mkldnn), or the meta
    device, which has shapes but no data."""
    if tensor.layout != torch.strided:
        layout = str(tensor.layout).removeprefix("torch.")
        return f"a {layout} tensor; store it dense (tensor.to_dense())"
    if tensor.is_meta:
        return "a meta tensor, a shape without data; store the tensor itself"
    return None


def infer_num_classes(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> int | None:
    """Output width of the classifier: rows of the last 2-D ``weight``; without one, output
    channels of the last convolution weight (3-D to 5-D); ``None`` if neither exists."""
    for wanted in (lambda s: len(s) == 2, lambda s: 3 <= len(s) <= 5):
        for name, shape in reversed(shapes):
            if name.rsplit(".", 1)[-1] == "weight" and wanted(shape) and shape[0] > 0:
                return int(shape[0])
    return None


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_LIST_LIMIT])
    if len(items) > _LIST_LIMIT:
        shown += f", ... and {len(items) - _LIST_LIMIT} more"
    return shown
