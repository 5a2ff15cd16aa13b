"""One declaration per setting: a dataclass field that carries its option, type, default and help.

A settings class is a frozen dataclass whose fields are made by :func:`setting`. Everything
else about a setting is derived from that one field:

- the click option (:func:`click_options`): ``--field-name`` (underscores become dashes), the
  type, range or choices, the default and the help text;
- validation (:func:`check_fields`, called by :class:`Settings`' ``__post_init__``): the same
  type, range and choices, for values that arrive from Python or from a policy file rather than
  from the command line; errors name the field (:class:`~curvcal.errors.SettingsError`), which
  the command line words as the option (``--top-k: must be an integer ≥ 1, got 0``) and Python
  as the field (``top_k: ...``);
- the report's record (:func:`record`): ``{field name: JSON value}``, the field names being the
  option names;
- the defaults and the known names a policy may set (:func:`defaults`).

Nothing here imports torch: ``--help`` builds its options from these fields alone.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

from curvcal.errors import FormerSpellingWarning, InputError, SettingsError, as_option, setting_name

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S", bound="Settings")

#: the key of a field's metadata that holds its :class:`Spec`
_KEY = "curvcal.setting"


@dataclass(frozen=True)
class Spec:
    """How one setting is typed on the command line and checked anywhere.

    ``help`` is the option's help text; ``choices`` the words it takes; ``low``/``high`` its
    bounds (open when ``low_open``/``high_open``); ``flag`` a boolean switch (``--x/--no-x``
    when ``negatable``); ``multiple`` a repeatable option gathered into a tuple; ``parse`` a
    click callback that turns the typed text into the value (lists, sizes, JSON); ``metavar``,
    ``short`` (``-k``), ``aliases`` (more spellings), ``path`` (``"file"``, ``"dir"`` or
    ``"any"`` for a :class:`~pathlib.Path`) and ``default_text`` (shown instead of a computed
    default) shape the option; ``cli`` false keeps a field off the command line (set by the
    code, recorded in the report); ``record`` false keeps it out of the report.
    ``bound_reason`` says why the bounds are what they are: the hint of an out-of-range error,
    on the command line as from a policy or Python. ``former_words``: ``(old word, the word
    today)`` pairs of a renamed choice, still read wherever a user could have written the old
    one (option, policy, Python, a report read back), with a :class:`FormerSpellingWarning`.
    ``policy``: whether a ``check`` policy's ``[settings]`` may set the field (true: by the
    field's name; a tuple: the keys that set it, ``("eigen_method",)``); ``study``: whether
    ``curvcal study`` takes the field as an option (Hessian settings). ``None``: not said, which
    a test refuses for every class a policy or ``study`` draws from
    (:func:`field_policy_keys`).
    """

    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    flag: bool = False
    negatable: bool = False
    multiple: bool = False
    parse: Callable[..., Any] | None = None
    metavar: str | None = None
    short: str | None = None
    aliases: tuple[str, ...] = ()
    path: str | None = None
    default_text: str | None = None
    cli: bool = True
    record: bool = True
    required: bool = False
    bound_reason: str | None = None
    operator: bool = False
    former: tuple[str, ...] = ()
    former_words: tuple[tuple[str, str], ...] = ()
    policy: bool | tuple[str, ...] | None = None
    study: bool | None = None


def setting(default: Any = None, help: str = "", **spec: Any) -> Any:
    """A settings field: ``default`` and the :class:`Spec` keywords (``help`` first)."""
    metadata = {_KEY: Spec(help=help, **spec)}
    if isinstance(default, dict | list):
        frozen = dict(default) if isinstance(default, dict) else list(default)
        return dataclasses.field(default_factory=lambda: type(frozen)(frozen), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def file_setting(help: str, metavar: str = "FILE", **spec: Any) -> Any:
    """A settings field naming a file, unset by default (:func:`setting` with ``path="file"``)."""
    return setting(None, help, path="file", metavar=metavar, **spec)


def folder_setting(help: str, metavar: str | None = "DIR", **spec: Any) -> Any:
    """A settings field naming a folder, unset by default (``path="dir"``)."""
    return setting(None, help, path="dir", metavar=metavar, **spec)


def option_name(name: str) -> str:
    """The option that sets field ``name``: ``top_k`` -> ``--top-k``."""
    return as_option(name)


def operator_fields(cls: type[Settings]) -> tuple[str, ...]:
    """The fields of ``cls`` a Hessian operator is built with (``Spec.operator``)."""
    return tuple(field.name for field, spec in settings_fields(cls) if spec.operator)


def former_names(cls: type[Settings]) -> dict[str, str]:
    """``{former name: field name}`` of the fields of ``cls`` that were renamed."""
    return {old: field.name for field, spec in settings_fields(cls) for old in spec.former}


def renamed(
    cls: type[Settings], values: Mapping[str, Any], caller: str, stacklevel: int = 3
) -> dict[str, Any]:
    """``values`` with every former name of a field of ``cls`` (``engine``) replaced by the
    field's (``hvp``), each with a :class:`DeprecationWarning` that ``caller`` took it (pointing
    ``stacklevel`` frames up: the user's call); a value given under both names is refused."""
    import warnings

    former = former_names(cls)
    current: dict[str, Any] = {}
    for name, value in values.items():
        field = former.get(name)
        if field is None:
            current[name] = value
            continue
        if field in values:
            raise SettingsError(field, f"given twice, as {field!r} and as its former name {name!r}")
        warnings.warn(
            f"{caller}: {name!r} is now called {field!r}; the old name will be removed",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        current[field] = value
    return current


def field_policy_keys(field: dataclasses.Field[Any], spec: Spec) -> tuple[str, ...]:
    """The keys of a policy's ``[settings]`` that set ``field`` (:attr:`Spec.policy`): its own
    name when true, none when false or not said."""
    if spec.policy is True:
        return (field.name,)
    return spec.policy or ()


def study_fields(cls: type[Settings]) -> tuple[str, ...]:
    """The fields of ``cls`` that ``curvcal study`` takes as options (:attr:`Spec.study`), in
    declaration order."""
    return tuple(field.name for field, spec in settings_fields(cls) if spec.study)


def former_spelling_note(said: str, old: str, new: str) -> str:
    """What a :class:`~curvcal.errors.FormerSpellingWarning` says: ``said`` (the setting as
    the place it was written names it) took the former word ``old`` of ``new``."""
    return f"{said} {old!r} is now spelled {new!r}; the old spelling will be removed"


def word_today(cls: type[Settings], name: str, value: Any) -> Any:
    """``value`` of field ``name`` of ``cls`` as it is spelled today, silently: a former word
    (:attr:`Spec.former_words`) becomes today's; anything else is ``value`` itself."""
    spec = next((s for f, s in settings_fields(cls) if f.name == name), None)
    if spec is None or not isinstance(value, str):
        return value
    return dict(spec.former_words).get(value, value)


def spelled_now(
    cls: type[Settings], name: str, value: Any, said: str | None = None, stacklevel: int = 3
) -> Any:
    """``value`` of field ``name`` of ``cls`` as it is spelled today: a former word of the
    field (:attr:`Spec.former_words`) becomes today's, with a
    :class:`~curvcal.errors.FormerSpellingWarning` naming ``said`` (default: the setting as
    messages made here name it, :func:`~curvcal.errors.setting_name`); anything else as it is.
    """
    import warnings

    now = word_today(cls, name, value)
    if now is value:
        return value
    warnings.warn(
        former_spelling_note(said or setting_name(name), value, now),
        FormerSpellingWarning,
        stacklevel=stacklevel,
    )
    return now


def former_keywords(**former: str) -> Callable[[F], F]:
    """A public function whose keywords were renamed to the settings fields' names
    (``n_probes`` -> ``probes``): ``former`` maps each old keyword to today's. A call with an
    old keyword is taken with a :class:`DeprecationWarning` (pointing at the caller); the same
    setting given under both names is refused, naming today's."""
    import warnings

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in former.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise SettingsError(
                        new, f"given twice, as {new!r} and as its former name {old!r}"
                    )
                warnings.warn(
                    f"{func.__name__}: {old!r} is now called {new!r}, as the settings and the "
                    "command line name it; the old name will be removed",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def spec_of(field: dataclasses.Field[Any]) -> Spec | None:
    spec = field.metadata.get(_KEY)
    return spec if isinstance(spec, Spec) else None


def settings_fields(cls: type[Settings] | Settings) -> list[tuple[dataclasses.Field[Any], Spec]]:
    """The fields of ``cls`` made by :func:`setting`, in declaration order."""
    found = []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec = spec_of(field)
        if spec is not None:
            found.append((field, spec))
    return found


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    import curvcal.settings.fields as here

    return typing.get_type_hints(cls, vars(here) | {"Path": Path})


def _kind(cls: type, name: str) -> tuple[type, bool]:
    """The base type of field ``name`` (int, float, str, bool, Path, tuple, dict) and whether
    it may be None."""
    hint = _hints(cls)[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional or isinstance(hint, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) > 1:  # ``str | int``: either, checked by the class's own rules
            return object, optional
        hint = rest[0]
    origin = typing.get_origin(hint) or hint
    if origin in (tuple, list):
        return tuple, optional
    if origin is dict:
        return dict, optional
    return (origin if isinstance(origin, type) else object), optional


def field_kind(cls: type, name: str) -> tuple[type, bool]:
    """The base type of field ``name`` of ``cls`` (int, float, str, bool, Path, tuple, dict,
    object) and whether it may be None."""
    return _kind(cls, name)


def default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def defaults(cls: type[Settings]) -> dict[str, Any]:
    """``{field name: default}`` of every setting of ``cls``."""
    return {field.name: default_of(field) for field, _spec in settings_fields(cls)}


# --------------------------------------------------------------------------- validation


def _bound_text(spec: Spec) -> str:
    parts = []
    if spec.low is not None:
        parts.append(f"{'>' if spec.low_open else '≥'} {_number(spec.low)}")
    if spec.high is not None:
        parts.append(f"{'<' if spec.high_open else '≤'} {_number(spec.high)}")
    return " and ".join(parts)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(value)


def _in_bounds(spec: Spec, value: float) -> bool:
    if spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low):
        return False
    return not (
        spec.high is not None and (value >= spec.high if spec.high_open else value > spec.high)
    )


#: where a value came from, for messages: field name -> ``(what, label)``: the error's ``what``
#: (an option, a policy's ``FILE:LINE``) and the name the message starts with (``""``: none,
#: the option already names it); ``None``: the field's option
Where = Callable[[str], tuple[str, str] | None]


def check_value(
    cls: type,
    field: dataclasses.Field[Any],
    spec: Spec,
    value: Any,
    where: Where | None = None,
) -> None:
    """Raise :class:`~curvcal.errors.SettingsError` when ``value`` is not of the field's type,
    range or choices, naming the field (or, with ``where``, an :class:`InputError` naming the
    place and name it gives for the field)."""
    try:
        _check_value(cls, field, spec, value)
    except InputError as error:
        address = where(field.name) if where is not None else None
        if address is None:
            raise
        what, label = address
        if not label:
            raise InputError(what, error.why, error.hint) from None
        if spec.choices is not None and value not in spec.choices:
            raise InputError(
                what, f"{label} {value!r} is not one of {', '.join(spec.choices)}"
            ) from None
        raise InputError(what, f"{label} {error.why}", error.hint) from None


def _check_value(cls: type, field: dataclasses.Field[Any], spec: Spec, value: Any) -> None:
    what = field.name
    kind, optional = _kind(cls, field.name)
    if value is None:
        if optional or kind is object:
            return
        raise SettingsError(what, "must be given")
    if kind is bool:
        if not isinstance(value, bool):
            raise SettingsError(what, f"must be true or false, got {value!r}")
        return
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(what, f"must be an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SettingsError(what, f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise SettingsError(what, f"must be a finite number, got {value!r}")
    elif kind is str and not isinstance(value, str):
        raise SettingsError(what, f"must be a string, got {value!r}")
    elif kind is Path and not isinstance(value, str | Path):
        raise SettingsError(what, f"must be a path, got {value!r}")
    elif kind is tuple:
        if isinstance(value, str) or not isinstance(value, tuple | list):
            raise SettingsError(what, f"must be a list, got {value!r}")
    elif kind is dict and not isinstance(value, Mapping):
        raise SettingsError(what, f"must be a table of keys and values, got {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise SettingsError(
            what, f"unknown value {value!r}", f"choose one of {', '.join(spec.choices)}"
        )
    if kind in (int, float) and not _in_bounds(spec, value):
        noun = "an integer" if kind is int else "a number"
        raise SettingsError(
            what, f"must be {noun} {_bound_text(spec)}, got {value!r}", spec.bound_reason
        )


def check_fields(settings: Settings, where: Where | None = None) -> None:
    """Every setting of ``settings`` against its declared type, range and choices (a lower
    bound that depends on another field comes from :meth:`Settings.lowest`); ``where`` says
    where each value came from (default: its option)."""
    cls = type(settings)
    for field, spec in settings_fields(cls):
        low = settings.lowest(field.name)
        if low is not None:
            spec = dataclasses.replace(spec, low=low, low_open=False)
        check_value(cls, field, spec, getattr(settings, field.name), where)


class Settings:
    """Base of every settings dataclass: checks each field on construction, then the class's
    own :meth:`validate` (the rules between fields, in one place per class).

    ``GROUP`` names the class's part of a report's ``settings`` record
    (``{"hessian": {...}, "data": {...}}``).
    """

    GROUP: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for field, spec in settings_fields(type(self)):
            if spec.former_words:  # a former word given from Python: today's, with a note
                value = getattr(self, field.name)
                now = spelled_now(type(self), field.name, value, stacklevel=5)
                if now is not value:
                    object.__setattr__(self, field.name, now)
        check_fields(self)
        self.validate()

    def validate(self) -> None:
        """Rules that tie fields together; raise :class:`~curvcal.errors.SettingsError` naming
        the field at fault."""

    def lowest(self, name: str) -> float | None:
        """The least value of field ``name`` where it depends on other fields (else None: the
        declared bound)."""
        return None

    def replace(self: S, **changes: Any) -> S:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def record(settings: Settings) -> dict[str, Any]:
    """The report's record of ``settings``: ``{option name with underscores: JSON value}``."""
    return {
        field.name: _jsonable(getattr(settings, field.name))
        for field, spec in settings_fields(type(settings))
        if spec.record
    }


def groups(*settings: Settings) -> dict[str, dict[str, Any]]:
    """A report's ``settings``: ``{GROUP: record}`` of each settings object, in order."""
    return {type(item).GROUP: record(item) for item in settings}


def _as_field_type(cls: type, name: str, value: Any) -> Any:
    """A value as a mapping (TOML, JSON) holds it, in the field's type: a string as a path, a
    list as a tuple, an integer as a float; anything else as it is (checked later)."""
    kind, _optional = _kind(cls, name)
    if kind is Path and isinstance(value, str):
        return Path(value)
    if kind is tuple and isinstance(value, list):
        return tuple(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def from_mapping(
    cls: type[S], values: Mapping[str, Any], where: Where | None = None, **fixed: Any
) -> S:
    """An instance of ``cls`` from those ``values`` that name its fields (others ignored), each
    converted to its field's type, and ``fixed``. With ``where``, every field is checked first
    and an error names the place ``where`` gives for it (a policy's line, not an option the
    user never typed)."""
    names = {field.name for field, _spec in settings_fields(cls)}
    chosen = {
        name: _as_field_type(cls, name, spelled_now(cls, name, value))
        for name, value in values.items()
        if name in names
    }
    arguments = {**chosen, **fixed}
    if where is not None:
        draft = object.__new__(cls)  # the values unchecked: lowest() may read other fields
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            value = arguments[field.name] if field.name in arguments else default_of(field)
            object.__setattr__(draft, field.name, value)
        check_fields(draft, where)
    return cls(**arguments)


# --------------------------------------------------------------------------- command line


def comma_numbers(
    ctx: Any, param: Any, value: str, malformed: str, empty: str
) -> tuple[float, ...]:
    """The numbers of a comma-separated list option (``0.5,0.4,0.3``; empty parts skipped),
    or :class:`click.BadParameter` with ``malformed`` (a part is no number) or ``empty``."""
    import click

    try:
        numbers = tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(malformed, ctx, param) from None
    if not numbers:
        raise click.BadParameter(empty, ctx, param)
    return numbers


@functools.cache
def _int_range() -> Any:
    """click's IntRange whose out-of-range error also says why the range is what it is."""
    import click

    class IntRange(click.IntRange):
        def __init__(self, *args: Any, reason: str | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.reason = reason

        def fail(self, message: str, param: Any = None, ctx: Any = None) -> NoReturn:
            if self.reason and "range" in message:  # not "is not a valid integer"
                message = f"{message.rstrip('.')} ({self.reason})"
            super().fail(message, param, ctx)

    return IntRange


@functools.cache
def _choice_type() -> Any:
    """click's Choice that also reads a field's former words (:attr:`Spec.former_words`) as
    today's, with a :class:`~curvcal.errors.FormerSpellingWarning`; its help lists today's."""
    import warnings

    import click

    class Choice(click.Choice):
        def __init__(self, choices: tuple[str, ...], former: dict[str, str]) -> None:
            super().__init__(choices)
            self.former = former

        def convert(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, str) and value in self.former:
                said = param.opts[0] if param is not None and param.opts else value
                warnings.warn(
                    former_spelling_note(said, value, self.former[value]),
                    FormerSpellingWarning,
                    stacklevel=2,
                )
                value = self.former[value]
            return super().convert(value, param, ctx)

    return Choice


def _click_type(cls: type, field: dataclasses.Field[Any], spec: Spec) -> Any:
    import click

    kind, _optional = _kind(cls, field.name)
    if spec.parse is not None:
        return None
    if spec.choices is not None:
        if spec.former_words:
            return _choice_type()(spec.choices, dict(spec.former_words))
        return click.Choice(spec.choices)
    if kind in (int, float) and spec.low is None and spec.high is None:
        return click.INT if kind is int else click.FLOAT
    if kind is int:
        return _int_range()(
            None if spec.low is None else int(spec.low),
            None if spec.high is None else int(spec.high),
            min_open=spec.low_open,
            max_open=spec.high_open,
            reason=spec.bound_reason,
        )
    if kind is float:
        return click.FloatRange(
            spec.low, spec.high, min_open=spec.low_open, max_open=spec.high_open
        )
    if kind is Path or spec.path is not None:
        return click.Path(
            path_type=Path, dir_okay=spec.path != "file", file_okay=spec.path != "dir"
        )
    return None


def click_option(
    cls: type,
    field: dataclasses.Field[Any],
    spec: Spec,
    required: bool = False,
    *,
    no_default: bool = False,
    fallback: str | None = None,
    help: str | None = None,
) -> Callable[[F], F]:
    """The click option of one settings field (``required`` on this command). ``no_default``:
    the option has no default of its own (a value from elsewhere, ``fallback``, applies unless
    it is typed; the help says so and gives the field's default); ``help`` replaces the field's
    help text."""
    import click

    default = default_of(field)
    if help is not None:
        spec = dataclasses.replace(spec, help=help)
    if no_default:
        shown = spec.default_text or (
            None if default in (None, (), {}) or spec.flag else _default_text(default)
        )
        if spec.flag or spec.multiple:  # a switch or a list typed here adds to what is set
            fallback = shown = None
        said = ", else ".join(part for part in (fallback, shown) if part)
        spec = dataclasses.replace(
            spec, help=spec.help + (f"  [default: {said}]" if said else ""), default_text=None
        )
        default = None
    names = [option_name(field.name), *spec.aliases]
    if spec.short:
        names.insert(0, spec.short)
    kwargs: dict[str, Any] = {"help": spec.help}
    if spec.flag:
        if spec.negatable:
            names = [f"{option_name(field.name)}/--no-{field.name.replace('_', '-')}"]
        kwargs.update(is_flag=True, default=bool(default))
        kwargs["show_default"] = spec.negatable and not no_default
    else:
        click_type = _click_type(cls, field, spec)
        if click_type is not None:
            kwargs["type"] = click_type
        if spec.parse is not None:
            kwargs["callback"] = spec.parse
        if spec.multiple:
            kwargs["multiple"] = True
        elif default is not None and not isinstance(default, dict | tuple | list):
            kwargs.update(default=default, show_default=True)
        if spec.metavar:
            kwargs["metavar"] = spec.metavar
        if spec.required or required:
            kwargs["required"] = True
    if spec.default_text:
        kwargs["help"] = f"{spec.help}  [default: {spec.default_text}]"
    return click.option(*names, field.name, **kwargs)


def _default_text(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ",".join(f"{item:g}" if isinstance(item, float) else str(item) for item in value)
    return str(value)


def cli_fields(
    cls: type[Settings], exclude: tuple[str, ...] = (), only: tuple[str, ...] | None = None
) -> list[tuple[dataclasses.Field[Any], Spec]]:
    """The fields of ``cls`` that are options: all but ``exclude``, or just ``only``."""
    return [
        (f, s)
        for f, s in settings_fields(cls)
        if s.cli and f.name not in exclude and (only is None or f.name in only)
    ]


def gather(
    cls: type[S],
    kwargs: dict[str, Any],
    exclude: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
    **fixed: Any,
) -> S:
    """Pop the options of ``cls`` out of a command's ``kwargs`` and build the settings (fields
    that are no option of this command keep their defaults, or take ``fixed``)."""
    values: dict[str, Any] = {}
    for field, spec in cli_fields(cls, exclude, only):
        value = kwargs.pop(field.name)
        if spec.multiple and isinstance(value, list | tuple):
            value = tuple(value)
        if value is None and not spec.multiple and not _kind(cls, field.name)[1]:
            continue  # not typed: the field's default
        values[field.name] = value
    return cls(**{**values, **fixed})


def _typed(
    cls: type[Settings],
    kwargs: dict[str, Any],
    exclude: tuple[str, ...],
    only: tuple[str, ...] | None,
) -> dict[str, Any]:
    """Pop the options of ``cls`` out of ``kwargs``: those typed, ``{field name: value}``."""
    import click
    from click.core import ParameterSource

    context = click.get_current_context()
    typed: dict[str, Any] = {}
    for field, spec in cli_fields(cls, exclude, only):
        value = kwargs.pop(field.name)
        if context.get_parameter_source(field.name) in (None, ParameterSource.DEFAULT):
            continue
        typed[field.name] = tuple(value) if spec.multiple and isinstance(value, list) else value
    return typed


def click_options(
    cls: type[Settings],
    keyword: str,
    *,
    exclude: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
    required: tuple[str, ...] = (),
    build: Callable[[dict[str, Any]], Any] | None = None,
    before: Callable[[dict[str, Any]], None] | None = None,
    no_defaults: bool = False,
    fallback: str | None = None,
    helps: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """A decorator adding one click option per field of ``cls`` (but ``exclude``, or just
    ``only``: a command that takes a part of a class, ``study`` of the Hessian's; ``required``:
    the fields this command cannot do without); the command
    receives the settings as one ``keyword`` argument. ``build`` (given the command's keyword
    arguments) replaces the plain construction where a class needs more (an optional group);
    ``before`` sees the typed values first (to refuse options that would do nothing).

    ``no_defaults``: the options have no defaults, and the command receives only the values
    typed on the command line (or given by an environment variable), ``{field name: value}``,
    for a command whose settings come from elsewhere unless an option is typed (``check``'s
    policy); ``fallback`` says in the help where an untyped value comes from. ``helps``: help texts that say more on this command than the field's."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                before(kwargs)
            if no_defaults:
                kwargs[keyword] = _typed(cls, kwargs, exclude, only)
            elif build is not None:
                kwargs[keyword] = build(kwargs)
            else:
                kwargs[keyword] = gather(cls, kwargs, exclude, only)
            return func(*args, **kwargs)

        command: Any = wrapper
        for field, spec in reversed(cli_fields(cls, exclude, only)):
            command = click_option(
                cls,
                field,
                spec,
                field.name in required,
                no_default=no_defaults,
                fallback=fallback,
                help=(helps or {}).get(field.name),
            )(command)
        return command

    return decorate
