"""Hugging Face ``save_pretrained`` folders and timm folders as checkpoints.

A *model folder* is a directory holding ``config.json`` and its weights:

- Hugging Face transformers: ``config.json`` with ``architectures`` (``ViTForImageClassification``,
  ``BertForSequenceClassification``, ...) and ``model.safetensors`` (or the shards listed in
  ``model.safetensors.index.json``, or ``pytorch_model.bin``, read weights-only). The module is
  built from the config through the transformers Auto classes for image or sequence
  classification, then the weights are loaded by curvcal (safetensors or a weights-only
  ``torch.load``), so no file of the folder runs code. A config with ``auto_map`` names custom
  code that building the model would import and run: refused unless ``trust``.
- timm (``timm.models.save_for_hf`` / ``push_to_hub``): ``config.json`` with ``architecture``,
  ``num_classes`` and ``pretrained_cfg``, weights in ``model.safetensors``; built with
  ``timm.create_model(architecture, pretrained=False, num_classes=...)``. A ``model_args`` key
  that would make timm read another file (``checkpoint_path``, a ``pretrained_cfg`` with a
  ``file``...) is refused: the weights come from the folder alone. So is the same key in the
  ``model_args`` of a transformers ``TimmWrapper`` config, which transformers hands to timm.

Every transformers call passes ``trust_remote_code=trust`` (``False`` unless
``--trust-checkpoint``) and runs under :func:`no_prompt`, so the library can never ask on the
terminal whether to run a folder's code: a ``y`` typed there would have run it.

Models use the library's eager attention (the same function as its fused kernels, which have
no second derivative). Transformers outputs are objects; :class:`LogitsModule` exposes the logits tensor under the same
parameter names as the library's model (``classifier.weight``, not ``model.classifier.weight``).
Nothing here imports transformers or timm until a folder is loaded.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from curvcal import jsontext
from curvcal.errors import InputError, TrustError, one_line
from curvcal.load.extras import require
from curvcal.load.files.tensorfile import read_safetensors_metadata, read_safetensors_shapes
from curvcal.load.limits import check_num_classes
from curvcal.load.models.library_limits import library_failures, library_refusal, library_warnings
from curvcal.paths import readable_file, readable_folder

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_NAME = "pytorch_model.bin"
PREPROCESSOR_NAME = "preprocessor_config.json"
#: transformers architecture name suffix -> (Auto class name, input modality)
TASKS = {
    "ForImageClassification": ("AutoModelForImageClassification", "image"),
    "ForSequenceClassification": ("AutoModelForSequenceClassification", "text"),
    # a causal language model is a classifier over the answers of multiple-choice data
    # (:mod:`curvcal.load.models.choice_scorer`)
    "ForCausalLM": ("AutoModelForCausalLM", "text"),
}
_TRUST_HINT = "pass --trust-checkpoint only if you trust the folder's source"


@dataclass(frozen=True)
class FolderModel:
    """What a model folder says about itself, read from its JSON and file headers alone.

    ``library``: ``transformers`` or ``timm``; ``architecture``: the class or model name;
    ``modality``: ``image`` or ``text``; ``labels``: ``id2label`` in index order (empty when the
    config has none); ``weights``: the weight files in load order; ``custom_code``: the
    ``auto_map`` entries, which need trust; ``preprocessing``: mean, std and input size the
    model expects, when the folder records them.
    """

    path: Path
    config: Mapping[str, Any]
    library: str
    architecture: str
    modality: str
    labels: tuple[str, ...]
    weights: tuple[Path, ...]
    custom_code: tuple[str, ...]
    preprocessing: dict[str, Any] | None


def is_model_folder(path: Path) -> bool:
    """A directory holding ``config.json``."""
    return os.path.isdir(path) and os.path.isfile(path / CONFIG_NAME)  # never raise


def folder_files(path: Path) -> tuple[Path, ...]:
    """The files a model folder's loader reads (config, weights, preprocessor config), for
    provenance digests; empty when ``path`` is not a model folder or its config is unreadable."""
    if not is_model_folder(path):
        return ()
    try:
        weights = _weight_files(path)
    except InputError:
        weights = ()
    extra = (path / PREPROCESSOR_NAME,) if (path / PREPROCESSOR_NAME).is_file() else ()
    return (path / CONFIG_NAME, *weights, *extra)


def read_folder(path: Path, need_weights: bool = True) -> FolderModel:
    """Describe the model folder at ``path`` from ``config.json`` and the weight files' names,
    without importing transformers or timm. Raises :class:`InputError` for a folder that is
    not a classifier folder curvcal can load (``need_weights=False``: the weights may be
    elsewhere, as with ``--arch hf:FOLDER``)."""
    if not path.is_dir():
        raise InputError(str(path), "is not a folder", "hf:FOLDER names a save_pretrained folder")
    readable_folder(path, "model folder")  # transformers and timm read its files themselves
    config = read_json(path / CONFIG_NAME)
    if not isinstance(config, dict):
        raise InputError(str(path / CONFIG_NAME), "is not a JSON object")
    weights = _weight_files(path) if need_weights else ()
    if "architecture" in config and "pretrained_cfg" in config:
        return _timm_folder(path, config, weights)
    names = config.get("architectures")
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise InputError(
            str(path / CONFIG_NAME),
            "names no architecture (no 'architectures' list, nor timm's 'architecture')",
            "save the model with save_pretrained, which records it",
        )
    architecture = names[0]
    modality = next((m for suffix, (_a, m) in TASKS.items() if architecture.endswith(suffix)), None)
    if modality is None:
        raise InputError(
            str(path),
            f"holds a {architecture}, not an image or sequence classifier nor a causal LM",
            "curvcal loads *ForImageClassification and *ForSequenceClassification models, and "
            "*ForCausalLM models scored over the answers of multiple-choice data",
        )
    return FolderModel(
        path=path,
        config=config,
        library="transformers",
        architecture=architecture,
        modality=modality,
        labels=() if is_causal_lm(architecture) else _labels(config),
        weights=weights,
        custom_code=custom_code_entries(config),
        preprocessing=_image_processor(path),
    )


def build_folder_model(folder: FolderModel, trust: bool) -> nn.Module:
    """The (randomly initialised) module of ``folder``'s config, returning logits tensors
    (callers hold what the library warns about meanwhile, with
    :func:`~curvcal.load.models.library_limits.library_warnings`)."""
    if folder.library == "timm":
        return build_timm(
            folder.architecture,
            _timm_kwargs(folder.config),
            f"{folder.path / CONFIG_NAME} (model_args)",
        )
    _refuse_before_transformers(folder, trust)
    transformers = require("hf", "transformers", str(folder.path))
    auto_name = _auto_name(folder)
    with (
        library_refusal(
            str(folder.path),
            f"transformers cannot build {folder.architecture} from config.json",
            "is transformers recent enough for this model?",
        ),
        no_prompt(),
    ):
        config = transformers.AutoConfig.from_pretrained(
            str(folder.path), local_files_only=True, trust_remote_code=trust
        )
        model = getattr(transformers, auto_name).from_config(
            config, trust_remote_code=trust, attn_implementation="eager"
        )
    return LogitsModule(model, folder.modality)


def load_pretrained(
    folder: FolderModel, trust: bool, notes: list[str], supplied: tuple[str, ...] = ()
) -> nn.Module:
    """The transformers classifier of ``folder`` with its weights, through the library's own
    ``from_pretrained`` (local files only; it renames saved keys to the module's own names,
    as recent transformers versions do). Safetensors weights, or a ``pytorch_model.bin`` the
    caller has checked needs no global beyond a weights-only load's. What the library warns
    about is added to ``notes`` in curvcal's words (:func:`load_report_notes` for its load
    report), never printed in its own format.

    A weight of the model the files lack would be initialised at random, so the numbers would
    be a random model's: :class:`InputError`, as a timm folder's missing weights are, unless
    the weight belongs to a module named in ``supplied`` (an adapter's ``modules_to_save``,
    whose trained copy the adapter file holds and the adapter check requires)."""
    _refuse_before_transformers(folder, trust)
    transformers = require("hf", "transformers", str(folder.path))
    for file in folder.weights:  # a truncated or unreadable file, named before the library reads it
        if file.suffix == ".safetensors":
            read_safetensors_metadata(file)
    auto = getattr(transformers, _auto_name(folder))
    said: list[str] = []
    with transformers_load(transformers, folder.path, f"cannot load {folder.architecture}", said):
        model, info = auto.from_pretrained(
            str(folder.path),
            local_files_only=True,
            trust_remote_code=trust,
            use_safetensors=folder.weights[0].suffix == ".safetensors",
            # fused attention kernels have no second derivative or forward-mode rule; the
            # library's eager attention computes the same function and every Hessian product
            attn_implementation="eager",
            output_loading_info=True,
        )
    random = [name for name in map(str, info.get("missing_keys", ())) if not _in(name, supplied)]
    if random:
        raise InputError(
            str(folder.path),
            f"its weights lack {len(random)} of the {folder.architecture}'s tensors "
            f"({_first(sorted(random))}), which transformers would initialise at random",
            "save the whole trained classifier with save_pretrained",
        )
    for note in [*load_report_notes(info), *(n for n in said if LOAD_REPORT not in n)]:
        if note not in notes:
            notes.append(note)
    return LogitsModule(model, folder.modality)


@contextmanager
def transformers_load(
    transformers: Any, path: Path, failure: str, said: list[str]
) -> Iterator[None]:
    """A model load by ``transformers`` from ``path``: its progress bars off (curvcal's own
    progress is the only one on stderr), no terminal prompt (:func:`no_prompt`), what it warns
    or logs added to ``said`` (:func:`~curvcal.load.models.library_limits.library_warnings`),
    and what it raises an :class:`InputError` naming ``path``: "transformers <failure>"."""
    bars = transformers.utils.logging
    was_shown = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()
    held: list[str] = []
    try:
        with no_prompt(), library_warnings("transformers", said, held):
            yield
    except library_failures() as exc:
        raise InputError(
            str(path),
            f"transformers {failure}: {_with_report(one_line(exc), held)}",
            "is transformers recent enough for this model?",
        ) from exc
    finally:
        if was_shown:
            bars.enable_progress_bar()


#: how transformers' error for weights of the wrong shape points at its load report
_SEE_REPORT = "For details look at the above report!"


def _with_report(message: str, held: list[str]) -> str:
    """A library error ``message`` that points at the load report transformers logged (held
    back, never printed): the report's own line in its place, so the one error line says which
    tensors do not fit."""
    if _SEE_REPORT not in message:
        return message
    report = next((text for text in held if LOAD_REPORT in text), None)
    if report is None:
        return message
    return f"{message.replace(_SEE_REPORT, '').strip()} {report}"


#: the title of transformers' load report (a table of missing and unexpected keys), said
#: instead by :func:`load_report_notes`
LOAD_REPORT = "LOAD REPORT"


def _in(name: str, modules: tuple[str, ...]) -> bool:
    """Whether parameter ``name`` belongs to one of ``modules``, named as peft names them (the
    module's full name or its last dotted parts)."""
    module = name.rpartition(".")[0]
    return any(module == m or module.endswith("." + m) for m in modules)


def load_report_notes(info: Mapping[str, Any]) -> list[str]:
    """What transformers' loading information (``output_loading_info=True``) says, in
    curvcal's words: tensors of the files no parameter takes (ignored). Weights the files
    lack are refused or supplied before this (:func:`load_pretrained`)."""
    notes = []
    unexpected = sorted(str(k) for k in info.get("unexpected_keys", ()))
    if unexpected:
        notes.append(
            f"transformers: the model takes none of {len(unexpected)} of the checkpoint's "
            f"tensors, ignored: {_first(unexpected)}"
        )
    return notes


def is_causal_lm(architecture: str) -> bool:
    """Whether a transformers architecture name is a causal language model's."""
    return architecture.endswith("ForCausalLM")


@contextmanager
def no_prompt() -> Iterator[None]:
    """Run a library call with an empty standard input, so nothing it does can ask a question
    on the terminal (transformers asks whether to run a folder's custom code when
    ``trust_remote_code`` is unset; an empty input reads as "no" or an error, never "y")."""
    saved = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = saved


def custom_code_entries(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``auto_map`` entries of a transformers ``config.json`` or ``tokenizer_config.json``
    (``AutoConfig=module.Class``...): code the library would import and run. Empty when none."""
    auto_map = config.get("auto_map")
    if auto_map is None:
        return ()
    if isinstance(auto_map, dict) and auto_map:
        return tuple(f"{k}={v}" for k, v in auto_map.items())
    return (str(auto_map),)


#: ``timm.create_model`` keywords that read another file or fetch one (``checkpoint_path`` is
#: loaded with ``torch.load`` even when ``pretrained=False``; a ``pretrained_cfg`` names files,
#: URLs and hub ids), and what curvcal would do instead.
TIMM_FILE_KEYWORDS = frozenset(
    {
        "checkpoint_path",
        "pretrained",
        "pretrained_cfg",
        "pretrained_cfg_overlay",
        "pretrained_strict",
        "cache_dir",
        "file",
        "url",
        "hf_hub_id",
        "hf_hub_filename",
    }
)


def refuse_timm_file_keywords(kwargs: Mapping[str, Any], what: str) -> None:
    """Refuse keyword arguments for ``timm.create_model`` that would make timm read or fetch
    a file other than the checkpoint curvcal was given: :data:`TIMM_FILE_KEYWORDS`, and any
    key ending in ``_path``, ``_file``, ``_dir`` or ``_url``. ``what`` names their source."""
    bad = sorted(
        key
        for key in kwargs
        if key in TIMM_FILE_KEYWORDS or key.endswith(("_path", "_file", "_dir", "_url"))
    )
    if bad:
        raise InputError(
            what,
            f"sets {', '.join(bad)}, which would make timm read another file",
            "curvcal reads weights only from the checkpoint it is given; remove "
            + ("it" if len(bad) == 1 else "them"),
        )


def build_timm(name: str, kwargs: Mapping[str, Any], what: str = "--arch-kwargs") -> nn.Module:
    """``timm.create_model(name, pretrained=False, **kwargs)`` (never downloads, never reads
    a file: see :func:`refuse_timm_file_keywords`)."""
    refuse_timm_file_keywords(kwargs, what)
    timm = require("timm", "timm", f"--arch timm:{name}")
    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.5)
        hint = (
            "did you mean " + ", ".join(close) + "?" if close else "timm.list_models() lists them"
        )
        raise InputError("--arch", f"timm has no model {name!r}", hint)
    check_num_classes(kwargs, what)
    try:
        model: nn.Module = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as exc:  # a model's own checks raise anything: TypeError, ValueError, ...
        raise InputError(
            what, f"timm:{name} cannot be built with {dict(kwargs)}: {one_line(exc)}"
        ) from exc
    return model


def timm_preprocessing(model: nn.Module, name: str) -> dict[str, Any] | None:
    """Mean, std, input size and crop fraction of a timm model's ``pretrained_cfg``."""
    cfg = getattr(model, "pretrained_cfg", None)
    if not isinstance(cfg, Mapping):
        return None
    return _preprocessing(
        cfg.get("mean"),
        cfg.get("std"),
        cfg.get("input_size"),
        cfg.get("crop_pct"),
        f"timm pretrained_cfg of {name}",
    )


def read_state(
    folder: FolderModel, read_torch_file: Callable[[Path], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The folder's weights as one state dict: safetensors files, or ``pytorch_model.bin``
    through ``read_torch_file`` (the checkpoint loader's weights-only load, refusing anything
    that would run code; passed in so that this module does not import the loader that
    imports it)."""
    state: dict[str, torch.Tensor] = {}
    for file in folder.weights:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            try:
                state.update(load_file(str(file), device="cpu"))
            except Exception as exc:  # safetensors raises its own error types
                raise InputError(
                    str(file), f"cannot read safetensors file: {one_line(exc)}"
                ) from exc
        else:
            state.update(read_torch_file(file))
    return state


class LogitsModule(nn.Module):
    """A transformers classifier whose forward returns the logits tensor.

    The library's model keeps its own module tree: its children are this module's children,
    under the same names, so ``named_parameters()`` and ``state_dict()`` keys are the library's
    (``vit.embeddings...``, ``classifier.weight``) and ``torch.func.functional_call`` on this
    module swaps the parameters the library's forward uses. A tensor input is passed as the
    model's main input (``pixel_values``, ``input_ids``); a mapping as keyword arguments.
    """

    def __init__(self, model: nn.Module, modality: str) -> None:
        super().__init__()
        if list(model._parameters) or list(model._buffers):
            raise InputError(
                type(model).__name__,
                "has parameters outside its sub-modules; curvcal cannot wrap it",
            )
        for name, child in model.named_children():
            self.add_module(name, child)
        self.__dict__["library_model"] = model  # not registered: its children already are
        self.modality = modality
        self.main_input = str(getattr(model, "main_input_name", "pixel_values"))

    def train(self, mode: bool = True) -> LogitsModule:
        super().train(mode)
        self.__dict__["library_model"].training = mode
        return self

    def forward(self, x: Any) -> torch.Tensor:
        model = self.__dict__["library_model"]
        inputs = dict(x) if isinstance(x, Mapping) else {self.main_input: x}
        out = model(**inputs, return_dict=True)
        logits: torch.Tensor = out.logits
        return logits


def token_embedding_names(module: nn.Module) -> tuple[str, ...]:
    """Names (in ``module.named_parameters()``) of the token embedding matrix of a transformers
    model wrapped in :class:`LogitsModule` (vocab x hidden); empty for any other module.

    Its Hessian block has a row per vocabulary entry, almost all of them zero (only the tokens
    present in the data get gradient), so text Hessians leave it out unless asked.
    """
    model = module.__dict__.get("library_model") if isinstance(module, LogitsModule) else None
    getter = getattr(model, "get_input_embeddings", None)
    embedding = getter() if callable(getter) else None
    weight = getattr(embedding, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return ()
    return tuple(name for name, p in module.named_parameters() if p is weight)


#: model types whose ``*ForSequenceClassification`` pools at the last non-padding token with
#: its own code rather than transformers' ``GenericForSequenceClassification`` (which Llama,
#: Qwen2, Mistral and most recent decoders use)
LAST_TOKEN_MODEL_TYPES = frozenset(
    {
        "biogpt", "bloom", "ctrl", "falcon", "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox",
        "gptj", "modernbert-decoder", "mpt", "openai-gpt", "opt", "t5gemma", "zamba", "zamba2",
    }
)  # fmt: skip


def pools_last_token(folder: FolderModel) -> bool:
    """Whether ``folder``'s sequence classifier is a decoder that reads each text's logits at
    its last non-padding token: the position of the rightmost ``input_ids`` entry that differs
    from ``config.pad_token_id`` (so padded batches need that id). Decided from the class
    transformers names ``architecture`` (looked up in the library, never imported from the
    folder) or the config's ``model_type``; False for folders with custom code."""
    if folder.library != "transformers" or folder.modality != "text" or folder.custom_code:
        return False
    if folder.config.get("model_type") in LAST_TOKEN_MODEL_TYPES:
        return True
    transformers = require("hf", "transformers", str(folder.path))
    cls = getattr(transformers, folder.architecture, None)
    try:
        from transformers.modeling_layers import GenericForSequenceClassification
    except ImportError:  # an older transformers: the model types above are what it has
        return False
    return isinstance(cls, type) and issubclass(cls, GenericForSequenceClassification)


# --- helpers ---------------------------------------------------------------------------------


def _first(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (
        f" and {len(names) - shown} more" if len(names) > shown else ""
    )


def _refuse_before_transformers(folder: FolderModel, trust: bool) -> None:
    """What transformers must not be handed: ``model_args`` keys that make timm read another
    file (always), ``auto_map`` custom code (without ``trust``), and a config that asks for
    more layers or wider ones than the folder's weights can fill, whatever their format
    (:func:`~curvcal.load.models.library_limits.check_config_against_weights`), or, for a folder
    without weights, more than the memory can hold
    (:func:`~curvcal.load.models.library_limits.check_config_alone`)."""
    model_args = folder.config.get("model_args")
    if isinstance(model_args, Mapping):  # transformers' timm wrapper hands them to timm
        refuse_timm_file_keywords(model_args, f"{folder.path / CONFIG_NAME} (model_args)")
    if folder.custom_code and not trust:
        raise TrustError(
            str(folder.path),
            f"config.json asks for custom code ({', '.join(folder.custom_code)}), which "
            "building the model would import and run",
            _TRUST_HINT,
        )
    from curvcal.load.limits import available_memory
    from curvcal.load.models.library_limits import check_config_against_weights, check_config_alone

    config_file = folder.path / CONFIG_NAME
    if folder.weights:
        check_config_against_weights(config_file, folder.config, weight_shapes(folder.weights))
    else:  # the weights are elsewhere (--arch hf:FOLDER): the config is all there is
        check_config_alone(config_file, folder.config, available_memory())


def weight_shapes(files: tuple[Path, ...]) -> list[tuple[int, ...]]:
    """The shape of every tensor of a model folder's weight ``files``, none of them read: a
    ``.safetensors`` file's (each shard's) from its header, a ``pytorch_model.bin``'s from a
    weights-only load onto the ``meta`` device
    (:func:`~curvcal.load.files.pickles.state_file_shapes`)."""
    from curvcal.load.files.pickles import state_file_shapes

    return [
        shape
        for file in files
        for shape in (
            read_safetensors_shapes(file)
            if file.suffix == ".safetensors"
            else state_file_shapes(file)
        )
    ]


def _auto_name(folder: FolderModel) -> str:
    return next(a for suffix, (a, _m) in TASKS.items() if folder.architecture.endswith(suffix))


def _timm_folder(path: Path, config: dict[str, Any], weights: tuple[Path, ...]) -> FolderModel:
    architecture = config["architecture"]
    if not isinstance(architecture, str):
        raise InputError(str(path / CONFIG_NAME), "'architecture' is not a string")
    raw_cfg = config.get("pretrained_cfg")
    cfg: dict[str, Any] = raw_cfg if isinstance(raw_cfg, dict) else {}
    names = config.get("label_names") or cfg.get("label_names") or ()
    return FolderModel(
        path=path,
        config=config,
        library="timm",
        architecture=architecture,
        modality="image",
        labels=tuple(str(n) for n in names) if isinstance(names, list | tuple) else (),
        weights=weights,
        custom_code=(),
        preprocessing=_preprocessing(
            cfg.get("mean"),
            cfg.get("std"),
            cfg.get("input_size"),
            cfg.get("crop_pct"),
            f"timm pretrained_cfg in {path / CONFIG_NAME}",
        ),
    )


def _timm_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for key in ("num_classes", "in_chans", "global_pool"):
        if key in config:
            kwargs[key] = config[key]
    model_args = config.get("model_args")
    if isinstance(model_args, dict):
        kwargs.update(model_args)
    return kwargs


def _weight_files(path: Path) -> tuple[Path, ...]:
    if (path / SAFETENSORS_NAME).is_file():
        return (path / SAFETENSORS_NAME,)
    if (path / SAFETENSORS_INDEX).is_file():
        index = read_json(path / SAFETENSORS_INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(str(path / SAFETENSORS_INDEX), "has no 'weight_map'")
        shards = []
        for name in dict.fromkeys(str(v) for v in weight_map.values()):
            shard = path / name
            if Path(name).name != name or name in (".", ".."):
                raise InputError(
                    str(path / SAFETENSORS_INDEX),
                    f"names a shard {name!r} that is not a file name in its folder",
                    "a weight map names shards beside it",
                )
            if not shard.is_file():
                raise InputError(str(path / SAFETENSORS_INDEX), f"names a missing shard {name!r}")
            shards.append(shard)
        _refuse_tensors_held_twice(path / SAFETENSORS_INDEX, weight_map, shards)
        return tuple(shards)
    if (path / PICKLE_NAME).is_file():
        return (path / PICKLE_NAME,)
    raise InputError(
        str(path),
        f"has {CONFIG_NAME} but no weights ({SAFETENSORS_NAME}, {SAFETENSORS_INDEX} or "
        f"{PICKLE_NAME})",
        "for a separate weights file pass it as CHECKPOINT with --arch hf:FOLDER",
    )


def _refuse_tensors_held_twice(
    index: Path, weight_map: Mapping[str, Any], shards: list[Path]
) -> None:
    """An :class:`InputError` naming the index when two shards hold one tensor: the library
    reads every shard the map names and keeps the last value it reads for a name, which need
    not be the one the map points to, so the model would not be the one the index describes.
    Only the shards' headers are read."""
    from safetensors import safe_open

    holder: dict[str, str] = {}
    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt") as handle:
                names = list(handle.keys())
        except Exception as exc:
            raise InputError(str(shard), f"cannot be read as a .safetensors file ({exc})") from exc
        for name in names:
            first = holder.setdefault(name, shard.name)
            if first != shard.name:
                mapped = weight_map.get(name)
                raise InputError(
                    str(index),
                    f"its shards {first} and {shard.name} both hold tensor {name!r} (the map "
                    f"names {mapped!r}); the model loaded would depend on which is read last",
                    "save the model again with save_pretrained",
                )


def read_json(path: Path) -> Any:
    """A library's JSON metadata file in a folder (``config.json``, ``tokenizer_config.json``,
    a saved dataset's ``state.json``...), read through :func:`curvcal.jsontext.loads` with
    ``wide_ints``; a file that is not readable or not JSON is an :class:`InputError` on it, and
    so is a ``config.json`` or ``adapter_config.json`` value outside the bounds of
    :mod:`curvcal.load.models.library_limits`."""
    from curvcal.load.models.library_limits import check_config

    readable_file(path)
    try:
        value = jsontext.loads(path.read_text(encoding="utf-8"), str(path), wide_ints=True)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"is not valid JSON: {one_line(exc)}") from None
    check_config(path, value)  # library settings bounded before any library runs them
    return value


def _labels(config: Mapping[str, Any]) -> tuple[str, ...]:
    raw = config.get("id2label")
    if not isinstance(raw, dict) or not raw:
        return ()
    try:
        by_index = {int(k): str(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        return ()
    if sorted(by_index) != list(range(len(by_index))):
        return ()
    return tuple(by_index[i] for i in range(len(by_index)))


def _image_processor(path: Path) -> dict[str, Any] | None:
    file = path / PREPROCESSOR_NAME
    if not file.is_file():
        return None
    raw = read_json(file)
    if not isinstance(raw, dict):
        return None
    size = raw.get("size")
    side = None
    if isinstance(size, dict):
        side = size.get("height") or size.get("shortest_edge")
    elif isinstance(size, int):
        side = size
    mean = raw.get("image_mean") if raw.get("do_normalize", True) else None
    std = raw.get("image_std") if raw.get("do_normalize", True) else None
    input_size = (3, side, side) if isinstance(side, int) else None
    return _preprocessing(mean, std, input_size, None, str(file))


def _preprocessing(
    mean: Any, std: Any, input_size: Any, crop_pct: Any, source: str
) -> dict[str, Any] | None:
    """A checked ``{"mean", "std", "input_size", "crop_pct", "source"}``; None when empty."""
    out: dict[str, Any] = {"source": source}
    if (
        isinstance(mean, list | tuple)
        and isinstance(std, list | tuple)
        and len(mean) == len(std)
        and all(isinstance(v, int | float) for v in (*mean, *std))
        and all(s > 0 for s in std)
    ):
        out["mean"] = tuple(float(v) for v in mean)
        out["std"] = tuple(float(v) for v in std)
    if (
        isinstance(input_size, list | tuple)
        and len(input_size) == 3
        and all(isinstance(v, int) and v > 0 for v in input_size)
    ):
        out["input_size"] = tuple(input_size)
        if isinstance(crop_pct, int | float) and 0 < crop_pct <= 1:
            out["crop_pct"] = float(crop_pct)
    return out if len(out) > 1 else None
