"""The options every command that loads a checkpoint shares, gathered into one
:class:`~curvcal.load.checkpoint.CheckpointOptions`."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from curvcal import choices, jsontext
from curvcal.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])

#: The keys of ``curvcal.load.checkpoint.DTYPES`` (spelled out so that ``--help`` needs no torch).
DTYPE_NAMES = ("float32", "float64")

_OPTION_NAMES = (
    "arch",
    "arch_kwargs",
    "arch_kwarg",
    "num_classes",
    "state_dict_key",
    "trust_checkpoint",
    "allow_global",
    "device",
    "dtype",
)


def _parse_kwargs_json(
    _ctx: click.Context, param: click.Parameter, value: str | None
) -> dict[str, Any]:
    if value is None:
        return {}
    try:
        parsed = jsontext.loads(value, str(param.name))
    except InputError as exc:
        raise click.BadParameter(exc.why, param=param) from None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON ({exc.msg} at column {exc.colno})", param=param
        ) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object such as '{\"width\": 16}'", param=param)
    return parsed


def _parse_pairs(
    _ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any]:
    pairs: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not key=value", param=param)
        try:
            pairs[key.strip()] = jsontext.loads(raw, item)
        except InputError as exc:
            raise click.BadParameter(f"{item!r}: {exc.why}", param=param) from None
        except json.JSONDecodeError:
            pairs[key.strip()] = raw
    return pairs


def checkpoint_options(func: F) -> F:
    """Add ``--arch``, ``--arch-kwargs``, ``-k/--arch-kwarg``, ``--num-classes``,
    ``--state-dict-key``, ``--trust-checkpoint``, ``--allow-global``, ``--device`` and
    ``--dtype``; the command receives them as one ``checkpoint_options`` keyword argument.
    ``-k`` pairs override keys of ``--arch-kwargs``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from curvcal.load.checkpoint import CheckpointOptions  # imports torch: only when run

        values = {name: kwargs.pop(name) for name in _OPTION_NAMES}
        kwargs["checkpoint_options"] = CheckpointOptions(
            arch=values["arch"],
            arch_kwargs={**values["arch_kwargs"], **values["arch_kwarg"]},
            num_classes=values["num_classes"],
            state_dict_key=values["state_dict_key"],
            trust=values["trust_checkpoint"],
            allow_globals=tuple(values["allow_global"]),
            device=values["device"],
            dtype=values["dtype"],
        )
        return func(*args, **kwargs)

    decorators = [
        click.option(
            "--arch",
            metavar="SPEC",
            help="Architecture of a weights-only file: tv:NAME (torchvision), curvcal:NAME "
            "(bundled) or py:package.module:Class (needs --trust-checkpoint).",
        ),
        click.option(
            "--arch-kwargs",
            metavar="JSON",
            callback=_parse_kwargs_json,
            help="Keyword arguments for the architecture, as a JSON object.",
        ),
        click.option(
            "-k",
            "--arch-kwarg",
            metavar="KEY=VALUE",
            multiple=True,
            callback=_parse_pairs,
            help="One architecture keyword argument (value read as JSON when it parses, else "
            "as a string); repeatable.",
        ),
        click.option(
            "--num-classes",
            type=click.IntRange(1, choices.MAX_CLASSES),
            help="Passed to the architecture as num_classes (default: inferred from the weights).",
        ),
        click.option(
            "--state-dict-key",
            metavar="KEY",
            help="Key of the weights inside a wrapper dict (default: state_dict, "
            "model_state_dict, model, state_dict_ema, model_ema, tried in that order).",
        ),
        click.option(
            "--trust-checkpoint",
            is_flag=True,
            help="Allow loads that run code from the file (pickled modules, TorchScript, "
            "torch.export, py: architectures). Only for files you trust.",
        ),
        click.option(
            "--allow-global",
            metavar="module.Class",
            multiple=True,
            help="Allow a weights-only load to build this plain data class (never a function or "
            "a class that reaches the OS or the interpreter; only --trust-checkpoint runs code); "
            "repeatable.",
        ),
        click.option(
            "--device",
            default="auto",
            show_default=True,
            help="auto (CUDA when available), cpu, cuda or cuda:N.",
        ),
        click.option(
            "--dtype",
            type=click.Choice(DTYPE_NAMES),
            default="float32",
            show_default=True,
            help="Floating-point precision of the model.",
        ),
    ]
    decorated: Any = wrapper
    for decorator in reversed(decorators):
        decorated = decorator(decorated)
    return decorated
