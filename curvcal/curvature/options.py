"""How a Hessian operator runs, apart from its model and data: its settings, checked.

An operator is built from a :class:`~curvcal.settings.hessian.HessianSettings` (the fields
marked ``operator``: ``loss``, ``gamma``, ``params``, ``hvp``, ``mode``, ``cache``,
``probe_batch``, ``memory_budget``, ``keep_graphs``, ``curvature``), the same object the
command line and the report use: :func:`operator_settings` makes it from the settings and the
fields given as keywords. :func:`checked_loss`, :func:`check_options`, :func:`check_curvature`
and :func:`select_parameters` refuse impossible requests (train mode with dropout, a pattern
that matches no parameter) before any pass over the data, each error naming the field at fault
(:class:`~curvcal.errors.SettingsError`, worded as the option on the command line).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from curvcal.curvature.engines import is_torchscript, stochastic_layers
from curvcal.errors import InputError, SettingsError, setting_name
from curvcal.losses import Loss, closed_form_problem, loss_from_name
from curvcal.settings.fields import operator_fields, renamed
from curvcal.settings.hessian import HessianSettings
from curvcal.settings.sizes import MemoryBudget, parse_memory_budget

#: the settings fields an operator is built with (``operator=True`` in their declaration)
OPERATOR_FIELDS = operator_fields(HessianSettings)
#: ``probe_batch``'s value, in Python only, for "measure it" (on CUDA; 8 on the CPU)
AUTO_PROBE_BATCH = "auto"


def operator_settings(
    settings: HessianSettings | None, fields: Mapping[str, Any], caller: str, depth: int = 1
) -> tuple[HessianSettings, bool]:
    """The settings of an operator: ``settings`` (default: the defaults) with the operator
    ``fields`` given as keywords on top, checked as the command line checks them (an error
    names the field); former names (``engine``, ``criterion``) are taken with a
    :class:`DeprecationWarning`. ``params`` may be one glob or ``None`` (every trainable
    parameter), ``probe_batch`` ``"auto"``: the second value says so (the operator measures it).
    A keyword that is no operator field is a :class:`TypeError`, as Python says it. ``depth``:
    the frames between the caller and the user's code (for the warning)."""
    values = renamed(HessianSettings, fields, caller, stacklevel=3 + depth)
    unknown = sorted(set(values) - set(OPERATOR_FIELDS))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    params = values.get("params", ())
    if params is None or isinstance(params, str | list):
        values["params"] = (
            () if params is None else (params,) if isinstance(params, str) else tuple(params)
        )
    width = values.get("probe_batch")
    measure = width == AUTO_PROBE_BATCH
    if measure:
        del values["probe_batch"]
    elif isinstance(width, str):
        raise SettingsError("probe_batch", f"must be a positive integer or 'auto', got {width!r}")
    if settings is not None and not isinstance(settings, HessianSettings):
        raise InputError(
            "settings",
            f"expected a HessianSettings, got {type(settings).__name__}",
            "build one with curvcal.HessianSettings(...), or pass its fields as keywords",
        )
    base = HessianSettings() if settings is None else settings
    return (base.replace(**values) if values else base), measure


def check_curvature(settings: HessianSettings, loss: Loss) -> None:
    """Refuse a curvature kind the loss or the other settings cannot give (each error names its
    field): the GGN and both Fishers need the loss's derivatives in the logits in closed form
    (ce, focal, flsd53: not a user's loss), independent samples (eval mode: train-mode BatchNorm
    couples a batch's rows, so ∂z_n/∂θ is not one sample's), and are made by their own kernel
    (``gauss_newton_product``), not by torch.func's Hessian product (``hvp`` func)."""
    curvature, mode, engine = settings.curvature, settings.mode, settings.hvp
    if curvature == "hessian":
        return
    problem = closed_form_problem(loss)
    if problem:
        raise SettingsError(
            "curvature", f"{curvature} cannot be taken of this loss: {problem}", "use hessian"
        )
    if mode != "eval":
        raise SettingsError(
            "curvature",
            f"{curvature} needs per-sample logits, and train mode couples the samples of a batch",
            f"use {setting_name('mode')} eval",
        )
    if engine == "func":
        hvp = setting_name("hvp")
        raise SettingsError(
            "hvp",
            f"func computes Hessian products; {curvature} products have their own kernel",
            f"use {hvp} auto or autograd",
        )


