"""The dataset options shared by commands that read data (``--data`` and friends).

Usage::

    @click.command()
    @data_options()              # or data_options(required=False)
    @output_options
    def hessian(data_options: DataOptions | None, batch_size: int, ...) -> int:
        ...
        options = dataclasses.replace(data_options, trust=trust_checkpoint)

The decorator adds ``--data``, ``--data-root``, ``--download``, ``--mean``, ``--std``,
``--resize``, ``--crop``, ``--max-samples``, ``--subset-seed``, ``--x-key``, ``--y-key``, the
text options ``--text-key``, ``--label-key``, ``--text-pair-key``, ``--tokenizer``,
``--max-length``, and ``--batch-size``, removes them from the command's keyword arguments, and passes instead
``data_options`` (a :class:`~curvcal.load.data.DataOptions`, or ``None`` when ``--data`` is
optional and not given) and ``batch_size``. Trust for ``py:`` factories is not one of these
options: ``--trust-checkpoint`` belongs to the checkpoint options, and the command passes it
on with ``dataclasses.replace(data_options, trust=...)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from curvcal.load.data import DataOptions  # noqa: F401


F = TypeVar("F", bound=Callable[..., Any])

# Option name -> its default (used to tell which were given without --data).
_DEFAULTS: dict[str, Any] = {
    "data": None,
    "data_root": None,
    "download": False,
    "mean": None,
    "std": None,
    "resize": None,
    "crop": None,
    "max_samples": None,
    "subset_seed": 0,
    "x_key": "x",
    "y_key": "y",
    "text_key": "text",
    "label_key": "label",
    "text_pair_key": None,
    "tokenizer": None,
    "max_length": None,
}


def _float_list(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[float, ...] | None:
    if value is None:
        return None
    name = param.opts[0] if param.opts else str(param.name)
    try:
        numbers = tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(
            f"{name} takes comma-separated numbers, e.g. 0.5,0.5,0.5; got '{value}'", ctx, param
        ) from None
    if not numbers:
        raise click.BadParameter(f"{name} needs at least one number", ctx, param)
    if any(n != n or n in (float("inf"), float("-inf")) for n in numbers):
        raise click.BadParameter(f"{name} values must be finite; got '{value}'", ctx, param)
    if param.name == "std" and any(n <= 0 for n in numbers):
        raise click.BadParameter(f"{name} values must be > 0; got '{value}'", ctx, param)
    return numbers


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A positive size, or ``none`` (kept as 0: no resize or crop, and no model config's)."""
    if value is None:
        return None
    if value.strip().lower() == "none":
        return 0
    name = param.opts[0] if param.opts else str(param.name)
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 1:
        raise click.BadParameter(f"{name} takes a size >= 1 or 'none'; got '{value}'", ctx, param)
    return size


def text_option_list() -> list[Callable[[F], F]]:
    """The text data options (also used by ``check``, which names its data in a policy)."""
    return [
        click.option(
            "--text-key", default="text", show_default=True, help="Text column of text data."
        ),
        click.option(
            "--label-key", default="label", show_default=True, help="Label column of text data."
        ),
        click.option("--text-pair-key", help="Second text column, for sentence pairs."),
        click.option(
            "--tokenizer",
            type=click.Path(file_okay=False, path_type=Path),
            help="Tokenizer folder (save_pretrained) [default: the model folder's].",
        ),
        click.option(
            "--max-length",
            type=click.IntRange(min=1),
            help="Tokens per text; longer ones are cut [default: the tokenizer's "
            "model_max_length, capped by the config's max_position_embeddings].",
        ),
    ]


def text_options(func: F) -> F:
    """Decorator adding only the text data options (``check``, whose data a policy names);
    each arrives under its own keyword (``text_key``, ``label_key``, ...)."""
    command: Callable[..., Any] = func
    for decorator in reversed(text_option_list()):
        command = decorator(command)
    return command  # type: ignore[return-value]


def data_options(required: bool = True) -> Callable[[F], F]:
    """Decorator factory adding the dataset options (``--data`` required unless told not)."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in _DEFAULTS}
            batch_size = kwargs.pop("batch_size")
            spec = values.pop("data")
            if spec is None:
                given = [
                    "--" + name.replace("_", "-")
                    for name, value in values.items()
                    if value != _DEFAULTS[name]
                ]
                if given:
                    raise click.UsageError(f"{', '.join(given)} given without --data")
                options = None
            else:
                from curvcal.load.data import DataOptions

                options = DataOptions(
                    spec=spec,
                    root=values["data_root"],
                    download=values["download"],
                    mean=values["mean"],
                    std=values["std"],
                    resize=values["resize"],
                    crop=values["crop"],
                    max_samples=values["max_samples"],
                    subset_seed=values["subset_seed"],
                    x_key=values["x_key"],
                    y_key=values["y_key"],
                    text_key=values["text_key"],
                    label_key=values["label_key"],
                    text_pair_key=values["text_pair_key"],
                    tokenizer=values["tokenizer"],
                    max_length=values["max_length"],
                )
            return func(*args, data_options=options, batch_size=batch_size, **kwargs)

        decorators = [
            click.option(
                "--data",
                "data",
                metavar="SPEC",
                required=required,
                help="Dataset: tv:NAME[:train|test], folder:PATH, PATH.pt|.npz|.safetensors, "
                "texts in PATH.jsonl|.csv|.parquet or a saved datasets folder DIR[:split], "
                "py:module:function, or curvcal:digits.",
            ),
            click.option(
                "--data-root",
                type=click.Path(file_okay=False, path_type=Path),
                help="Folder of torchvision datasets (default ./data).",
            ),
            click.option(
                "--download", is_flag=True, help="Download a torchvision dataset if missing."
            ),
            click.option(
                "--mean",
                callback=_float_list,
                metavar="M1,M2,...",
                help="Per-channel mean to normalise with (overrides the preset).",
            ),
            click.option(
                "--std",
                callback=_float_list,
                metavar="S1,S2,...",
                help="Per-channel std to normalise with (overrides the preset).",
            ),
            click.option(
                "--resize",
                callback=_size,
                metavar="N|none",
                help="Resize images (shorter side); 'none' keeps them as they are, without a "
                "model config's resize and crop.",
            ),
            click.option(
                "--crop",
                callback=_size,
                metavar="N|none",
                help="Center-crop images; 'none': no crop.",
            ),
            click.option(
                "--max-samples",
                type=click.IntRange(min=1),
                help="Use a random subset of this many samples (kept in dataset order).",
            ),
            click.option(
                "--subset-seed",
                type=int,
                default=0,
                show_default=True,
                help="Seed of the --max-samples subset.",
            ),
            click.option(
                "--x-key", default="x", show_default=True, help="Inputs' name in a tensor file."
            ),
            click.option(
                "--y-key", default="y", show_default=True, help="Labels' name in a tensor file."
            ),
            *text_option_list(),
            click.option(
                "--batch-size",
                type=click.IntRange(min=1),
                default=256,
                show_default=True,
                help="Samples per batch.",
            ),
        ]
        command: Callable[..., Any] = wrapper
        for decorator in reversed(decorators):
            command = decorator(command)
        return command  # type: ignore[return-value]

    return decorate
