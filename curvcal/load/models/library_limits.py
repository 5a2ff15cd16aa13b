"""Bounds on the settings a model folder's or adapter folder's config hands to transformers and
peft, checked before the library runs them: a few bytes of JSON must not buy an unbounded load.

Three moments, one table (:data:`BOUNDS`, one row per key) and two checks against what is there:

- when a config file is read (:func:`check_config`, called by :func:`curvcal.load.models.hf.read_json`,
  the one reader of ``config.json``, ``adapter_config.json`` and ``tokenizer_config.json``):
  values checked on their own (ranks and scalings finite, positive and bounded, iteration
  counts and list lengths bounded, a model's sizes and head counts whole and positive, its label count
  within curvcal's, the pad token id inside the vocabulary, a tokenizer's ``model_max_length``
  a whole number);
- when an adapter is about to go on its base (:func:`check_adapter_on_base`, called by
  :func:`curvcal.load.models.adapters.apply_adapter` before peft): values checked against the base
  model (ranks at most the largest rank of a base layer; ``layer_replication`` within its
  layers; every string peft uses as a regular
  expression run, by the engine peft uses, against every module name of the base within
  :data:`PATTERN_SECONDS`);
- when transformers is about to build a model folder's config
  (:func:`check_config_against_weights`, called by the one gate every transformers build goes
  through, ``curvcal.load.models.hf._refuse_before_transformers``): its layer counts and widths
  against the tensors its weights hold, read without reading a tensor (safetensors headers,
  every shard's; a ``pytorch_model.bin`` loaded weights-only onto the ``meta`` device); for a
  folder whose weights are elsewhere (``--arch hf:FOLDER``), the least memory its model needs
  against the memory available (:func:`check_config_alone`).

Why the patterns are timed rather than parsed: a rule on the pattern's shape (no repeat inside a
repeat) still lets ``.*.*.*.*.*.*x`` take polynomial time of high degree, and a rule strict
enough to exclude that also refuses patterns in peft's own documentation
(``.*decoder.*(SelfAttention|EncDecAttention).*(q|v)$``). So each pattern is matched, exactly
as peft will match it (``re.fullmatch`` for ``target_modules``, ``re.match`` of peft's wrapping
for the others), against every module name of the base, in a child process stopped after
:data:`PATTERN_SECONDS`: a pattern that finishes there finishes in peft too (the same engine,
pattern and names), and one that does not is refused, naming the file and the key.

Every refusal is an :class:`~curvcal.errors.InputError` (exit 2) naming the file and the key.

What a library warns about while it loads (:func:`library_warnings`) is held back rather than
printed in its own format before curvcal's lines: dropped when the load fails (curvcal's error
says what is wrong), said once each in curvcal's words when it succeeds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curvcal.errors import InputError, one_line

ADAPTER_CONFIG = "adapter_config.json"
MODEL_CONFIG = "config.json"

#: the largest LoRA rank (``r``, ``rank_pattern`` values): a rank beyond the widest layer of any
#: network does not add capacity, only memory
MAX_RANK = 65_536
#: the largest LoRA scaling numerator (``lora_alpha``, ``alpha_pattern`` values): the adapter's
#: output is multiplied by lora_alpha / r (or / √r); peft's default is 8 and adapters are trained
#: at alpha = r to a few times r, while a finite 1e308 turns every adapter output into an
#: infinity and the run's logits with it (exit 3 on the data, though the config is at fault)
MAX_LORA_ALPHA = 1e6
#: the most iterations of an initialisation peft runs at load (PiSSA's ``pissa_niter_N``, LoftQ's
#: ``loftq_iter``); peft's documentation uses 4 to 16, and a saved adapter's weights replace what
#: the initialisation computes anyway
MAX_INIT_ITERATIONS = 100
#: ``layer_replication``: the replicated stack may hold at most this many times the base's layers
MAX_REPLICATION = 4
#: seconds every regular expression peft will run may take over all of the base's module names
PATTERN_SECONDS = 2.0
#: the most entries of a list peft reads name by name (``target_modules``, ``exclude_modules``,
#: ``modules_to_save``, ``layers_to_transform``): peft's search for the shortest suffixes that
#: tell listed modules from the others grows with the entries times their dots (2,000,000
#: names ran past 120 s), while a list of every linear layer of a 100-layer model with ten per
#: layer holds 1,000; a base with more modules than this names them by suffix (``q_proj``) or
#: by one pattern
MAX_LISTED = 10_000
#: a model config's layer counts, bounded by the weights' tensor count (every layer transformers
#: builds holds at least one weight tensor of its own, or shares one: never more layers than
#: tensors), so a config cannot ask for 200,000 layers over the weights of one
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
              "decoder_layers", "num_decoder_layers")  # fmt: skip
#: a model config's widths, bounded by the weights' largest tensor (each is a dimension of some
#: weight matrix: embedding, projection, MLP; packed quantised weights keep as many elements)
WIDTH_KEYS = ("hidden_size", "intermediate_size", "vocab_size", "n_embd", "n_inner", "d_model",
              "d_ff", "num_attention_heads", "num_key_value_heads")  # fmt: skip
#: a model config's sizes and counts, each the least it may be: transformers divides by the head
#: counts, allocates tables of the widths and positions and loops over the layers, so a 0 or a
#: negative one is a ``ZeroDivisionError``, an ``OverflowError`` or a wrong message deep in the
#: library (a list, as some families give per layer, is left to the library)
SIZE_KEYS: dict[str, int] = {
    **dict.fromkeys(LAYER_KEYS, 0),
    **dict.fromkeys(WIDTH_KEYS, 1),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "head_dim", "n_head",
                     "num_heads", "num_labels"), 1),
    "type_vocab_size": 0,  # DeBERTa-v3 has no token types: 0
}  # fmt: skip
#: ``tokenizer_config.json``
TOKENIZER_CONFIG = "tokenizer_config.json"
#: ``init_lora_weights`` values peft knows (and ``pissa_niter_N``)
INIT_METHODS = ("gaussian", "eva", "olora", "pissa", "corda", "loftq", "orthogonal", "mica")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_positive(value: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def _rank(value: Any) -> str | None:
    if _whole(value) and 1 <= value <= MAX_RANK:
        return None
    return f"{value!r} is not a whole number in 1..{MAX_RANK:,}"


def _scaling(value: Any) -> str | None:
    if _finite_positive(value) and value <= MAX_LORA_ALPHA:
        return None
    return f"{value!r} is not a finite positive number at most {MAX_LORA_ALPHA:g}"


def _dropout(value: Any) -> str | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and 0 <= value <= 1:
        return None
    return f"{value!r} is not a probability in [0, 1]"


def _each_value(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """A check of a mapping's values (``rank_pattern``, ``alpha_pattern``) by ``check``."""

    def checked(value: Any) -> str | None:
        if not isinstance(value, Mapping):
            return f"{type(value).__name__} is not a mapping of module patterns to values"
        for key, item in value.items():
            why = check(item)
            if why is not None:
                return f"entry {key!r}: {why}"
        return None

    return checked


