"""Tiny causal language models (Llama- and Qwen2-style) built from configs with random weights,
saved by transformers with the byte-level BPE tokenizer of :mod:`hf_decoder_builders`; PEFT
language-model LoRA adapters on them; multiple-choice rows; and the choice log-likelihoods
computed by hand from the library's own forward. Shared by the choice-scoring tests."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from hf_decoder_builders import decoder_config, train_tokenizer

#: prompts, answers and the right answer's index; the second prompt ends in a space (moved to
#: the answer's front), the answers share prefixes and differ in length
QUESTIONS = (
    ("the film was great. Sentiment:", ["positive", "negative", "dull"], 0),
    ("a dull and boring movie. Sentiment: ", ["positive", "negative", "dull"], 1),
    ("I loved it. It was", ["great", "boring", "fine story"], 0),
    ("boring plot, I hated every minute", ["of it", "great", "fine"], 0),
    ("the story was fine and the acting", ["great", "dull", "boring plot"], 0),
    ("not great, not", ["boring", "great acting", "a fine film"], 0),
    ("Review: I hated it.\nSentiment:", ["negative", "positive", "fine"], 0),
)


def causal_config(kind: str, vocab_size: int, pad_token_id: int | None) -> Any:
    """The one-layer Llama or Qwen2 config of :func:`decoder_config` as a language model's
    (no labels; Qwen2 with its output embedding tied to the input one)."""
    import transformers

    values = decoder_config(kind, vocab_size, pad_token_id).to_dict()
    for key in ("id2label", "label2id", "num_labels"):
        values.pop(key, None)
    values["tie_word_embeddings"] = kind == "qwen2"
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind]
    return config_class(**values)


def save_causal_lm(folder: Path, kind: str, seed: int = 0) -> Path:
    """A random ``{Llama,Qwen2}ForCausalLM`` and its tokenizer saved in ``folder``; the
    output layer scaled up so that answers get distinct scores."""
    import transformers

    tokenizer = train_tokenizer()
    torch.manual_seed(seed)
    config = causal_config(kind, len(tokenizer), tokenizer.pad_token_id)
    model_class = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}
    model = model_class[kind](config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(2.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_causal_lora(base_folder: Path, adapter_folder: Path, seed: int = 3) -> Any:
    """A language-model LoRA adapter (``task_type="CAUSAL_LM"``, r=2 on the query and value
    projections) over the causal LM in ``base_folder``, its B matrices drawn from N(0, 0.5²)
    after seeding ``seed``, saved by peft; returns the PeftModel."""
    import peft
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(
        base_folder, attn_implementation="eager"
    )
    config = peft.LoraConfig(
        task_type="CAUSAL_LM", r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]
    )
    model = peft.get_peft_model(base, config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    model.save_pretrained(adapter_folder)
    return model


def write_questions(
    path: Path, questions: Sequence[tuple[str, list[str], int]] = QUESTIONS
) -> Path:
    """``questions`` as JSON lines with ``prompt``, ``choices`` and ``label``."""
    with path.open("w") as handle:
        for prompt, choices, label in questions:
            handle.write(json.dumps({"prompt": prompt, "choices": choices, "label": label}) + "\n")
    return path


def pair_tokens(
    tokenizer: Any, prompt: str, answer: str, delimiter: str = " "
) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's ``_encode_pair`` written out: the prompt's trailing whitespace
    moved to the continuation, the continuation's tokens those of the whole past the prompt's."""
    continuation = delimiter + answer
    spaces = len(prompt) - len(prompt.rstrip())
    if spaces:
        prompt, continuation = prompt[:-spaces], prompt[-spaces:] + continuation
    context = tokenizer(prompt)["input_ids"]
    whole = tokenizer(prompt + continuation)["input_ids"]
    return list(context), list(whole[len(context) :])


def hand_log_likelihoods(
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    tokenizer: Any,
    questions: Sequence[tuple[str, list[str], int]] = QUESTIONS,
) -> torch.Tensor:
    """(N, K) summed log-likelihoods of each answer's tokens after its prompt, one forward per
    (prompt, answer) over the whole vocabulary: log_softmax of the causal LM's own logits
    (``logits_of(input_ids)``, (1, L, V)) at the positions before each answer token."""
    out = []
    for prompt, choices, _label in questions:
        row = []
        for answer in choices:
            context, continuation = pair_tokens(tokenizer, prompt, answer)
            log_probs = torch.log_softmax(logits_of(torch.tensor([context + continuation]))[0], -1)
            start = len(context) - 1
            row.append(sum(log_probs[start + i, t] for i, t in enumerate(continuation)))
        out.append(torch.stack(row))
    return torch.stack(out)
