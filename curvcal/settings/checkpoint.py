"""The settings that turn a checkpoint file into a module: every command that loads one takes
them (``--arch``, ``--arch-kwargs``, ``-k``, ``--num-classes``, ``--state-dict-key``,
``--trust-checkpoint``, ``--allow-global``, ``--base-model``, ``--device``, ``--dtype``),
declared once."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from curvcal.errors import InputError
from curvcal.jsontext import loads as json_loads
from curvcal.settings.fields import Settings, folder_setting, setting

#: The most classes (``--num-classes``, a ``num_classes`` keyword or config entry): a classifier
#: head of more rows than this would not fit in memory next to any network.
MAX_CLASSES = 1_000_000
#: ``--dtype``: the floating-point precisions a model runs in.
DTYPES = ("float32", "float64", "bfloat16", "float16")


def _parse_kwargs_json(_ctx: Any, param: Any, value: str | None) -> dict[str, Any]:
    """``--arch-kwargs``: a JSON object."""
    import click

    if value is None:
        return {}
    try:
        parsed = json_loads(value, str(param.name))
    except InputError as exc:
        raise click.BadParameter(exc.why, param=param) from None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON ({exc.msg} at column {exc.colno})", param=param
        ) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object such as '{\"width\": 16}'", param=param)
    return parsed


def _parse_pairs(_ctx: Any, param: Any, values: tuple[str, ...]) -> dict[str, Any]:
    """``-k key=value`` (repeatable): the value read as JSON when it parses, else as text."""
    import click

    pairs: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not key=value", param=param)
        try:
            pairs[key.strip()] = json_loads(raw, item)
        except InputError as exc:
            raise click.BadParameter(f"{item!r}: {exc.why}", param=param) from None
        except json.JSONDecodeError:
            pairs[key.strip()] = raw
    return pairs


@dataclass(frozen=True)
class CheckpointSettings(Settings):
    """How to turn a checkpoint file into a module.

    ``arch``: ``tv:NAME``, ``timm:NAME``, ``hf:FOLDER``, ``curvcal:NAME`` or
    ``py:package.module:Class`` (the last needs
    ``trust_checkpoint``), built with ``arch_kwargs`` and the ``-k`` pairs ``arch_kwarg`` (which
    win; :attr:`keywords` holds both). ``num_classes`` is passed to the architecture as
    ``num_classes``; when absent and the architecture takes it, it is inferred from the
    checkpoint. ``allow_global``: ``module.Class`` names a weights-only load may build.
    ``base_model``: the base model folder of a PEFT adapter folder. ``shard_model``: ``none``, or
    under torchrun ``blocks``/``modules`` (:mod:`curvcal.sharding`); ``checkpoint_activations``:
    recompute each shard unit's activations in the backward (only with ``shard_model``).
    ``device``: ``auto|cpu|cuda|cuda:N``; ``dtype``: ``float32|float64|bfloat16|float16`` (half
    precisions run the model in that dtype; curvature and calibration arithmetic stays in float32
    or wider).
    """

    GROUP: ClassVar[str] = "checkpoint"

    arch: str | None = setting(
        None,
        "Architecture of a weights-only file: tv:NAME (torchvision), timm:NAME (timm), "
        "hf:FOLDER (the transformers classifier of a save_pretrained folder's config.json), "
        "curvcal:NAME (bundled) or py:package.module:Class (needs --trust-checkpoint).",
        metavar="SPEC",
        policy=True,
    )
    arch_kwargs: dict[str, Any] = setting(
        {},
        "Keyword arguments for the architecture, as a JSON object.",
        metavar="JSON",
        parse=_parse_kwargs_json,
        policy=True,
    )
    arch_kwarg: dict[str, Any] = setting(
        {},
        "One architecture keyword argument (value read as JSON when it parses, else as a "
        "string); repeatable.",
        short="-k",
        metavar="KEY=VALUE",
        multiple=True,
        parse=_parse_pairs,
        policy=False,
    )
    num_classes: int | None = setting(
        None,
        "Passed to the architecture as num_classes (default: inferred from the weights).",
        low=1,
        high=MAX_CLASSES,
        policy=True,
    )
    state_dict_key: str | None = setting(
        None,
        "Key of the weights inside a wrapper dict (default: state_dict, model_state_dict, "
        "model, state_dict_ema, model_ema, tried in that order).",
        metavar="KEY",
        policy=True,
    )
    trust_checkpoint: bool = setting(
        False,
        "Allow loads that run code from the file (pickled modules, TorchScript, torch.export, "
        "py: architectures). Only for files you trust.",
        flag=True,
        policy=False,
    )
    allow_global: tuple[str, ...] = setting(
        (),
        "Allow a weights-only load to build this plain data class (never a function or a class "
        "that reaches the OS or the interpreter; only --trust-checkpoint runs code); repeatable.",
        metavar="module.Class",
        multiple=True,
        policy=False,
    )
    base_model: Path | None = folder_setting(
        "Base model folder of a PEFT adapter folder (default: the adapter config's "
        "base_model_name_or_path, when that is a local folder; nothing is ever downloaded).",
        policy=False,
    )
    shard_model: str = setting(
        "none",
        "Under torchrun, shard the model over the ranks with FSDP2: per repeated block "
        "(transformer layers) or per top-level module; Hessian products become central "
        "differences of gradients.",
        choices=("none", "blocks", "modules"),
        policy=False,
    )
    checkpoint_activations: bool = setting(
        False,
        "With --shard-model, recompute each unit's activations in the backward instead of "
        "keeping them (activation checkpointing): less memory per gradient pass, one more "
        "forward per pass.",
        flag=True,
        policy=False,
    )
    device: str = setting("auto", "auto (CUDA when available), cpu, cuda or cuda:N.", policy=True)
    dtype: str = setting(
        "float32",
        "Floating-point precision of the model (bfloat16/float16: parameters and activations in "
        "half precision; eigenvalue, trace and calibration arithmetic in float32 or wider).",
        choices=DTYPES,
        policy=True,
    )

    @property
    def keywords(self) -> Mapping[str, Any]:
        """The architecture's keyword arguments: ``--arch-kwargs``, then the ``-k`` pairs."""
        return {**self.arch_kwargs, **self.arch_kwarg}
