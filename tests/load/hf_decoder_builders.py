"""Tiny decoder sequence classifiers (Llama- and Qwen2-style) built from configs with random
weights, each saved by transformers with a real byte-level BPE tokenizer trained here by the
tokenizers library; PEFT LoRA adapters on them. Shared by the decoder, adapter and Trainer
checkpoint tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

TEXTS = (
    "the film was great",
    "a dull and boring movie",
    "great acting and a fine story",
    "boring plot",
    "I loved it",
    "I hated every minute of it",
    "fine",
    "not great, not boring",
    "a great great film",
    "dull",
    "the story was fine and the acting great",
)
LABELS = ("negative", "positive")


def train_tokenizer(pad: bool = True) -> Any:
    """A byte-level BPE tokenizer trained on :data:`TEXTS`, as a ``PreTrainedTokenizerFast``
    with ``<s>``/``</s>`` (and ``<pad>`` when ``pad``)."""
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(list(TEXTS) * 4, trainer)
    special = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    if pad:
        special["pad_token"] = "<pad>"
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=48, **special
    )


def decoder_config(kind: str, vocab_size: int, pad_token_id: int | None) -> Any:
    """A one-layer Llama or Qwen2 classifier config (2 classes, grouped-query attention)."""
    import transformers

    common = {
        "vocab_size": vocab_size,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 64,
        "num_labels": 2,
        "id2label": dict(enumerate(LABELS)),
        "label2id": {name: i for i, name in enumerate(LABELS)},
        "pad_token_id": pad_token_id,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind]
    return config_class(**common)


def save_decoder(folder: Path, kind: str, seed: int = 0, pad_in_config: bool = True) -> Path:
    """A random ``{Llama,Qwen2}ForSequenceClassification`` and its tokenizer saved in
    ``folder``; the head scaled up so that the loss has real curvature."""
    import transformers

    tokenizer = train_tokenizer()
    torch.manual_seed(seed)
    config = decoder_config(kind, len(tokenizer), tokenizer.pad_token_id if pad_in_config else None)
    model_class = {
        "llama": transformers.LlamaForSequenceClassification,
        "qwen2": transformers.Qwen2ForSequenceClassification,
    }[kind]
    model = model_class(config)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_reviews(path: Path) -> Path:
    """:data:`TEXTS` with alternating labels as JSON lines (labels as class names)."""
    with path.open("w") as handle:
        for i, text in enumerate(TEXTS):
            handle.write(json.dumps({"text": text, "label": LABELS[i % 2]}) + "\n")
    return path


def library_logits(model: Any, folder: Path, texts: tuple[str, ...] = TEXTS) -> torch.Tensor:
    """The library's own logits on ``texts``, tokenized and padded by the folder's tokenizer in
    one batch (the batch curvcal makes with ``--batch-size`` at least len(texts))."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(list(texts), padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**encoded).logits


def save_lora(base_folder: Path, adapter_folder: Path, seed: int = 2, **classifier: Any) -> Any:
    """A LoRA adapter (r=2 on the attention's query and value projections, the head as
    ``modules_to_save``) over the classifier in ``base_folder`` (built with ``classifier`` as
    config overrides, ``num_labels=3``, when the folder holds a language model), its B matrices
    and head drawn from N(0, 0.5²) after seeding ``seed``, saved by peft; returns the
    PeftModel."""
    import peft
    import transformers

    base = transformers.AutoModelForSequenceClassification.from_pretrained(
        base_folder, attn_implementation="eager", **classifier
    )
    targets = ["query", "value"] if base.config.model_type == "bert" else ["q_proj", "v_proj"]
    config = peft.LoraConfig(task_type="SEQ_CLS", r=2, lora_alpha=4, target_modules=targets)
    model = peft.get_peft_model(base, config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                parameter.normal_(0, 0.5)
    model.save_pretrained(adapter_folder)
    return model


def copy_with_config(source: Path, folder: Path, config_name: str, **changes: object) -> Path:
    """A copy of the folder ``source`` as ``folder`` with ``changes`` written over the JSON
    file ``config_name`` in it; the copy's folder."""
    shutil.copytree(source, folder)
    config = json.loads((folder / config_name).read_text())
    config.update(changes)
    (folder / config_name).write_text(json.dumps(config))
    return folder


def copy_adapter(adapter_folder: Path, parent: Path, **changes: object) -> Path:
    """A copy of ``adapter_folder`` as ``parent/adapter`` with ``changes`` written over its
    ``adapter_config.json``; the copy's folder."""
    return copy_with_config(adapter_folder, parent / "adapter", "adapter_config.json", **changes)


def dense_hessian(
    model: Any, chosen: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor], labels: Any
) -> torch.Tensor:
    """Dense Hessian of the mean cross-entropy of ``model(**inputs).logits`` against ``labels``
    over the parameters ``chosen`` (name to value, flattened in that order), from the library's
    own forward: ``torch.func.hessian`` of a ``functional_call``."""
    shapes = [(n, p.shape, p.numel()) for n, p in chosen.items()]

    def loss(vector: torch.Tensor) -> torch.Tensor:
        params, start = {}, 0
        for name, shape, count in shapes:
            params[name] = vector[start : start + count].reshape(shape)
            start += count
        out = torch.func.functional_call(model, params, args=(), kwargs=inputs)
        return torch.nn.functional.cross_entropy(out.logits, labels)

    return torch.func.hessian(loss)(torch.cat([p.reshape(-1) for p in chosen.values()]))