def _init_weights(value: Any) -> str | None:
    if isinstance(value, bool) or value in INIT_METHODS:
        return None
    if isinstance(value, str) and value.startswith("pissa_niter_"):
        count = value.removeprefix("pissa_niter_")
        if count.isdigit() and 1 <= int(count) <= MAX_INIT_ITERATIONS:
            return None
        return (
            f"{value!r} asks for {count} PiSSA iterations, not a whole number in "
            f"1..{MAX_INIT_ITERATIONS}"
        )
    return f"{value!r} is none of true, false, {', '.join(INIT_METHODS)}, pissa_niter_N"


def _loftq(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return f"{type(value).__name__} is not a mapping"
    iterations = value.get("loftq_iter", 1)
    if not (_whole(iterations) and 1 <= iterations <= MAX_INIT_ITERATIONS):
        return f"loftq_iter {iterations!r} is not a whole number in 1..{MAX_INIT_ITERATIONS}"
    bits = value.get("loftq_bits", 4)
    if bits not in (2, 4, 8) or isinstance(bits, bool):
        return f"loftq_bits {bits!r} is not 2, 4 or 8"
    return None


def _replication(value: Any) -> str | None:
    """The shape of ``layer_replication``: a list of ``[start, end)`` pairs (its size against
    the base's layers is checked by :func:`check_adapter_on_base`)."""
    if not isinstance(value, list):
        return f"{type(value).__name__} is not a list of [start, end] layer ranges"
    for pair in value:
        if not _pair(pair):
            return f"{pair!r} is not a [start, end] pair with 0 <= start < end"
    return None


def _pair(pair: Any) -> bool:
    return (
        isinstance(pair, list)
        and len(pair) == 2
        and all(_whole(end) for end in pair)
        and 0 <= pair[0] < pair[1]
    )


def _listed(value: Any) -> str | None:
    if isinstance(value, list | tuple | Mapping) and len(value) > MAX_LISTED:
        return f"{len(value):,} entries (at most {MAX_LISTED:,})"
    return None


def _token_ids(config: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """A ``pad_token_id`` outside ``[0, vocab_size)``: key and why. The pad id is the one token
    id a classifier's forward uses (the embedding's ``padding_idx``, the padded positions a
    last-token classifier skips), and one past the table is an assertion deep in torch or a
    wrong padding mask. Other ids (``bos``, ``eos``) are generation settings a classifier
    never reads, and small test configs leave them at their defaults (GPT-2's 50256)."""
    vocab = config.get("vocab_size")
    if vocab is None or config.get("pad_token_id") is None:
        return
    if not (_whole(vocab) and vocab >= 1):
        yield "vocab_size", f"{vocab!r} is not a whole number >= 1"
        return
    token = config["pad_token_id"]
    if not (_whole(token) and 0 <= token < vocab):
        yield "pad_token_id", f"{token!r} is outside the vocabulary (token ids 0..{vocab - 1:,})"


def _sizes(config: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, str]]:
    """Each :data:`SIZE_KEYS` value of a model ``config`` (and of the configs nested in it, a
    ``text_config`` or ``vision_config``) that is not a whole number of at least its least,
    and a label count above :data:`~curvcal.settings.checkpoint.MAX_CLASSES` (``num_labels``
    given without ``id2label`` makes transformers build a dictionary of that many names before
    anything else: 10⁹ of them was a ``MemoryError`` after 40 s): key and why."""
    from curvcal.settings.checkpoint import MAX_CLASSES

    for key, least in SIZE_KEYS.items():
        value = config.get(key)
        if value is None or isinstance(value, list):
            continue
        if not (_whole(value) and value >= least):
            yield f"{prefix}{key}", f"{value!r} is not a whole number >= {least}"
    for key in ("num_labels", "id2label"):
        value = config.get(key)
        count = len(value) if isinstance(value, Mapping) else value
        if isinstance(count, int) and not isinstance(count, bool) and count > MAX_CLASSES:
            yield (
                f"{prefix}{key}",
                f"{count:,} classes, more than the {MAX_CLASSES:,} curvcal reads",
            )
    for key, value in config.items():
        if isinstance(value, Mapping) and isinstance(key, str) and key.endswith("_config"):
            yield from _sizes(value, f"{prefix}{key}.")


#: a model config's constants the forward divides by or raises to a power: a norm divides by
#: √(var + eps), so eps 0 turns a constant row (a padded position) into 0/0 and a negative one
#: takes the root of a negative number; rotary embeddings raise ``rope_theta`` to fractional
#: powers and divide positions by the scaling ``factor``, so a zero or negative one makes every
#: rotated query NaN. Matched by name: a norm's epsilon ends in ``eps`` or ``epsilon`` and
#: names a norm (``layer_norm_eps``, ``rms_norm_eps``, ``norm_epsilon``, ``mixer_rms_eps``:
#: a bare ``eps`` is ProphetNet's label smoothing, 0 by default); a rotary ``factor`` is one
#: inside a ``rope_*`` object (``mtp_loss_scaling_factor`` is a loss weight, 0 by default).
#: Every default config of transformers passes.
NORM_WORDS = ("norm", "rms")
#: a dropout probability (outside [0, 1], refused by torch in train mode only)
PROBABILITY_SUFFIXES = ("dropout", "dropout_prob", "dropout_rate")


def _positive_constant(key: str, in_rope: bool) -> bool:
    """Whether ``key`` names a constant the forward divides by (see :data:`NORM_WORDS`)."""
    if key.endswith(("eps", "epsilon")):
        return any(word in key for word in NORM_WORDS)
    return key.endswith("rope_theta") or (in_rope and key == "factor")


def _forward_constants(
    config: Mapping[str, Any], prefix: str = "", in_rope: bool = False
) -> Iterable[tuple[str, str]]:
    """Each number of a model ``config`` (at any depth of nested objects and lists) that is not
    finite (JSON's ``NaN`` and ``Infinity``, which the forward would carry into every logit),
    each norm epsilon, ``rope_theta`` and rotary scaling ``factor`` that is not positive
    (:func:`_positive_constant`), and each dropout probability (a key ending in one of
    :data:`PROBABILITY_SUFFIXES`) outside [0, 1]: key and why."""
    for key, value in config.items():
        name, word = f"{prefix}{key}", str(key)
        inside = in_rope or word.startswith("rope")
        if isinstance(value, Mapping):
            yield from _forward_constants(value, f"{name}.", inside)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, Mapping):
                    yield from _forward_constants(item, f"{name}[{index}].", inside)
                elif isinstance(item, float) and not math.isfinite(item):
                    yield f"{name}[{index}]", f"{item!r} is not a finite number"
        elif not isinstance(value, int | float) or isinstance(value, bool):
            continue
        elif not math.isfinite(value):
            yield name, f"{value!r} is not a finite number"
        elif word.endswith(PROBABILITY_SUFFIXES) and not 0 <= value <= 1:
            yield name, f"{value!r} is not a probability in [0, 1]"
        elif _positive_constant(word, in_rope) and value <= 0:
            yield name, f"{value!r} is not positive; the forward divides by it or by a power of it"


