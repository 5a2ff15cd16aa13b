"""A causal language model as a classifier over the K answers of each row of multiple-choice data.

The score of answer k of a row is

    s_k = (1 / d_k) * sum_{t in answer k} log p(x_t | x_<t)

with ``x`` the row's prompt tokens followed by answer k's (:mod:`curvcal.load.choices`), ``d_k``
1 (``--choice-score sum``), the answer's token count (``mean-token``) or its character count
(``mean-char``), given by the batch. The K scores are the classifier's logits: softmax over
them, cross-entropy against the index of the right answer, every command's calibration and
curvature run on them unchanged.

Memory: the decoder runs once over each (row, answer) sequence and returns hidden states; the
language-model head (hidden -> vocabulary) is applied only at the positions that predict an
answer token, so the largest vocabulary-wide tensor is (answer tokens in the batch) x V, never
(prompt tokens) x V. The forward is differentiable in every parameter (the Hessian runs
through it), a LoRA adapter's included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from curvcal.errors import InputError
from curvcal.load.hf import LogitsModule

#: the batch keys the scorer reads (:meth:`curvcal.load.choices.ChoiceDataset.collate`)
BATCH_KEYS = ("input_ids", "attention_mask", "choice_targets", "choice_divisors")


class ChoiceScorer(LogitsModule):
    """A transformers ``*ForCausalLM`` (or a ``PeftModel`` over one) whose forward on a batch of
    B rows of K answers returns the (B, K) answer scores. Parameter names are the library
    model's, as for :class:`~curvcal.load.hf.LogitsModule`."""

    def forward(self, x: Any) -> torch.Tensor:
        if not isinstance(x, Mapping) or any(key not in x for key in BATCH_KEYS):
            raise InputError(
                "--data",
                "a causal language model scores answers: its data must be multiple-choice rows "
                f"(batches with {', '.join(BATCH_KEYS)})",
                "give a table with prompt, choices and label columns (or --choices a,b,c)",
            )
        causal = _causal_model(self.__dict__["library_model"])
        input_ids = x["input_ids"]
        n_rows, n_choices, width = input_ids.shape
        sequences = n_rows * n_choices
        decoder = causal.get_decoder()
        hidden = decoder(
            input_ids=input_ids.reshape(sequences, width),
            attention_mask=x["attention_mask"].reshape(sequences, width),
            use_cache=False,
            return_dict=True,
        ).last_hidden_state
        targets = x["choice_targets"].reshape(sequences, width)
        rows, positions = (targets >= 0).nonzero(as_tuple=True)
        logits = _head_logits(causal, hidden[rows, positions])  # (answer tokens, V)
        token_log_probs = torch.log_softmax(logits, dim=-1)
        picked = token_log_probs.gather(1, targets[rows, positions].unsqueeze(1)).squeeze(1)
        sums = picked.new_zeros(sequences).index_add(0, rows, picked)
        divisors = x["choice_divisors"].to(sums.dtype)
        return sums.reshape(n_rows, n_choices) / divisors


def scores_choices(module: nn.Module) -> bool:
    """Whether ``module`` is a causal LM scoring answers (its outputs are not a fixed head's)."""
    return isinstance(module, ChoiceScorer)


def as_choice_scorer(module: nn.Module, where: str) -> nn.Module:
    """``module`` as curvcal runs it: a :class:`ChoiceScorer` when it is a
    :class:`~curvcal.load.hf.LogitsModule` around a ``*ForCausalLM`` (or a ``PeftModel`` over
    one), else ``module`` itself."""
    if not isinstance(module, LogitsModule) or isinstance(module, ChoiceScorer):
        return module
    library = module.__dict__["library_model"]
    if not type(_causal_model(library)).__name__.endswith("ForCausalLM"):
        return module
    check_scorable(library, where)
    return ChoiceScorer(library, module.modality)


def check_scorable(model: nn.Module, where: str) -> None:
    """Refuse a ``PeftModel`` whose adapter changes the inputs (prompt learning: virtual tokens
    the decoder alone would not see); LoRA and its kin act inside the decoder's layers."""
    config = getattr(model, "active_peft_config", None)
    if config is not None and bool(getattr(config, "is_prompt_learning", False)):
        raise InputError(
            where,
            f"is a {getattr(config, 'peft_type', 'prompt-learning')} adapter, which adds "
            "virtual tokens to the inputs; answers are scored for adapters inside the layers "
            "(LoRA and its kin)",
        )


def _causal_model(model: nn.Module) -> Any:
    """The ``*ForCausalLM`` itself: a ``PeftModel``'s base model (its LoRA layers are in it)."""
    getter = getattr(model, "get_base_model", None)
    return getter() if callable(getter) else model


def _head_logits(causal: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The language-model head on the gathered hidden states, with the final soft-capping some
    models apply (``final_logit_softcapping``: c * tanh(z / c)) and a ``logit_scale``."""
    logits: torch.Tensor = causal.get_output_embeddings()(hidden)
    config = causal.config
    scale = getattr(config, "logit_scale", None)
    if isinstance(scale, int | float) and not isinstance(scale, bool):
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if isinstance(cap, int | float) and not isinstance(cap, bool) and cap > 0:
        logits = torch.tanh(logits / cap) * cap
    return logits
