"""Build the module a state dict belongs to, from an architecture spec.

Specs:

- ``tv:NAME``: ``torchvision.models.get_model(NAME, weights=None, **kwargs)`` (no download);
- ``curvcal:NAME``: an architecture bundled with curvcal (:data:`curvcal.models.BUILTIN_ARCHITECTURES`);
- ``timm:NAME``: ``timm.create_model(NAME, pretrained=False, **kwargs)`` (the ``timm`` extra);
- ``hf:FOLDER``: the transformers classifier of ``FOLDER/config.json`` (the ``hf`` extra;
  a config naming custom code needs ``--trust-checkpoint``), returning logits;
- ``py:package.module:Class``: imports user code, so it needs ``--trust-checkpoint``.

torchvision, timm, transformers and curvcal architectures come from installed, reviewed code and
are safe to build.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from curvcal.errors import CurvcalError, InputError, TrustError
from curvcal.inputs import import_recorded
from curvcal.load.limits import check_num_classes
from curvcal.load.models.library_limits import library_warnings

ARCH_OPTION = "--arch"
KWARGS_OPTION = "--arch-kwargs"
SCHEMES = ("tv", "timm", "hf", "curvcal", "py")
#: the library that builds each scheme's models, as its warnings name it
LIBRARIES = {"tv": "torchvision", "timm": "timm", "hf": "transformers", "curvcal": "curvcal"}


def build_architecture(
    spec: str, kwargs: Mapping[str, Any], trust: bool, notes: list[str] | None = None
) -> nn.Module:
    """Construct the (randomly initialised) module named by ``spec`` with ``kwargs``; what
    the library (or the ``py:`` factory) warns about meanwhile is added to ``notes``
    (:func:`~curvcal.load.models.library_limits.library_warnings`), or, with no ``notes`` (a
    script calling it), warned once each as a :class:`UserWarning`."""
    if notes is None:
        held: list[str] = []
        module = build_architecture(spec, kwargs, trust, held)
        for note in held:
            warnings.warn(note, UserWarning, stacklevel=2)
        return module
    factory, accepts = resolve_architecture(spec, trust)
    check_num_classes(kwargs, KWARGS_OPTION)
    if accepts is not None:
        unknown = sorted(set(kwargs) - accepts)
        if unknown:
            raise InputError(
                KWARGS_OPTION,
                f"{spec} does not accept {', '.join(unknown)}",
                f"it accepts: {', '.join(sorted(accepts)) or 'no keyword arguments'}",
            )
    try:
        with library_warnings(LIBRARIES.get(spec.partition(":")[0], spec), notes):
            module = factory(**kwargs)
    except TypeError as exc:
        raise InputError(
            KWARGS_OPTION, f"{spec} cannot be built with {dict(kwargs)}: {_one_line(exc)}"
        ) from exc
    except CurvcalError:
        raise
    except MemoryError:
        raise  # said as the memory it is, by the CLI
    except Exception as exc:  # the builder's own code (a py: class runs the user's): its error
        said = _one_line(exc)
        if not isinstance(exc, ValueError | RuntimeError | AssertionError):
            said = f"{type(exc).__name__}: {said}"  # a KeyError's text alone is only the key
        raise InputError(ARCH_OPTION, f"building {spec} failed: {said}") from exc
    if not isinstance(module, nn.Module):
        raise InputError(ARCH_OPTION, f"{spec} built a {type(module).__name__}, not a torch module")
    return module


def accepts_keyword(spec: str, name: str, trust: bool) -> bool:
    """Whether the architecture's constructor takes keyword ``name`` (torchvision builders are
    assumed to take ``num_classes``, as every classification model there does)."""
    _factory, accepts = resolve_architecture(spec, trust)
    return accepts is None or name in accepts


def resolve_architecture(
    spec: str, trust: bool
) -> tuple[Callable[..., Any], frozenset[str] | None]:
    """The constructor for ``spec`` and the keyword names it accepts (``None``: not knowable,
    such as a builder taking ``**kwargs``)."""
    scheme, sep, name = spec.partition(":")
    if not sep or scheme not in SCHEMES or not name:
        raise InputError(
            ARCH_OPTION,
            f"{spec!r} is not an architecture spec",
            "use tv:NAME (torchvision), timm:NAME, hf:FOLDER, curvcal:NAME (bundled) or "
            "py:package.module:Class",
        )
    if scheme == "tv":
        return _torchvision(name), None
    if scheme == "timm":
        return _timm(name), None
    if scheme == "hf":
        return _hf(name, trust), frozenset()
    if scheme == "curvcal":
        from curvcal.models import BUILTIN_ARCHITECTURES

        if name not in BUILTIN_ARCHITECTURES:
            raise InputError(
                ARCH_OPTION,
                f"no bundled architecture {name!r}",
                _suggest(name, BUILTIN_ARCHITECTURES),
            )
        cls = BUILTIN_ARCHITECTURES[name]
        return cls, _keywords(cls)
    if not trust:
        raise TrustError(
            ARCH_OPTION,
            f"{spec} imports and runs Python code from {name.partition(':')[0] or name}",
            "pass --trust-checkpoint if you trust that code",
        )
    factory = _import_object(spec, name)
    return factory, _keywords(factory)


def _torchvision(name: str) -> Callable[..., Any]:
    import torchvision

    available = torchvision.models.list_models()
    if name not in available:
        raise InputError(
            ARCH_OPTION, f"torchvision has no model {name!r}", _suggest(name, available)
        )

    def build(**kwargs: Any) -> Any:
        return torchvision.models.get_model(name, weights=None, **kwargs)

    return build


def _timm(name: str) -> Callable[..., Any]:
    from curvcal.load.extras import require
    from curvcal.load.models.hf import build_timm

    timm = require("timm", "timm", f"{ARCH_OPTION} timm:{name}")
    if not timm.is_model(name):
        build_timm(name, {})  # raises, with suggestions

    def build(**kwargs: Any) -> Any:
        return build_timm(name, kwargs)

    return build


def _hf(folder: str, trust: bool) -> Callable[..., Any]:
    from pathlib import Path

    from curvcal.load.extras import require
    from curvcal.load.models.hf import build_folder_model, read_folder

    described = read_folder(Path(folder).expanduser(), need_weights=False)
    if described.library == "transformers":  # imported before its warnings are held
        require("hf", "transformers", f"{ARCH_OPTION} hf:{folder}")

    def build() -> Any:
        return build_folder_model(described, trust)

    return build


def _import_object(spec: str, target: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(ARCH_OPTION, f"{spec!r} must look like py:package.module:Class")
    try:
        obj: Any = import_recorded(module_name, "--arch module source")
    except ImportError as exc:
        raise InputError(ARCH_OPTION, f"cannot import {module_name}: {_one_line(exc)}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(ARCH_OPTION, f"{module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(ARCH_OPTION, f"{spec} is not a class or function")
    return obj


def _keywords(factory: Callable[..., Any]) -> frozenset[str] | None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )


def _suggest(name: str, choices: Any) -> str:
    close = difflib.get_close_matches(name, list(choices), n=5, cutoff=0.5)
    if close:
        return "did you mean " + ", ".join(close) + "?"
    return f"{len(list(choices))} available"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def tied_output_widths(module: nn.Module) -> frozenset[int]:
    """The output widths of the ``nn.Linear`` layers whose weight is an ``nn.Embedding``'s
    (a head tied to the input embedding): such a layer is as wide as the vocabulary, which says
    nothing about how many classes there are."""
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    return frozenset(
        m.out_features
        for m in module.modules()
        if isinstance(m, nn.Linear) and id(m.weight) in embeddings
    )