def _tokenizer_settings(config: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """A ``tokenizer_config.json``'s ``model_max_length`` that is not a number >= 1
    (transformers compares every text's length with it: a string there was a ``TypeError``
    inside the tokenizer's call). A float is allowed: tokenizers saved with "no limit" write
    ``1e+30``."""
    limit = config.get("model_max_length")
    if limit is not None and not (_finite_positive(limit) and limit >= 1):
        yield "model_max_length", f"{limit!r} is not a number >= 1"


@dataclass(frozen=True)
class Bound:
    """One bounded key of a config file: its ``check`` returns why a value is refused (None:
    accepted); ``what`` says what an unbounded value costs."""

    file: str
    key: str
    check: Callable[[Any], str | None]
    what: str


#: every key bounded when its file is read, declared once
BOUNDS: tuple[Bound, ...] = (
    Bound(ADAPTER_CONFIG, "r", _rank, "the LoRA rank sizes every adapter matrix"),
    Bound(ADAPTER_CONFIG, "rank_pattern", _each_value(_rank), "ranks per module"),
    Bound(ADAPTER_CONFIG, "lora_alpha", _scaling, "the adapter's output is scaled by it"),
    Bound(ADAPTER_CONFIG, "alpha_pattern", _each_value(_scaling), "scalings per module"),
    Bound(ADAPTER_CONFIG, "lora_dropout", _dropout, "a dropout probability"),
    Bound(ADAPTER_CONFIG, "init_lora_weights", _init_weights, "peft runs it at load"),
    Bound(ADAPTER_CONFIG, "loftq_config", _loftq, "peft runs LoftQ's iterations at load"),
    Bound(ADAPTER_CONFIG, "layer_replication", _replication, "peft copies these layers"),
    *(
        Bound(ADAPTER_CONFIG, key, _listed, "peft matches every entry against every module")
        for key in ("target_modules", "exclude_modules", "modules_to_save", "layers_to_transform")
    ),
)


def check_config(path: Path, config: Any) -> None:
    """Refuse a value of ``config`` (the parsed JSON of ``path``) that :data:`BOUNDS` (for
    ``adapter_config.json``), the size, token-id and constant rules (for a model's
    ``config.json``: its sizes and counts, :func:`_sizes`; its ``pad_token_id`` inside
    ``[0, vocab_size)``; the constants its forward computes with, :func:`_forward_constants`)
    or the
    tokenizer rule (for ``tokenizer_config.json``: :func:`_tokenizer_settings`) does not
    accept, naming the file and the key. Other files, and configs that are not JSON objects,
    pass (their readers refuse those)."""
    if not isinstance(config, Mapping):
        return
    if path.name == MODEL_CONFIG:
        for key, why in (*_sizes(config), *_token_ids(config), *_forward_constants(config)):
            raise InputError(
                f"{path} ({key})", why, "is it the config the weights were saved with?"
            )
        return
    if path.name == TOKENIZER_CONFIG:
        for key, why in _tokenizer_settings(config):
            raise InputError(
                f"{path} ({key})", why, "save the tokenizer again with save_pretrained"
            )
        return
    for bound in BOUNDS:
        if bound.file != path.name or config.get(bound.key) is None:
            continue
        refused = bound.check(config[bound.key])
        if refused is not None:
            raise InputError(f"{path} ({bound.key})", f"{refused}; {bound.what}")


def check_config_against_weights(
    config_file: Path, config: Mapping[str, Any], shapes: list[tuple[int, ...]]
) -> None:
    """Refuse a model ``config`` (of ``config_file``) that asks transformers to build more than
    the weights (whose tensors have ``shapes``, read from the files' headers) can fill, before
    it builds anything: a layer count (:data:`LAYER_KEYS`) above the number of weight tensors,
    or a width (:data:`WIDTH_KEYS`) above the largest tensor's element count. Building is what
    costs: 200,000 layers ran past 60 s before a weight was read. No shapes: nothing to bound
    by (the weights are read elsewhere)."""
    if not shapes:
        return
    tensors = len(shapes)
    largest = max(math.prod(shape) for shape in shapes)
    for keys, most, what in (
        (LAYER_KEYS, tensors, f"the weights hold {tensors:,} tensors"),
        (WIDTH_KEYS, largest, f"the weights' largest tensor holds {largest:,} numbers"),
    ):
        for key in keys:
            value = config.get(key, 0)
            if _whole(value) and value > most:
                raise InputError(
                    f"{config_file} ({key})",
                    f"{value:,} is more than the weights can fill ({what})",
                    "is it the config the weights were saved with?",
                )


#: a model config's width keys, as the families name the hidden size
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
#: bytes per number transformers builds a model in (float32, its default dtype)
BUILD_BYTES = 4


def least_numbers(config: Mapping[str, Any]) -> tuple[int, tuple[str, ...]]:
    """A floor on the numbers a transformers model built from ``config`` holds, and the keys
    it was read from: ``L·h² + V·h`` for ``L`` layers (the first of :data:`LAYER_KEYS`
    given), hidden size ``h`` (:data:`HIDDEN_KEYS`) and vocabulary ``V`` (``vocab_size``):
    every layer holds at least its attention's ``h×h`` output projection, and the model its
    ``V×h`` token embedding. Keys absent count 0 (no floor from them)."""
    layers_key = next((k for k in LAYER_KEYS if _whole(config.get(k))), None)
    hidden_key = next((k for k in HIDDEN_KEYS if _whole(config.get(k))), None)
    vocab_key = "vocab_size" if _whole(config.get("vocab_size")) else None
    layers = max(config[layers_key], 0) if layers_key else 0
    hidden = max(config[hidden_key], 0) if hidden_key else 0
    vocab = max(config[vocab_key], 0) if vocab_key else 0
    keys = tuple(k for k in (layers_key, hidden_key, vocab_key) if k is not None)
    return layers * hidden * hidden + vocab * hidden, keys


def check_config_alone(config_file: Path, config: Mapping[str, Any], available: int | None) -> None:
    """Refuse a model ``config`` (of ``config_file``, whose weights are not in its folder)
    whose model needs, at the least (:func:`least_numbers`, in float32), more than the
    ``available`` bytes of memory (None: unknown, nothing refused): building it would end
    in an out-of-memory kill after minutes of allocation. Each key on its own is bounded as
    it is everywhere (:func:`check_config`); this bounds their product."""
    numbers, keys = least_numbers(config)
    if available is None or numbers * BUILD_BYTES <= available:
        return
    raise InputError(
        f"{config_file} ({', '.join(keys)})",
        f"asks for a model of at least {numbers:,} numbers ({_gib(numbers * BUILD_BYTES)} in "
        f"float32), more than the {_gib(available)} of memory available",
        "is it the config the weights were saved with?",
    )


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"


#: strings peft turns into regular expressions, and how it uses each: (key, template the value
#: goes into, ``fullmatch`` or ``match``); lists and mapping keys give one pattern per entry
_PATTERNS: tuple[tuple[str, str, str], ...] = (
    ("target_modules", "{}", "fullmatch"),  # a string only: a list is a set of names
    ("exclude_modules", "{}", "fullmatch"),
    ("rank_pattern", r"(.*\.)?({})$", "match"),
    ("alpha_pattern", r"(.*\.)?({})$", "match"),
    ("modules_to_save", r"(^|.*\.){}($|\..*)", "match"),
    ("layers_pattern", r"(?:^|.*?\.){}\.(?P<idx>\d+)\.", "match"),
)

#: the child that times the patterns: reads ``[[pattern, how], ...]`` and the names on stdin
_MATCHER = (
    "import json, re, sys\n"
    "patterns, names = json.load(sys.stdin)\n"
    "compiled = [(re.compile(text), how) for text, how in patterns]\n"
    "sys.stdout.write('ready'); sys.stdout.flush()  # the clock starts here\n"
    "for pattern, how in compiled:\n"
    "    run = pattern.fullmatch if how == 'fullmatch' else pattern.match\n"
    "    for name in names:\n"
    "        run(name)\n"
)
#: seconds the matcher may take to start (a busy machine), not counted in PATTERN_SECONDS
_START_SECONDS = 60.0


def _patterns(config: Mapping[str, Any], key: str, template: str, how: str) -> list[list[str]]:
    value = config.get(key)
    if value is None or (
        key in ("target_modules", "exclude_modules") and not isinstance(value, str)
    ):
        return []
    entries = (
        value.keys() if isinstance(value, Mapping) else [value] if isinstance(value, str) else value
    )
    if not isinstance(entries, Iterable):
        return []
    return [[template.format(entry), how] for entry in entries if isinstance(entry, str)]


def check_adapter_on_base(config_file: Path, config: Mapping[str, Any], base: Any) -> None:
    """:func:`check_against` the library model ``base`` (a transformers ``PreTrainedModel``):
    its module names, its ``config.num_hidden_layers``, and as the largest useful rank the
    largest ``min(rows, columns)`` of its matrices (the rank of a LoRA product B·A never
    exceeds that of the layer it adds to; a larger ``r`` only costs memory)."""
    names = [name for name, _ in base.named_modules()]
    layers = getattr(getattr(base, "config", None), "num_hidden_layers", None)
    widths = [min(p.shape[-2:]) for p in base.parameters() if p.dim() >= 2]
    check_against(config_file, config, names, layers, max(widths, default=None))


def check_against(
    config_file: Path,
    config: Mapping[str, Any],
    module_names: list[str],
    n_layers: int | None,
    most_rank: int | None = None,
) -> None:
    """Refuse what ``config`` (of ``config_file``) asks peft to do to a base whose modules are
    ``module_names`` and which has ``n_layers`` layers (None: unknown): an ``r`` or
    ``rank_pattern`` rank above ``most_rank`` (None: unbounded here); a ``layer_replication``
    range past the last layer, or a stack of more than :data:`MAX_REPLICATION` times the
    layers; a regular expression (``target_modules`` as a string, ``exclude_modules``,
    ``rank_pattern``/``alpha_pattern`` keys, ``modules_to_save``, ``layers_pattern``) that does
    not compile, or that takes longer than :data:`PATTERN_SECONDS` to run over every module
    name as peft runs it."""
    if most_rank is not None:
        _check_ranks(config_file, config, most_rank)
    replication = config.get("layer_replication")
    if replication:
        _check_replication(config_file, replication, n_layers)
    for key, template, how in _PATTERNS:
        patterns = _patterns(config, key, template, how)
        if not patterns:
            continue
        where = f"{config_file} ({key})"
        for text, _how in patterns:
            try:
                re.compile(text)
            except (re.error, RecursionError, OverflowError) as exc:
                raise InputError(
                    where, f"is not a regular expression peft can use: {exc}"
                ) from None
        _time_patterns(where, patterns, module_names)


def _check_ranks(config_file: Path, config: Mapping[str, Any], most_rank: int) -> None:
    ranks: list[tuple[str, str, Any]] = [("r", "", config.get("r"))]
    pattern = config.get("rank_pattern")
    if isinstance(pattern, Mapping):
        ranks += [("rank_pattern", f" for {key!r}", value) for key, value in pattern.items()]
    for key, which, rank in ranks:
        if _whole(rank) and rank > most_rank:
            raise InputError(
                f"{config_file} ({key})",
                f"rank {rank:,}{which} is above {most_rank:,}, the largest rank a layer of the "
                "base has (a larger one only costs memory)",
            )


def _check_replication(config_file: Path, replication: Any, n_layers: int | None) -> None:
    """At most :data:`MAX_REPLICATION` times the base's layers in all, every range within
    them (so never more ranges than that either: a range holds a layer at least)."""
    where = f"{config_file} (layer_replication)"
    if n_layers is None or not _whole(n_layers) or n_layers < 1:
        raise InputError(where, "the base model does not say how many layers it has")
    most = MAX_REPLICATION * n_layers
    if not isinstance(replication, list) or len(replication) > most:
        count = len(replication) if isinstance(replication, list) else replication
        raise InputError(
            where,
            f"{count:,} ranges for a base of {n_layers} layers (at most {most:,} layers in all, "
            f"{MAX_REPLICATION} times the base's)",
        )
    for pair in replication:
        if not _pair(pair) or pair[1] > n_layers:
            raise InputError(
                where,
                f"{pair!r} is not a [start, end] pair with 0 <= start < end <= {n_layers} "
                "(the base's layers)",
            )
    total = sum(end - start for start, end in replication)
    if total > most:
        raise InputError(
            where,
            f"builds a stack of {total:,} layers from {n_layers} (at most {most:,}, "
            f"{MAX_REPLICATION} times the base's)",
        )


def _time_patterns(where: str, patterns: list[list[str]], names: list[str]) -> None:
    """Run ``patterns`` over ``names`` in a child Python (the ``re`` engine peft uses) and
    refuse them when the matching (its start-up not counted) takes longer than
    :data:`PATTERN_SECONDS`; the child is killed then."""
    import select

    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _MATCHER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # a child that failed: its stderr says why
            child.stdin.write(json.dumps([patterns, names]))
            child.stdin.close()
        select.select([child.stdout], [], [], _START_SECONDS)
        child.wait(timeout=PATTERN_SECONDS)
    except subprocess.TimeoutExpired:
        raise InputError(
            where,
            f"a regular expression that takes longer than {PATTERN_SECONDS:g} s to match the "
            f"base's {len(names):,} module names (catastrophic backtracking?); peft would run "
            "it at load",
            "list the module names instead",
        ) from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        assert child.stderr is not None
        detail = child.stderr.read().strip().splitlines()[-1:] or ["the matcher failed"]
        raise InputError(where, f"is not a regular expression peft can use: {detail[0]}")
    for stream in (child.stdout, child.stderr):
        if stream is not None:
            stream.close()


def library_failures() -> tuple[type[BaseException], ...]:
    """What transformers, peft and the tokenizers raise for a file they cannot use, caught by
    every call curvcal makes into them and said as one :class:`InputError` naming the folder:
    the builtin errors a bad value ends in (a wrong type, a missing key, a division by zero,
    a failed ``assert``), and huggingface_hub's ``StrictDataclassError`` (transformers' config
    classes validate their fields with it: ``hidden_act: ["silu"]`` was exit 70). Never
    ``MemoryError`` (the size bounds come first) nor ``KeyboardInterrupt``."""
    failures: tuple[type[BaseException], ...] = (
        ValueError, KeyError, IndexError, OSError, ImportError, TypeError, AttributeError,
        RuntimeError, ArithmeticError, AssertionError,
    )  # fmt: skip
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub has no strict config fields to fail
        return failures
    return (*failures, StrictDataclassError)


@contextmanager
def library_refusal(what: str, why: str, hint: str | None = None) -> Iterator[None]:
    """Run a call into a library: what it raises for a file it cannot use
    (:func:`library_failures`) becomes one :class:`InputError` naming ``what``, its line
    ``why: <the library's own message, on one line>``."""
    try:
        yield
    except library_failures() as exc:
        raise InputError(what, f"{why}: {one_line(exc)}", hint) from exc


def _held_texts(
    library: str, caught: list[warnings.WarningMessage], held: _HeldRecords
) -> list[str]:
    """What :func:`library_warnings` held, each on one line as ``"<library>: <message>"``."""
    said = [
        f"{library}: {one_line(warning.message)}"  # type: ignore[arg-type]
        for warning in caught
        if not issubclass(warning.category, FutureWarning | DeprecationWarning)
    ]
    return said + [f"{record.name.split('.')[0]}: {_log_text(record)}" for record in held.records]


#: the loggers of the libraries curvcal calls: their records are held back like their warnings
#: (transformers' load report, "Some weights ... were not initialized", its ``Model config``
#: line at info verbosity print through their own handlers otherwise)
LIBRARY_LOGGERS = ("transformers", "peft", "huggingface_hub", "timm", "accelerate")


class _HeldRecords(logging.Handler):
    """A logging handler that keeps the records it is handed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


#: ANSI escape sequences (transformers bolds the title of its load report)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextmanager
def _held_logs() -> Iterator[_HeldRecords]:
    """Route the records of :data:`LIBRARY_LOGGERS` at warning level and above to one held
    handler for the block (no record reaches the libraries' own handlers, the root logger or
    the terminal; records below warning are not even formatted), then restore each logger's
    handlers, level and propagation. A logger its caller set above warning stays there. A
    library first imported inside the block sets its logger up then, and that set-up stands
    (its handler added to the restored ones): callers import the library before the block."""
    held = _HeldRecords()
    saved = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate, logger.level))
        logger.handlers = [held]
        logger.propagate = False
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield held
    finally:
        for logger, handlers, propagate, level in saved:
            set_up = [handler for handler in logger.handlers if handler is not held]
            logger.handlers = [*handlers, *set_up]
            if not set_up:
                logger.propagate = propagate
                logger.setLevel(level)


def _log_text(record: logging.LogRecord) -> str:
    """A record's message on one line, without terminal colours or the table rules of
    transformers' load report (runs of ``-``, ``+`` and ``|``)."""
    text = _ANSI.sub("", record.getMessage())
    text = re.sub(r"[-+|]{3,}", " ", text)
    text = " ".join(re.sub(r"\s*\|\s*", " | ", text).strip(" |").split())
    return text if len(text) <= _NOTE_LIMIT else text[: _NOTE_LIMIT - 3] + "..."


#: the most characters of one library record said (a load report can list every weight)
_NOTE_LIMIT = 300


@contextmanager
def library_warnings(
    library: str, notes: list[str], held_on_failure: list[str] | None = None
) -> Iterator[None]:
    """Hold back what ``library`` warns about inside the block, through ``warnings.warn`` or
    through its logger (:data:`LIBRARY_LOGGERS`: transformers logs "Some weights ... were
    not initialized" and its load report rather than warning): when the block ends normally
    each is added to ``notes`` once, on one line, as ``"<library>: <message>"`` (the logger's
    library for a record), for the loader to pass on; when it raises they are dropped (the
    error says what is wrong), or, given ``held_on_failure``, put there for the error to
    quote (transformers' error for weights of the wrong shape says only "look at the above
    report", its load report, which it logged). ``FutureWarning`` and ``DeprecationWarning``
    (the libraries' notes to themselves) and records below warning level are dropped either
    way."""
    with warnings.catch_warnings(record=True) as caught, _held_logs() as held:
        warnings.simplefilter("always")
        try:
            yield
        except BaseException:
            if held_on_failure is not None:
                held_on_failure.extend(_held_texts(library, caught, held))
            raise
    for text in _held_texts(library, caught, held):
        if text not in notes:
            notes.append(text)
