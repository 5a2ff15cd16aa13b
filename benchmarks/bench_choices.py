"""Choice scoring of a Llama-style causal language model on the CPU, per prompt length: the time of
a gradient pass and of a Hessian product through the answer loss, and the largest
vocabulary-wide tensor, against scoring each answer by the library's own forward.

The model is transformers' ``LlamaForCausalLM`` of the Llama benchmark's shape
(``bench_llama.Shape``: hidden 512, 4 layers, feed-forward 1024, 8 heads of which 4 key/value,
vocabulary 8000; P = 17.6 M with the untied head) with random weights, on ``--rows`` random
rows, each a prompt of P tokens and ``--choices`` answers of ``--answer-tokens`` tokens.
Every parameter is in the Hessian.

- **packed**: curvcal's :class:`~curvcal.load.models.choice_scorer.ChoiceScorer` on
  :meth:`~curvcal.load.texts.choices.ChoiceDataset.collate`'s batches: one sequence per row (the
  prompt once, then the answers), the head only at the positions predicting answer tokens;
- **per answer** (the baseline, what an evaluation harness does): one sequence per (row,
  answer), the library's forward with full-vocabulary logits at every position, the answer
  tokens' log-probabilities gathered from them.

Both give the same K scores (checked on every run, float32). For each prompt length, interleaved,
the minimum over ``--repeats`` of the seconds per gradient pass of the summed cross-entropy
(packed and per answer) and per Hessian product of the packed scorer (double backward, graphs
rebuilt for every product), their ratio; and the largest tensor with a vocabulary-wide
dimension that one gradient pass allocates, the weight-shaped ones left out (MiB, recorded by a
``TorchDispatchMode``)::

    python benchmarks/bench_choices.py [--prompts 16,64,256] [--repeats 2] [--json OUT]

Shape options as ``bench_llama.py`` (``--hidden``, ``--layers``, ...), one thread.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from curvcal.curvature import HessianOperator
from curvcal.load.models.choice_scorer import ChoiceScorer
from curvcal.load.texts.choices import ChoiceDataset, ChoiceRow

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llama import Shape, fastest

Batch = tuple[dict[str, Tensor], Tensor]


@dataclass(frozen=True)
class Rows:
    """The multiple-choice data: rows, answers per row, tokens per answer, prompt tokens."""

    rows: int = 4
    choices: int = 4
    answer_tokens: int = 3
    prompt: int = 64


def build_scorer(shape: Shape) -> ChoiceScorer:
    """A random ``LlamaForCausalLM`` of ``shape`` (seed 0), float32, eval mode, as curvcal
    wraps one."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return ChoiceScorer(transformers.LlamaForCausalLM(config).eval(), "text").eval()


def choice_rows(shape: Shape, rows: Rows) -> tuple[list[ChoiceRow], Tensor]:
    """Random token rows (ids in [3, vocab)) and labels; fixed seed."""
    generator = torch.Generator().manual_seed(1)

    def draw(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(3, shape.vocab, (count,), generator=generator).tolist())

    out = [
        ChoiceRow(
            prompt=draw(rows.prompt),
            answers=tuple(draw(rows.answer_tokens) for _ in range(rows.choices)),
            divisors=(1.0,) * rows.choices,
        )
        for _ in range(rows.rows)
    ]
    labels = torch.randint(0, rows.choices, (rows.rows,), generator=generator)
    return out, labels


def per_answer_scores(scorer: ChoiceScorer, rows: list[ChoiceRow]) -> Tensor:
    """The baseline: each (row, answer) as its own sequence through the library's forward,
    full-vocabulary logits at every position, the answer tokens' log-probabilities summed."""
    model = scorer.__dict__["library_model"]
    sequences = [row.prompt + answer for row in rows for answer in row.answers]
    ids = torch.tensor(sequences)  # every answer has the same length here: no padding
    log_probs = torch.log_softmax(model(input_ids=ids).logits, dim=-1)
    n_prompt, n_answer = len(rows[0].prompt), len(rows[0].answers[0])
    targets = ids[:, n_prompt:]
    picked = log_probs[:, n_prompt - 1 : n_prompt - 1 + n_answer].gather(2, targets[..., None])
    return picked.squeeze(-1).sum(1).reshape(len(rows), -1)


