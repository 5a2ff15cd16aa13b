"""Causal language models (and their LoRA adapters) scored over the K answers of multiple-choice
rows: the scores against log-likelihoods computed by hand from transformers' own forward and by
lm-evaluation-harness, the calibration metrics against hand-computed ones, the Hessian over the
adapter against a dense float64 one, the largest vocabulary-wide tensor counted; tiny Llama- and
Qwen2-style models from configs with a tokenizer trained here."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from choice_builders import (  # noqa: E402
    QUESTIONS,
    hand_log_likelihoods,
    pair_tokens,
    save_causal_lm,
    save_causal_lora,
    write_questions,
)

from curvcal.load.checkpoint import load_model  # noqa: E402
from curvcal.load.data import load_dataset  # noqa: E402
from curvcal.load.datasets.batches import iter_batches  # noqa: E402
from curvcal.load.texts.text import text_model_of  # noqa: E402
from curvcal.settings.checkpoint import CheckpointSettings  # noqa: E402
from curvcal.settings.data import DataSettings  # noqa: E402

Question = tuple[str, list[str], int]


@dataclass(frozen=True)
class ChoiceModels:
    kind: str
    base: Path
    adapter: Path
    jsonl: Path


@pytest.fixture(scope="module", params=("llama", "qwen2"))
def models(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ChoiceModels:
    root = tmp_path_factory.mktemp(f"choices_{request.param}")
    save_causal_lm(root / "base", request.param)
    save_causal_lora(root / "base", root / "adapter")
    return ChoiceModels(
        request.param, root / "base", root / "adapter", write_questions(root / "q.jsonl")
    )


def _library(models: ChoiceModels, adapter: bool) -> Any:
    """transformers' causal LM in float64 (with peft's adapter on it), curvcal not involved."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        models.base, dtype=torch.float64, attn_implementation="eager"
    )
    if adapter:
        model = peft.PeftModel.from_pretrained(model, models.adapter).double()
    return model.eval()


def _tokenizer(models: ChoiceModels) -> Any:
    return transformers.AutoTokenizer.from_pretrained(models.base)


def _hand(
    model: Any, tokenizer: Any, questions: list[Question] | tuple[Question, ...] = QUESTIONS
) -> torch.Tensor:
    with torch.no_grad():
        return hand_log_likelihoods(lambda ids: model(input_ids=ids).logits, tokenizer, questions)


def _scores(path: Path, data: Path, batch_size: int = 3, **options: Any) -> torch.Tensor:
    """curvcal's scores of every row of ``data`` (batches of ``batch_size`` rows)."""
    loaded = load_model(path, CheckpointSettings(device="cpu", dtype="float64"))
    read = load_dataset(DataSettings(data=str(data), **options), None, text_model_of(loaded))
    with torch.no_grad():
        return torch.cat([loaded.module(x) for x, _y in iter_batches(read.dataset, batch_size)])


def _divisors(
    tokenizer: Any, score: str, questions: tuple[Question, ...] = QUESTIONS
) -> torch.Tensor:
    if score == "sum":
        return torch.ones(len(questions), len(questions[0][1]), dtype=torch.float64)
    if score == "mean-char":
        return torch.tensor([[float(len(a)) for a in q[1]] for q in questions], dtype=torch.float64)
    return torch.tensor(
        [[float(len(pair_tokens(tokenizer, q[0], a)[1])) for a in q[1]] for q in questions],
        dtype=torch.float64,
    )


# --- the scores against transformers and lm-evaluation-harness --------------------------------


@pytest.mark.parametrize("adapter", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("score", ["sum", "mean-token", "mean-char"])
def test_scores_equal_log_likelihoods_by_hand(
    models: ChoiceModels, adapter: bool, score: str
) -> None:
    tokenizer = _tokenizer(models)
    expected = _hand(_library(models, adapter), tokenizer) / _divisors(tokenizer, score)
    got = _scores(models.adapter if adapter else models.base, models.jsonl, choice_score=score)
    assert got.shape == (len(QUESTIONS), 3)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)
    assert (got.max(1).values - got.min(1).values > 1e-3).all()  # distinct answers, no ties


