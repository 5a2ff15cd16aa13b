"""A causal language model folder (``LlamaForCausalLM``, ``Qwen2ForCausalLM``...) as the base
of a PEFT adapter trained for sequence classification (``task_type="SEQ_CLS"``).

That is how a decoder classifier is usually fine-tuned: the released language model is loaded
with ``AutoModelForSequenceClassification.from_pretrained(BASE, num_labels=K,
pad_token_id=...)``, which keeps its transformer and drops ``lm_head``, and the adapter saves the
LoRA matrices together with the new head (``score`` or ``classifier``, a ``modules_to_save``
copy). curvcal builds the same classifier:

- the class is the one transformers' own auto table maps the config's ``model_type`` to
  (``MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES``), never a table of curvcal's;
- ``num_labels`` K is the row count of the adapter's saved head weight (K x hidden);
- ``pad_token_id`` is ``config.json``'s when set, else the tokenizer's pad token (the adapter
  folder's tokenizer when it saved one, else the base folder's), as transformers' decoder
  classifiers read each text at its last non-padding token;
- the base's weights load through transformers' ``from_pretrained`` (local files only, no
  code trust); the only weight allowed missing is the head (the adapter brings it) and the only
  ones allowed left over are ``lm_head``'s.

Refused with one line (:class:`~curvcal.errors.InputError`): an adapter whose ``task_type`` is
not ``SEQ_CLS``; one with no saved head (the head would be random); a head whose shape does not
fit the base (columns against ``hidden_size``, rows against the labels ``config.json`` names);
a model type transformers has no sequence classifier for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from curvcal.errors import InputError, TrustError
from curvcal.load.extras import require
from curvcal.load.models.adapters import AdapterFolder
from curvcal.load.models.hf import (
    CONFIG_NAME,
    LOAD_REPORT,
    SAFETENSORS_INDEX,
    SAFETENSORS_NAME,
    LogitsModule,
    custom_code_entries,
    read_json,
    transformers_load,
)

#: the module names peft's sequence-classification model saves as the classifier head
#: (``PeftModelForSequenceClassification`` adds them to ``modules_to_save``)
HEAD_NAMES = ("classifier", "score")
_PREFIX = "base_model.model."
SAFETENSORS_FILES = (SAFETENSORS_NAME, SAFETENSORS_INDEX)


@dataclass(frozen=True)
class CausalBase:
    """The sequence classifier to build from a causal-LM folder for an adapter: the folder and
    its config, the causal and the classifier class names, ``num_labels`` (rows of the saved
    ``head``), and ``pad_token_id`` with where it came from (``None``: nowhere)."""

    path: Path
    config: Mapping[str, Any]
    causal: str
    classifier: str
    head: str
    num_labels: int
    pad_token_id: int | None
    pad_source: str

    def describe(self) -> str:
        """One line saying what was built (for stderr and the report)."""
        pad = (
            f"pad_token_id {self.pad_token_id} from {self.pad_source}"
            if self.pad_token_id is not None
            else "no pad_token_id"
        )
        return (
            f"built {self.classifier} from the {self.causal} in {self.path} ({self.num_labels} "
            f"labels from the adapter's {self.head} head, {pad}; lm_head dropped)"
        )


def is_causal_lm_folder(path: Path) -> bool:
    """Whether the model folder at ``path`` names a ``*ForCausalLM`` architecture."""
    return causal_architecture(read_json(path / CONFIG_NAME)) is not None


def causal_architecture(config: Any) -> str | None:
    """The ``*ForCausalLM`` name of a ``config.json``, else None."""
    names = config.get("architectures") if isinstance(config, dict) else None
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    return name if name is not None and name.endswith("ForCausalLM") else None


def plan_classifier(
    adapter: AdapterFolder,
    base_path: Path,
    head_shapes: Mapping[str, tuple[int, ...]],
    trust: bool,
) -> CausalBase:
    """What to build from the causal-LM folder ``base_path`` for ``adapter``, whose saved
    tensors have ``head_shapes`` (name -> shape); every refusal happens here, before any
    weight is read."""
    config_file = str(adapter.path / "adapter_config.json")
    config = read_json(base_path / CONFIG_NAME)
    causal = causal_architecture(config) or "?"
    task = adapter.config.get("task_type")
    if task != "SEQ_CLS":
        raise InputError(
            config_file,
            f"has task_type {task!r}, not 'SEQ_CLS' nor 'CAUSAL_LM': over the {causal} in "
            f"{base_path} it is neither a sequence classifier nor a language model",
            "pass an adapter trained with LoraConfig(task_type='SEQ_CLS'), or a "
            "language-model one (task_type='CAUSAL_LM') with multiple-choice data",
        )
    entries = custom_code_entries(config)
    if entries and not trust:
        raise TrustError(
            str(base_path),
            f"config.json asks for custom code ({', '.join(entries)}), which building the "
            "model would import and run",
            "pass --trust-checkpoint only if you trust the folder's source",
        )
    classifier = _classifier_name(config, base_path, causal)
    head, num_labels = _saved_head(adapter, head_shapes, config, base_path)
    pad_token_id, pad_source = _pad_token(config, adapter.path, base_path, trust)
    return CausalBase(
        path=base_path,
        config=config,
        causal=causal,
        classifier=classifier,
        head=head,
        num_labels=num_labels,
        pad_token_id=pad_token_id,
        pad_source=pad_source,
    )


def build_classifier(plan: CausalBase, trust: bool, notes: list[str]) -> LogitsModule:
    """The ``plan.classifier`` with the causal LM's weights (``lm_head`` dropped, the head left
    for the adapter), through ``AutoModelForSequenceClassification.from_pretrained``; what
    transformers warns about beyond its load report (which :func:`_check_weights` reads) is
    added to ``notes`` (:func:`~curvcal.load.models.library_limits.library_warnings`)."""
    transformers = require("hf", "transformers", str(plan.path))
    said: list[str] = []
    with (
        transformers_load(
            transformers, plan.path, f"cannot build {plan.classifier} from its {plan.causal}", said
        ),
        torch.random.fork_rng(devices=[]),  # the head's random start leaves no trace
    ):
        model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
            str(plan.path),
            num_labels=plan.num_labels,
            pad_token_id=plan.pad_token_id,
            local_files_only=True,
            trust_remote_code=trust,
            # the weights curvcal scanned: safetensors when present, else the .bin
            use_safetensors=any((plan.path / n).is_file() for n in SAFETENSORS_FILES),
            attn_implementation="eager",
            output_loading_info=True,
        )
    _check_weights(plan, info)
    # its load report names lm_head and the head, which _check_weights has checked
    notes += [note for note in said if LOAD_REPORT not in note and note not in notes]
    return LogitsModule(model, "text")


# --- helpers ---------------------------------------------------------------------------------


def _classifier_name(config: Mapping[str, Any], base_path: Path, causal: str) -> str:
    """The ``*ForSequenceClassification`` class transformers' auto table gives the config's
    ``model_type``."""
    transformers = require("hf", "transformers", str(base_path))
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as names,
    )

    model_type = config.get("model_type")
    name = names.get(model_type) if isinstance(model_type, str) else None
    if not isinstance(name, str) or not hasattr(transformers, name):
        raise InputError(
            str(base_path),
            f"holds a {causal} (model_type {model_type!r}), which transformers has no "
            "sequence classifier for",
            "an adapter on it cannot be a classifier curvcal can build",
        )
    return name


def _saved_head(
    adapter: AdapterFolder,
    shapes: Mapping[str, tuple[int, ...]],
    config: Mapping[str, Any],
    base_path: Path,
) -> tuple[str, int]:
    """The head module's name and its row count K from the adapter's saved
    ``base_model.model.{classifier,score}.weight`` (K x hidden), checked against the base."""
    found = [
        (name[len(_PREFIX) : -len(".weight")], shape)
        for name, shape in shapes.items()
        if name.startswith(_PREFIX)
        and name.endswith(".weight")
        and name[len(_PREFIX) : -len(".weight")] in HEAD_NAMES
    ]
    saved = list(adapter.modules_to_save) or None
    if not found:
        raise InputError(
            str(adapter.weights),
            f"holds no classification head ({' nor '.join(HEAD_NAMES)} weight; "
            f"modules_to_save is {saved}): over the {causal_architecture(config)} the "
            "classifier's head would be random",
            "save the adapter with the head in modules_to_save, as LoraConfig(task_type="
            "'SEQ_CLS') does",
        )
    head, shape = found[0]
    hidden = config.get("hidden_size")
    if len(shape) != 2 or (isinstance(hidden, int) and shape[1] != hidden):
        raise InputError(
            str(adapter.weights),
            f"its {head} head has shape {list(shape)}, which does not fit the base's "
            f"hidden_size {hidden}",
            "pass --base-model DIR naming the model the adapter was trained on",
        )
    num_labels = shape[0]
    bias = shapes.get(f"{_PREFIX}{head}.bias")
    named = config.get("id2label")
    # transformers' default names (LABEL_0, LABEL_1) say nothing about the classes
    expected = (
        len(named)
        if isinstance(named, dict) and any(str(v) != f"LABEL_{k}" for k, v in named.items())
        else None
    )
    hint = "the head's rows are the classes: pass the base and adapter trained together"
    if bias is not None and tuple(bias) != (num_labels,):
        raise InputError(
            str(adapter.weights),
            f"its {head} head has {num_labels} rows but its bias has shape {list(bias)}",
            hint,
        )
    if isinstance(expected, int) and expected != num_labels:
        raise InputError(
            str(adapter.weights),
            f"its {head} head has {num_labels} rows but {base_path / CONFIG_NAME} names "
            f"{expected} labels",
            hint,
        )
    return head, num_labels


def _pad_token(
    config: Mapping[str, Any], adapter_path: Path, base_path: Path, trust: bool
) -> tuple[int | None, str]:
    """``config.json``'s ``pad_token_id``, else the pad token id of the tokenizer saved with the
    adapter (else with the base); ``(None, "")`` when neither has one."""
    own = config.get("pad_token_id")
    if isinstance(own, int) and not isinstance(own, bool):
        return own, CONFIG_NAME
    from curvcal.load.texts.text import TOKENIZER_FILES, load_tokenizer

    for folder, where in ((adapter_path, "adapter"), (base_path, "base")):
        if any((folder / name).is_file() for name in TOKENIZER_FILES):
            tokenizer, _ = load_tokenizer(folder, None, trust, [])  # a probe for the pad id
            pad = getattr(tokenizer, "pad_token_id", None)
            if isinstance(pad, int):
                return pad, f"the {where} folder's tokenizer"
            return None, ""
    return None, ""


def _check_weights(plan: CausalBase, info: Mapping[str, Any]) -> None:
    """transformers' loading report: only the head missing, only ``lm_head`` left over."""
    missing = sorted(k for k in info.get("missing_keys", ()) if k.split(".")[0] != plan.head)
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if not k.startswith("lm_head."))
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    problems = []
    if missing:
        problems.append(f"{len(missing)} weights missing ({', '.join(missing[:3])})")
    if unexpected:
        problems.append(f"{len(unexpected)} weights fit no module ({', '.join(unexpected[:3])})")
    if mismatched:
        problems.append(f"{len(mismatched)} weights of another shape ({', '.join(mismatched[:3])})")
    if problems:
        raise InputError(
            str(plan.path),
            f"its weights do not fit {plan.classifier} built from its config.json: "
            + "; ".join(problems),
        )