class _Widest(TorchDispatchMode):
    """The most bytes of one tensor with a ``vocabulary``-wide dimension, weight-shaped ones
    (vocabulary x hidden: the embedding, the head and their gradients) left out."""

    def __init__(self, vocabulary: int, hidden: int) -> None:
        super().__init__()
        self.vocabulary, self.bytes = vocabulary, 0
        self.weights = {(vocabulary, hidden), (hidden, vocabulary)}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, tuple | list) else (out,):
            shape = tuple(value.shape) if isinstance(value, Tensor) else ()
            if self.vocabulary in shape and shape not in self.weights:
                size = math.prod(shape) * value.element_size()
                self.bytes = max(self.bytes, size)
        return out


def prompt_row(shape: Shape, rows: Rows, repeats: int) -> dict[str, Any]:
    """One prompt length: times, their ratios, the widest vocabulary tensors, and the largest
    difference between the two ways' scores."""
    torch.set_num_threads(1)
    scorer = build_scorer(shape)
    data, labels = choice_rows(shape, rows)
    x, y = ChoiceDataset(data, labels, 0).collate(list(zip(data, labels.tolist(), strict=True)))
    with torch.no_grad():
        difference = float((scorer(x) - per_answer_scores(scorer, data)).abs().max())

    def packed_gradient() -> None:
        torch.nn.functional.cross_entropy(scorer(x), y, reduction="sum").backward()
        scorer.zero_grad(set_to_none=True)

    def per_answer_gradient() -> None:
        scores = per_answer_scores(scorer, data)
        torch.nn.functional.cross_entropy(scores, y, reduction="sum").backward()
        scorer.zero_grad(set_to_none=True)

    operator = HessianOperator(scorer, [(x, y)], keep_graphs="never")
    vector = torch.randn(operator.shape[0], generator=torch.Generator().manual_seed(2))
    seconds = fastest(
        {
            "packed_gradient_s": packed_gradient,
            "per_answer_gradient_s": per_answer_gradient,
            "packed_product_s": lambda: operator.matvec(vector),
        },
        repeats,
    )
    widest = {}
    for name, step in (("packed", packed_gradient), ("per_answer", per_answer_gradient)):
        with _Widest(shape.vocab, shape.hidden) as mode:
            step()
        widest[f"{name}_vocab_tensor_mib"] = mode.bytes / 2**20
    return {
        "prompt_tokens": rows.prompt,
        "n_params": sum(p.numel() for p in scorer.parameters()),
        **seconds,
        "product_per_gradient": seconds["packed_product_s"] / seconds["packed_gradient_s"],
        "per_answer_per_packed_gradient": seconds["per_answer_gradient_s"]
        / seconds["packed_gradient_s"],
        **widest,
        "max_score_difference": difference,
    }


def table(out: list[dict[str, Any]]) -> str:
    lines = [
        "| prompt tokens | gradient s (packed) | product s (packed) | product / gradient | "
        "gradient s (per answer) | per answer / packed | widest vocab tensor MiB (packed / per "
        "answer) | max score difference |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in out:
        lines.append(
            f"| {row['prompt_tokens']} | {row['packed_gradient_s']:.3f} | "
            f"{row['packed_product_s']:.3f} | {row['product_per_gradient']:.2f} | "
            f"{row['per_answer_gradient_s']:.3f} | {row['per_answer_per_packed_gradient']:.2f} | "
            f"{row['packed_vocab_tensor_mib']:.2f} / {row['per_answer_vocab_tensor_mib']:.1f} | "
            f"{row['max_score_difference']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in asdict(Shape()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    for name, value in asdict(Rows()).items():
        if name != "prompt":
            parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--prompts", default="16,64,256")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    shape = Shape(**{k: getattr(args, k) for k in asdict(Shape())})
    base = Rows(rows=args.rows, choices=args.choices, answer_tokens=args.answer_tokens)
    out = [
        prompt_row(shape, replace(base, prompt=int(p)), args.repeats)
        for p in args.prompts.split(",")
    ]
    print(table(out))
    if args.json is not None:
        args.json.write_text(json.dumps({"shape": asdict(shape), "rows": out}, indent=1))


if __name__ == "__main__":
    main()