@pytest.mark.parametrize("adapter", [False, True], ids=["base", "lora"])
def test_log_likelihoods_equal_lm_evaluation_harness(models: ChoiceModels, adapter: bool) -> None:
    """lm-evaluation-harness's own ``loglikelihood`` on the same model and requests (context,
    ``" " + answer``), as its multiple-choice tasks send them."""
    from lm_eval.api.instance import Instance
    from lm_eval.models import huggingface

    harness = huggingface.HFLM(
        pretrained=_library(models, adapter), tokenizer=_tokenizer(models), backend="causal",
        batch_size=4, device="cpu",
    )  # fmt: skip
    requests = [
        Instance(request_type="loglikelihood", doc={}, arguments=(prompt, " " + answer), idx=k)
        for prompt, answers, _label in QUESTIONS
        for k, answer in enumerate(answers)
    ]
    answered = harness.loglikelihood(requests, disable_tqdm=True)
    expected = torch.tensor([ll for ll, _greedy in answered], dtype=torch.float64)
    got = _scores(models.adapter if adapter else models.base, models.jsonl)
    torch.testing.assert_close(got.reshape(-1), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_label_words_and_a_template(models: ChoiceModels, tmp_path: Path) -> None:
    """``--choices`` gives the answers of every row (labels may be the words), ``--template``
    builds the prompt from the row's columns with ``\\n`` read as a newline."""
    rows = [
        ("the film was great", "positive"),
        ("a dull movie", "negative"),
        ("boring", "negative"),
    ]
    data = tmp_path / "reviews.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    questions = tuple((f"Review: {t}\nSentiment:", ["positive", "negative"], 0) for t, _y in rows)
    expected = _hand(_library(models, False), _tokenizer(models), questions)
    got = _scores(
        models.base, data, choices=("positive", "negative"), template="Review: {text}\\nSentiment:"
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)
    loaded = load_model(models.base, CheckpointSettings(device="cpu"))
    read = load_dataset(
        DataSettings(data=str(data), choices=("positive", "negative"), template="{text}"),
        None,
        text_model_of(loaded),
    )
    assert read.labels.tolist() == [0, 1, 1] and read.num_classes == 2


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_border_rows_empty_prompt_and_a_prompt_cut_to_max_length(
    models: ChoiceModels, tmp_path: Path
) -> None:
    """An empty prompt is the BOS token (the harness's prefix token); a row longer than
    ``--max-length`` keeps its answers and the last tokens of its prompt (as many as the
    longest answer leaves)."""
    tokenizer = _tokenizer(models)
    model = _library(models, False)
    long_prompt = "the story was fine and the acting great, " * 3 + "so it was"
    questions = (("", ["great", "dull"], 0), (long_prompt, ["great", "boring plot"], 1))
    data = write_questions(tmp_path / "border.jsonl", questions)
    max_length = 12
    expected = []
    for prompt, answers, _label in questions:
        row = []
        longest = max(len(pair_tokens(tokenizer, prompt, a)[1]) for a in answers) if prompt else 0
        for answer in answers:
            if prompt:  # the prompt keeps its last max_length - (longest answer) tokens
                context, continuation = pair_tokens(tokenizer, prompt, answer)
                context = context[-(max_length - longest) :]
            else:
                context, continuation = (
                    [tokenizer.bos_token_id],
                    tokenizer(" " + answer, add_special_tokens=False)["input_ids"],
                )
            with torch.no_grad():
                log_probs = torch.log_softmax(
                    model(input_ids=torch.tensor([context + continuation])).logits[0], -1
                )
            row.append(sum(log_probs[len(context) - 1 + i, t] for i, t in enumerate(continuation)))
        expected.append(torch.stack(row))
    got = _scores(models.base, data, max_length=max_length)
    torch.testing.assert_close(got, torch.stack(expected), rtol=0, atol=1e-7)
    loaded = load_model(models.base, CheckpointSettings(device="cpu"))
    read = load_dataset(
        DataSettings(data=str(data), max_length=max_length), None, text_model_of(loaded)
    )
    assert read.text is not None and read.text["truncated"] == 1


# --- memory: no prompt x vocabulary tensor ------------------------------------------------------


class _Sizes(torch.utils._python_dispatch.TorchDispatchMode):
    """Every tensor an operator returns, by shape."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, tuple | list) else (out,):
            if isinstance(value, torch.Tensor):
                self.shapes.append(tuple(value.shape))
        return out


def _widest(shapes: list[tuple[int, ...]], vocabulary: int, hidden: int) -> int:
    """The most elements of a tensor with a vocabulary-wide dimension, the weight-shaped ones
    (vocabulary x hidden: the embedding, the head, their gradients) left out."""
    weights = {(vocabulary, hidden), (hidden, vocabulary)}
    return max((math.prod(s) for s in shapes if vocabulary in s and s not in weights), default=0)


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_no_tensor_of_prompt_tokens_by_vocabulary(models: ChoiceModels, tmp_path: Path) -> None:
    """A forward and a gradient pass of the scorer allocate no vocabulary-wide tensor larger
    than B x (most answer tokens in a row) x V; the library's own forward on the same packed rows,
    which the count must catch, makes one of (all tokens) x V."""
    loaded = load_model(models.adapter, CheckpointSettings(device="cpu"))
    long = tuple((" ".join([prompt] * 4), answers, label) for prompt, answers, label in QUESTIONS)
    data = write_questions(tmp_path / "long.jsonl", long)
    read = load_dataset(DataSettings(data=str(data), max_length=64), None, text_model_of(loaded))
    x, y = next(iter_batches(read.dataset, len(QUESTIONS)))
    library = loaded.module.__dict__["library_model"]
    config = library.get_base_model().config
    vocabulary, hidden = config.vocab_size, config.hidden_size
    answer_slots = x["choice_of"].numel()  # B x (most answer tokens in a row)
    all_tokens = x["input_ids"].numel()
    assert answer_slots * 2 < all_tokens  # the prompts are most of the tokens
    with _Sizes() as scorer:
        loss = torch.nn.functional.cross_entropy(loaded.module(x), y)
        loss.backward()
    assert _widest(scorer.shapes, vocabulary, hidden) == answer_slots * vocabulary
    with torch.no_grad(), _Sizes() as plain:
        library(input_ids=x["input_ids"])
    assert _widest(plain.shapes, vocabulary, hidden) >= all_tokens * vocabulary


def test_the_prompt_is_read_once_for_all_answers(models: ChoiceModels) -> None:
    """A packed row holds its prompt once and each answer's tokens but the last: its length is
    P + sum_k (n_k - 1), not K P + sum_k n_k."""
    loaded = load_model(models.base, CheckpointSettings(device="cpu"))
    read = load_dataset(DataSettings(data=str(models.jsonl)), None, text_model_of(loaded))
    tokenizer = _tokenizer(models)
    for index, (prompt, answers, _label) in enumerate(QUESTIONS):
        x, _y = next(iter_batches(read.dataset, 1, [index]))
        pairs = [pair_tokens(tokenizer, prompt, answer) for answer in answers]
        assert all(context == pairs[0][0] for context, _ in pairs)
        expected = len(pairs[0][0]) + sum(len(continuation) - 1 for _, continuation in pairs)
        assert x["input_ids"].shape == (1, expected)


# --- the commands: calibration by hand, the Hessian against a dense one -----------------------


def _more_questions() -> tuple[Question, ...]:
    """:data:`QUESTIONS` with their answers in three orders (21 rows, labels 0, 1 and 2)."""
    out = []
    for shift in range(3):
        for prompt, answers, label in QUESTIONS:
            out.append((prompt, answers[shift:] + answers[:shift], (label - shift) % 3))
    return tuple(out)


def _ece(logits: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    """Top-label ECE with equal-width bins (m/M, (m+1)/M], confidence 0 in the first."""
    probabilities = torch.softmax(logits, 1)
    confidence, prediction = probabilities.max(1)
    correct = (prediction == labels).double()
    total = 0.0
    for m in range(bins):
        inside = (confidence > m / bins) & (confidence <= (m + 1) / bins)
        if m == 0:
            inside |= confidence == 0
        if inside.any():
            gap = correct[inside].mean() - confidence[inside].mean()
            total += float(inside.sum()) / len(labels) * abs(float(gap))
    return total


def _nll(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits, labels))


def _temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """argmin over T of the NLL of softmax(z / T): ternary search on log T (the NLL is convex
    in 1/T, so unimodal in log T)."""
    low, high = math.log(0.01), math.log(100.0)
    for _ in range(200):
        a, b = low + (high - low) / 3, high - (high - low) / 3
        if _nll(logits / math.exp(a), labels) < _nll(logits / math.exp(b), labels):
            high = b
        else:
            low = a
    return math.exp((low + high) / 2)


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_calibrate_and_metrics_equal_hand_computed_ones(
    run_cli: Callable[..., Any], models: ChoiceModels, tmp_path: Path
) -> None:
    model, tokenizer = _library(models, True), _tokenizer(models)
    # labels the model gets right two times in three: a fit temperature inside its bracket
    predicted = _hand(model, tokenizer, _more_questions()).argmax(1).tolist()
    questions = tuple(
        (prompt, answers, predicted[i] if i % 3 else (predicted[i] + 1) % 3)
        for i, (prompt, answers, _label) in enumerate(_more_questions())
    )
    fit, evaluation = questions[::2], questions[1::2]
    fit_file = write_questions(tmp_path / "fit.jsonl", fit)
    eval_file = write_questions(tmp_path / "eval.jsonl", evaluation)
    saved = tmp_path / "scores.npz"
    result = run_cli(
        "calibrate", models.adapter, "--fit-data", fit_file, "--data", eval_file, "--method",
        "ts", "--dtype", "float64", "--device", "cpu", "--save-logits", saved, "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    fit_scores, eval_scores = _hand(model, tokenizer, fit), _hand(model, tokenizer, evaluation)
    fit_labels = torch.tensor([q[2] for q in fit])
    eval_labels = torch.tensor([q[2] for q in evaluation])
    import numpy as np

    with np.load(saved) as arrays:
        torch.testing.assert_close(
            torch.from_numpy(arrays["logits"]), eval_scores, rtol=0, atol=1e-7
        )
        assert arrays["labels"].tolist() == eval_labels.tolist()
    before = document["results"]["evaluation"]["uncalibrated"]
    assert before["ece"] == pytest.approx(_ece(eval_scores, eval_labels), abs=1e-7)
    assert before["nll"] == pytest.approx(_nll(eval_scores, eval_labels), rel=1e-7)
    assert before["accuracy"] == pytest.approx(
        float((eval_scores.argmax(1) == eval_labels).double().mean())
    )
    temperature = _temperature(fit_scores, fit_labels)
    assert 0.01 * 1.01 < temperature < 100 / 1.01  # inside the bracket: a real fit
    fitted = document["results"]["fits"]["ts"]["temperature"]
    assert fitted == pytest.approx(temperature, rel=1e-4)
    after = document["results"]["evaluation"]["ts"]
    assert after["nll"] == pytest.approx(_nll(eval_scores / fitted, eval_labels), rel=1e-7)
    assert after["ece"] == pytest.approx(_ece(eval_scores / fitted, eval_labels), abs=1e-7)
    assert document["settings"]["data"]["choice_score"] == "sum"
    text = document["inputs"]["data"]["text"]
    assert text["n_choices"] == 3 and text["choice_score"] == "sum"
    said = " ".join(document["inputs"]["data"]["transforms"])
    assert "summed log-likelihood of its tokens after the prompt" in said
    metrics = run_cli("metrics", saved, "--json")
    assert metrics.code == 0, metrics.stderr
    assert json.loads(metrics.stdout)["results"]["evaluation"]["uncalibrated"][
        "ece"
    ] == pytest.approx(_ece(eval_scores, eval_labels), abs=1e-6)


def test_hessian_over_the_adapter_equals_a_dense_float64_one(
    run_cli: Callable[..., Any], models: ChoiceModels
) -> None:
    """The mean cross-entropy over the K scores, its Hessian over the adapter's LoRA matrices
    built densely by ``torch.autograd.functional.hessian`` from the library's token
    log-probabilities (full-vocabulary logits, one forward per answer)."""
    model, tokenizer = _library(models, True), _tokenizer(models)
    chosen = {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}
    shapes = [(n, p.shape, p.numel()) for n, p in chosen.items()]
    labels = torch.tensor([q[2] for q in QUESTIONS])

    def loss(vector: torch.Tensor) -> torch.Tensor:
        params, start = {}, 0
        for name, shape, count in shapes:
            params[name] = vector[start : start + count].reshape(shape)
            start += count

        def logits_of(ids: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(
                model, params, args=(), kwargs={"input_ids": ids}
            ).logits

        scores = hand_log_likelihoods(logits_of, tokenizer, QUESTIONS)
        return torch.nn.functional.cross_entropy(scores, labels)

    flat = torch.cat([p.reshape(-1) for p in chosen.values()])
    dense = torch.autograd.functional.hessian(loss, flat)
    exact = torch.linalg.eigvalsh(dense)
    result = run_cli(
        "hessian", models.adapter, "--data", models.jsonl, "--dtype", "float64", "--device",
        "cpu", "--top-k", "2", "--tol", "1e-10", "--batch-size", "3", "--json", "--no-trace",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["results"]["eigenvalues"] == pytest.approx(
        exact[-2:].flip(0).tolist(), rel=1e-6
    )
    operator = document["results"]["operator"]
    assert operator["n_params"] == dense.shape[0]
    assert operator["mean_loss"] == pytest.approx(float(loss(flat)), rel=1e-8)
    assert all("lora_" in name for name in operator["params"])


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_gauss_newton_over_the_head_equals_a_dense_one(
    run_cli: Callable[..., Any], models: ChoiceModels
) -> None:
    """The Gauss-Newton matrix (1/N) sum_n J_n^T (diag p_n - p_n p_n^T) J_n of the K scores over
    the language-model head (applied at answer positions only, so the per-sample engines must
    keep each row's answers together): its trace and largest eigenvalue against the Jacobian
    of the hand-computed scores, through the small N K x N K Gram matrix."""
    model, tokenizer = _library(models, False), _tokenizer(models)
    weight = model.lm_head.weight.detach()

    def scores(head: torch.Tensor) -> torch.Tensor:
        def logits_of(ids: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(
                model, {"lm_head.weight": head}, args=(), kwargs={"input_ids": ids}
            ).logits

        return hand_log_likelihoods(logits_of, tokenizer, QUESTIONS)

    z = scores(weight).detach()
    jacobian = torch.autograd.functional.jacobian(scores, weight).reshape(*z.shape, -1)
    p = torch.softmax(z, 1)
    n = len(QUESTIONS)
    factors = []
    for row in range(n):  # H_n^(1/2) J_n / sqrt(N)
        curvature = torch.diag(p[row]) - torch.outer(p[row], p[row])
        values, vectors = torch.linalg.eigh(curvature)
        root = vectors @ torch.diag(values.clamp(min=0).sqrt()) @ vectors.T
        factors.append(root @ jacobian[row] / math.sqrt(n))
    stacked = torch.cat(factors)  # (N K, P): the Gauss-Newton matrix is stacked^T stacked
    gram = stacked @ stacked.T
    result = run_cli(
        "hessian", models.base, "--data", models.jsonl, "--dtype", "float64", "--device", "cpu",
        "--curvature", "ggn", "--params", "lm_head.*", "--top-k", "1", "--tol", "1e-10",
        "--batch-size", "3", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)["results"]
    assert document["trace"]["estimate"] == pytest.approx(float(gram.trace()), rel=1e-7)
    assert document["eigenvalues"][0] == pytest.approx(
        float(torch.linalg.eigvalsh(gram)[-1]), rel=1e-6
    )


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_check_gates_and_study_compares_the_base_and_its_adapter(
    run_cli: Callable[..., Any], models: ChoiceModels, tmp_path: Path
) -> None:
    """A policy names the multiple-choice data and the score; ``check`` gates the adapter's
    accuracy (the hand-computed one of its mean-char scores) and λmax; ``study`` measures the
    base and the adapter on the same rows."""
    tokenizer = _tokenizer(models)
    scores = _hand(_library(models, True), tokenizer) / _divisors(tokenizer, "mean-char")
    labels = torch.tensor([q[2] for q in QUESTIONS])
    accuracy = float((scores.argmax(1) == labels).double().mean())
    policy = tmp_path / "gate.toml"
    policy.write_text(
        f'[settings]\ndata = "{models.jsonl}"\nchoice_score = "mean-char"\ndevice = "cpu"\n'
        f'dtype = "float64"\n\n[accuracy]\nmin = {accuracy + 0.01}\n\n[lambda_max]\nmax = 1000\n'
    )
    result = run_cli("check", models.adapter, "--policy", policy, "--json")
    assert result.code == 1, result.stderr  # the accuracy bound is just above the model's
    document = json.loads(result.stdout)
    rows = {row["metric"]: row for row in document["results"]["rows"]}
    assert rows["accuracy"]["value"] == pytest.approx(accuracy)
    assert rows["lambda_max"]["passed"] is True
    assert document["settings"]["data"]["choice_score"] == "mean-char"
    study = run_cli("study", models.base, models.adapter, "--data", models.jsonl, "--json")
    assert study.code == 0, study.stderr
    assert len(json.loads(study.stdout)["results"]["rows"]) == 2


# --- refusals ---------------------------------------------------------------------------------


def _rows(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


BAD_ROWS = {
    "another K": (
        [
            {"prompt": "a", "choices": ["x", "y"], "label": 0},
            {"prompt": "b", "choices": ["x", "y", "z"], "label": 0},
        ],
        ("row 1 has 3 answers, row 0 has 2", "the same number K"),
    ),
    "label past K": (
        [
            {"prompt": "a", "choices": ["x", "y"], "label": 0},
            {"prompt": "b", "choices": ["x", "y"], "label": 2},
        ],
        ("row 1: label 2 in column 'label'", "one of its 2 answers (0 to 1)"),
    ),
    "not a list": (
        [{"prompt": "a", "choices": "x y", "label": 0}],
        ("row 0: column 'choices' is not a list of answers",),
    ),
    "one answer": (
        [{"prompt": "a", "choices": ["x"], "label": 0}],
        ("row 0: 1 answer; a choice needs at least two",),
    ),
    "texts, not choices": (
        [{"text": "the film was great", "label": 0}],
        (
            "has no column 'prompt'",
            "a causal language model scores multiple-choice rows",
            "--template",
        ),
    ),
}


@pytest.mark.parametrize("models", ["llama"], indirect=True)
@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_rows_are_one_line_naming_the_file_and_row(
    run_cli: Callable[..., Any], models: ChoiceModels, tmp_path: Path, case: str
) -> None:
    from tests.console_text import said

    rows, phrases = BAD_ROWS[case]
    data = _rows(tmp_path, rows)
    result = run_cli(
        "calibrate", models.base, "--data", data, "--method", "none", "--device", "cpu"
    )
    assert result.code == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert said(str(data.name), result.stderr)
    for phrase in phrases:
        assert said(phrase, result.stderr), (phrase, result.stderr)


def test_choice_options_for_a_sequence_classifier_are_refused(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    from hf_decoder_builders import save_decoder, write_reviews

    from tests.console_text import said

    folder = save_decoder(tmp_path / "clf", "llama")
    data = write_reviews(tmp_path / "r.jsonl")
    result = run_cli("calibrate", folder, "--data", data, "--method", "none", "--choices", "a,b")
    assert result.code == 2 and "Traceback" not in result.stderr
    assert said("--choices: applies to multiple-choice data", result.stderr), result.stderr
    bad = run_cli("calibrate", folder, "--data", data, "--method", "none", "--choices", "a")
    assert bad.code == 2 and said("two or more non-empty answers", bad.stderr), bad.stderr


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_an_empty_answer_and_bad_policy_words_are_refused(
    run_cli: Callable[..., Any], models: ChoiceModels, tmp_path: Path
) -> None:
    from tests.console_text import said

    data = _rows(tmp_path, [{"prompt": "a film", "choices": ["", "great"], "label": 1}])
    result = run_cli(
        "calibrate", models.base, "--data", data, "--method", "none", "--choice-delimiter", ""
    )
    assert result.code == 2 and "Traceback" not in result.stderr
    # empty, it is refused as the rows are read (it would add no token to its prompt)
    assert said("row 0: answer 0 ('') is empty", result.stderr), result.stderr
    policy = tmp_path / "p.toml"
    policy.write_text(
        f'[settings]\ndata = "{models.jsonl}"\nchoices = ["yes"]\n\n[accuracy]\nmin = 0\n'
    )
    refused = run_cli("check", models.base, "--policy", policy)
    assert refused.code == 2 and "Traceback" not in refused.stderr
    assert said("are not two or more different, non-empty answers", refused.stderr), refused.stderr


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_csv_rows_hold_their_answers_as_json_arrays(models: ChoiceModels, tmp_path: Path) -> None:
    import csv

    data = tmp_path / "q.csv"
    with data.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "choices", "label"])
        for prompt, answers, label in QUESTIONS:
            writer.writerow([prompt, json.dumps(answers), str(label)])
    expected = _scores(models.base, models.jsonl)
    torch.testing.assert_close(_scores(models.base, data), expected, rtol=0, atol=0)


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_a_prompt_learning_adapter_is_refused(
    run_cli: Callable[..., Any], models: ChoiceModels, tmp_path: Path
) -> None:
    """Prompt tuning adds virtual tokens to the inputs, which the decoder alone never sees."""
    from tests.console_text import said

    base = transformers.AutoModelForCausalLM.from_pretrained(models.base)
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    folder = tmp_path / "prompt"
    peft.get_peft_model(base, config).save_pretrained(folder)
    result = run_cli("calibrate", folder, "--data", models.jsonl, "--method", "none")
    assert result.code == 2 and "Traceback" not in result.stderr, result.stderr
    assert said("adds virtual tokens to the inputs", result.stderr), result.stderr


@pytest.mark.parametrize("models", ["llama"], indirect=True)
def test_inspect_names_no_class_count_for_a_causal_lm(
    run_cli: Callable[..., Any], models: ChoiceModels
) -> None:
    """K is the data's answer count: no class count read off the last weight (the vocabulary's
    or the MLP's rows)."""
    result = run_cli("inspect", models.base, "--json")
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)["results"]
    assert document["num_classes"] is None
    assert "multiple-choice" in document["metadata"]["scores"]
    loaded = load_model(models.base, CheckpointSettings(device="cpu"))
    assert loaded.num_classes is None and loaded.labels == ()
