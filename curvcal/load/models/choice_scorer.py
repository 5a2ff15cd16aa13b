"""A causal language model as a classifier over the K answers of each row of multiple-choice data.

The score of answer k of a row is

    s_k = (1 / d_k) * sum_{t in answer k} log p(x_t | x_<t)

with ``x`` the row's prompt tokens followed by answer k's (:mod:`curvcal.load.texts.choices`), ``d_k``
1 (``--choice-score sum``), the answer's token count (``mean-token``) or its character count
(``mean-char``), given by the batch. The K scores are the classifier's logits: softmax over
them, cross-entropy against the index of the right answer, every command's calibration and
curvature run on them unchanged.

Memory and time: each row is one packed sequence, its prompt once and its K answers after it,
each answer attending to the prompt and to itself (:meth:`curvcal.load.texts.choices.ChoiceDataset.
collate`), so the prompt's pass is shared by the K answers. The decoder returns hidden states;
the language-model head (hidden -> vocabulary) is applied only at the positions that predict
an answer token, so the largest vocabulary-wide tensor is B x (most answer tokens in a row) x
V, never (prompt tokens) x V. A row is one sample through every layer, the head included (each
layer's input has the batch's B rows first), as the per-sample curvature engines need. The forward is differentiable in every parameter (the Hessian runs
through it), a LoRA adapter's included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from curvcal.errors import InputError
from curvcal.load.limits import available_memory
from curvcal.load.models.hf import LogitsModule

#: the batch keys the scorer reads (:meth:`curvcal.load.texts.choices.ChoiceDataset.collate`)
BATCH_KEYS = (
    "input_ids", "position_ids", "choice_segments", "choice_from", "choice_tokens", "choice_of",
    "choice_divisors",
)  # fmt: skip


class ChoiceScorer(LogitsModule):
    """A transformers ``*ForCausalLM`` (or a ``PeftModel`` over one) whose forward on a batch of
    B packed rows of K answers returns the (B, K) answer scores. Parameter names are the
    library model's, as for :class:`~curvcal.load.models.hf.LogitsModule`."""

    def forward(self, x: Any) -> torch.Tensor:
        if not isinstance(x, Mapping) or any(key not in x for key in BATCH_KEYS):
            raise InputError(
                "--data",
                "a causal language model scores answers: its data must be multiple-choice rows "
                f"(batches with {', '.join(BATCH_KEYS)})",
                "give a table with prompt, choices and label columns (or --choices a,b,c)",
            )
        causal = _causal_model(self.__dict__["library_model"])
        head = causal.get_output_embeddings()
        segments = x["choice_segments"]
        check_attention_memory(
            segments,
            head.weight.dtype,
            causal.config,
            answer_tokens=int(x["choice_of"].shape[1]),
            vocabulary=int(head.weight.shape[0]),
        )
        hidden = causal.get_decoder()(
            input_ids=x["input_ids"],
            position_ids=x["position_ids"],
            attention_mask=answer_mask(segments, head.weight.dtype),
            use_cache=False,
            return_dict=True,
        ).last_hidden_state  # (B, S, H)
        owners = x["choice_of"]  # (B, T)
        sources = x["choice_from"].unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        logits = _head_logits(causal, hidden.gather(1, sources))  # (B, T, V)
        token_log_probs = torch.log_softmax(logits, dim=-1)
        picked = token_log_probs.gather(2, x["choice_tokens"].unsqueeze(-1)).squeeze(-1)
        picked = torch.where(owners >= 0, picked, torch.zeros((), dtype=picked.dtype))
        divisors = x["choice_divisors"]
        sums = picked.new_zeros(divisors.shape).scatter_add(1, owners.clamp(min=0), picked)
        return sums / divisors.to(sums.dtype)