def checked_loss(settings: HessianSettings, loss: Loss | None = None) -> Loss:
    """The loss of an operator: ``loss`` when given (a loss object carries its own γ: another
    ``gamma`` in the settings beside it is refused), else the one the settings name
    (:func:`~curvcal.losses.loss_from_name` of ``loss`` with ``gamma``)."""
    if loss is None:
        return loss_from_name(settings.loss, settings.focal_gamma)
    if settings.gamma not in (None, 0.0, loss.gamma):
        gamma = setting_name("gamma")
        raise SettingsError(
            "gamma", "is part of the loss object", f"leave {gamma} unset when passing a loss"
        )
    return loss


def check_model(model: Any) -> None:
    """Refuse a ``model`` that is no ``torch.nn.Module``, naming the argument."""
    if not isinstance(model, nn.Module):
        raise InputError("model", f"expected a torch.nn.Module, got {type(model).__name__}")


def check_options(model: nn.Module, settings: HessianSettings) -> MemoryBudget | None:
    """Refuse settings that cannot run on ``model`` (train mode with dropout, torch.func on
    TorchScript; each error names its field); the memory budget parsed (None when not given).
    The values themselves were checked when the settings were made."""
    check_model(model)
    budget = None if settings.memory_budget is None else parse_memory_budget(settings.memory_budget)
    if settings.mode == "train":
        stochastic = stochastic_layers(model)
        if stochastic:
            raise SettingsError(
                "mode",
                f"train mode with dropout ({', '.join(stochastic)}) makes the loss random, so its Hessian is undefined",
                f"use {setting_name('mode')} eval",
            )
    if settings.hvp == "func" and is_torchscript(model):
        raise SettingsError(
            "hvp",
            "torch.func cannot trace a TorchScript module",
            f"use {setting_name('hvp')} autograd (double backward) or auto",
        )
    return budget


def select_parameters(
    model: nn.Module, patterns: Sequence[str] | str | None
) -> tuple[tuple[str, ...], tuple[Tensor, ...]]:
    """The names and tensors of the parameters a Hessian is taken in, in
    ``named_parameters()`` order: every one with ``requires_grad`` (``patterns`` None), or
    those whose names match one of the glob ``patterns`` (each must match at least one). They
    must share one floating dtype."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if patterns is None:
        chosen = trainable
    else:
        if isinstance(patterns, str):
            patterns = [patterns]
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(n, pattern) for n, _ in trainable):
                names = ", ".join(n for n, _ in trainable[:8]) + (
                    ", …" if len(trainable) > 8 else ""
                )
                raise SettingsError(
                    "params",
                    f"pattern {pattern!r} matches no trainable parameter",
                    f"names are: {names}",
                )
        chosen = [
            (n, p) for n, p in trainable if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)
        ]
    if not chosen:
        raise InputError("model", "has no trainable parameters (requires_grad=True)")
    dtypes = {p.dtype for _, p in chosen}
    if len(dtypes) != 1 or not chosen[0][1].is_floating_point():
        raise SettingsError(
            "params",
            f"the selected parameters must share one floating dtype, got {sorted(map(str, dtypes))}",
        )
    return tuple(n for n, _ in chosen), tuple(p for _, p in chosen)


def OperatorOptions(**fields: Any) -> HessianSettings:
    """Deprecated: the settings of an operator, now the
    :class:`~curvcal.settings.hessian.HessianSettings` themselves (``engine`` is ``hvp``).
    Returns them, with a :class:`DeprecationWarning`."""
    import warnings

    warnings.warn(
        "OperatorOptions is deprecated: pass HessianSettings, or its fields as keywords",
        DeprecationWarning,
        stacklevel=2,
    )
    settings, _measure = operator_settings(None, fields, "OperatorOptions")
    return settings