def attention_bytes(rows: int, width: int, dtype: torch.dtype, heads: int) -> int:
    """Bytes the attention over ``rows`` packed rows of ``width`` tokens holds at once, at the
    least: the additive mask of :func:`answer_mask` (rows × width² in ``dtype``, built from
    three boolean width² tensors) and one layer's attention scores (rows × ``heads`` × width²
    in ``dtype``)."""
    square = rows * width * width
    return square * (dtype.itemsize * (1 + heads)) + 3 * width * width


def answer_logits_bytes(rows: int, answer_tokens: int, vocabulary: int, dtype: torch.dtype) -> int:
    """Bytes the head's output over the answers' tokens holds at once, at the least: the logits
    and their log-softmax, each rows × ``answer_tokens`` × ``vocabulary`` in ``dtype``."""
    return 2 * rows * answer_tokens * vocabulary * dtype.itemsize


def check_attention_memory(
    segments: torch.Tensor,
    dtype: torch.dtype,
    config: Any,
    answer_tokens: int = 0,
    vocabulary: int = 0,
) -> None:
    """Refuse (an :class:`InputError` naming ``--data``) a batch of packed rows whose attention
    (:func:`attention_bytes`, a lower bound of what the eager attention the models are loaded
    with holds) and answer logits (:func:`answer_logits_bytes`: the batch's most
    ``answer_tokens`` in a row, over a ``vocabulary``) exceed the memory free on their device:
    a row of many answers packs into many tokens, and the mask and scores over them grow as
    the square, the logits as the answers' tokens times the vocabulary, which the kernel would
    end by killing the run (exit 137) or torch by a failed allocation after minutes."""
    rows, width = int(segments.shape[0]), int(segments.shape[1])
    heads = getattr(config, "num_attention_heads", 1)
    heads = heads if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 else 1
    need = attention_bytes(rows, width, dtype, heads) + answer_logits_bytes(
        rows, answer_tokens, vocabulary, dtype
    )
    if segments.device.type == "cuda":  # free on the device, and free in torch's own cache
        cached = torch.cuda.memory_reserved(segments.device) - torch.cuda.memory_allocated(
            segments.device
        )
        free: int | None = int(torch.cuda.mem_get_info(segments.device)[0]) + int(cached)
    else:
        free = available_memory()
    if free is not None and need > free:
        raise InputError(
            "--data",
            f"{rows} multiple-choice row{'s' if rows != 1 else ''} packed into {width:,} tokens "
            f"need {need / 2**30:,.1f} GiB for their attention (it grows as the square of the "
            f"tokens) and answer logits, more than the {free / 2**30:,.1f} GiB free on "
            f"{segments.device.type}",
            "give fewer or shorter answers per row, or a smaller --batch-size",
        )


def answer_mask(segments: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask (B, 1, S, S) of packed rows: query i sees key j <= i when j
    is a prompt token (segment 0) or in i's own answer; padding (segment -1) sees itself only.
    0 where seen, the dtype's lowest value elsewhere (transformers adds a 4-D mask as given)."""
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)
    width = segments.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=segments.device).tril()
    seen = causal & (key >= 0) & (query >= 0) & ((key == 0) | (key == query))
    seen |= torch.eye(width, dtype=torch.bool, device=segments.device)
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=segments.device)
    return torch.where(seen, torch.zeros((), dtype=dtype, device=segments.device), blocked)[:, None]


def scores_choices(module: nn.Module) -> bool:
    """Whether ``module`` is a causal LM scoring answers (its outputs are not a fixed head's)."""
    return isinstance(module, ChoiceScorer)


def as_choice_scorer(module: nn.Module) -> nn.Module:
    """``module`` as curvcal runs it: a :class:`ChoiceScorer` when it is a
    :class:`~curvcal.load.models.hf.LogitsModule` around a ``*ForCausalLM`` (or a ``PeftModel`` over
    one), else ``module`` itself."""
    if not isinstance(module, LogitsModule) or isinstance(module, ChoiceScorer):
        return module
    library = module.__dict__["library_model"]
    if not type(_causal_model(library)).__name__.endswith("ForCausalLM"):
        return module
    return ChoiceScorer(library, module.modality)


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
