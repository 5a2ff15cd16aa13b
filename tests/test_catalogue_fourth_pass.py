"""Holes a fourth adversarial pass found in the public Python API, each fixed where every call
goes through it:

- a batch that is no ``(inputs, labels)`` pair reached Python's tuple unpacking: a dataset of
  3-tuples, a string, or one ``(x, y)`` pair of NumPy arrays was ``ValueError: too many values
  to unpack`` from ``hessian_eigenvalues`` and friends. A meta tensor or a sparse one (inputs,
  labels or scores) was torch's ``NotImplementedError`` from ``hessian_*``, ``predict``,
  ``calibration_metrics``, ``fit_temperature`` and ``apply_temperature``. One function says
  why an item is not a batch (:func:`curvcal.rows.batch_problem`) and why a tensor holds no
  readable values (:func:`curvcal.rows.tensor_problem`); the operator's batches, ``predict``
  and every calibration input go through them;
- a seed that is no 64-bit integer (``seed="a"``, ``1.5``, ``2**70``) reached torch's generator:
  ``RuntimeError: manual_seed expected a long`` or ``ValueError: Overflow``; in the calibration
  intervals a string seed was multiplied (``"a" * 2654435761``). Every seed now reaches torch
  through :func:`curvcal.seeds.seeded_generator`, a :class:`SettingsError` naming ``seed``;
- ``FittedMap.save(5)`` and ``curvcal.load_map(None)`` were ``TypeError: expected str, bytes
  or os.PathLike object``; a path argument now goes through one check naming it
  (:func:`curvcal.paths.path_argument`);
- labels outside [0, K) reached the loss inside the first Hessian product: ``IndexError:
  Target 5 is out of bounds`` on the CPU, a device-side assert that leaves the device unusable
  on CUDA. The command line checks labels against the model; from Python nothing did. The
  batches now read the labels' range once, and the operator compares it with the model's
  output width (one forward of the first batch) for curvcal's own losses; a loss of the
  user's own may read labels as it likes;
- ``model="m"`` or ``None`` (also to ``hutchinson_trace_penalty``) was ``AttributeError: 'str' object has no attribute
  'parameters'``, ``settings={"probes": 3}`` an ``AttributeError`` too, and ``k="2"`` a
  ``TypeError`` from sizing the Lanczos basis before ``k`` was checked;
- the training callbacks (Lightning's ``CurvatureCallback``, Hugging Face's
  ``CurvatureTrainerCallback``) were built with ``bins=0``, ``edges="x"``, ``prefix=5``,
  ``loader=None``, a one-shot generator or ``model="x"`` and failed only at their first
  measurement, an epoch into training; ``curvcal.training.measure`` with ``quantities=5`` or a
  model ``"m"`` was a ``TypeError``/``AttributeError``. One check of every callback argument
  runs when the callback is built (:func:`curvcal.training.measurement.check_callback`);
- ``curvcal landscape --radius 1e30``: the far points' logits overflow, and the ECE of them
  stopped the run with "scores: logits contain NaN or infinity", exit 2, naming no option of
  the command. A point whose logits are not finite now has NaN accuracy and ECE (its loss is
  NaN already), shown in the table and listed in the JSON's ``nonfinite``, as every other
  non-finite result is;
- ``curvcal.apply_temperature(z, "abc")`` was ``ValueError: could not convert string to
  float``, ``None`` a ``TypeError``, ``True`` and ``"2"`` were read as 1 and 2, and a NaN
  temperature was refused naming ``calibrator``, no argument of the call. The temperature and
  γ of ``apply_temperature``/``apply_focal_temperature`` are now real numbers checked naming
  their argument;
- ``curvcal.focal_loss`` took float labels (2.7 read as 2), and labels outside [0, K), NumPy
  arrays and complex logits were torch's own errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import curvcal
from curvcal.errors import InputError, SettingsError


@pytest.fixture
def linear() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3).double()
    return model, torch.randn(12, 4, dtype=torch.float64), torch.randint(0, 3, (12,))


def _meta(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device="meta")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (lambda x, y: [(x, y, y)], "got a tuple of 3"),
        (lambda x, y: "abc", "got a str"),
        (lambda x, y: (x.numpy(), y.numpy()), "got a ndarray"),
        (lambda x, y: [(x.numpy(), y)], "torch.from_numpy"),
        (lambda x, y: [(x, y.numpy())], "the labels must be a tensor"),
        (lambda x, y: (_meta(x), y), "meta tensor"),
        (lambda x, y: (x, _meta(y)), "the labels tensor is a meta tensor"),
        (lambda x, y: (x.to_sparse(), y), "layout torch.sparse_coo"),
        (lambda x, y: ({"x": x.to_sparse()}, y), "input 'x' has layout"),
    ],
    ids=[
        "3-tuples",
        "str",
        "numpy-pair",
        "numpy-x",
        "numpy-y",
        "meta-x",
        "meta-y",
        "sparse",
        "map",
    ],
)
def test_a_batch_that_is_no_pair_of_readable_tensors_is_named(linear, data, words) -> None:
    model, x, y = linear
    with pytest.raises(InputError, match=r"^batches\[0\]: ") as caught:
        curvcal.hessian_eigenvalues(model, data(x, y))
    assert words in str(caught.value)
    with pytest.raises(InputError, match=r"^data: batch 0: ") as caught:
        curvcal.predict(model, data(x, y) if not isinstance(data(x, y), str) else [data(x, y)])


@pytest.mark.parametrize("call", ["calibration_metrics", "fit_temperature", "fit_map"])
@pytest.mark.parametrize("which", ["meta", "sparse"])
def test_scores_without_readable_values_are_named(call: str, which: str) -> None:
    torch.manual_seed(0)
    z, y = torch.randn(30, 3, dtype=torch.float64), torch.randint(0, 3, (30,))
    bad = _meta(z) if which == "meta" else z.to_sparse()
    arguments = ("ts", bad, y) if call == "fit_map" else (bad, y)
    with pytest.raises(InputError, match=r"^scores: the tensor (is a meta|has layout)"):
        getattr(curvcal, call)(*arguments)
    with pytest.raises(InputError, match=r"^labels: the tensor (is a meta|has layout)"):
        curvcal.calibration_metrics(z, _meta(y) if which == "meta" else y.to_sparse())
    with pytest.raises(InputError, match=r"^scores: the tensor"):
        curvcal.apply_temperature(bad, 2.0)


@pytest.mark.parametrize("seed", ["a", 1.5, 2**70, True], ids=["str", "float", "huge", "bool"])
def test_a_seed_that_is_no_64_bit_integer_is_a_settings_error(linear, seed) -> None:
    model, x, y = linear
    with pytest.raises(SettingsError, match=r"^seed: must "):
        curvcal.hessian_eigenvalues(model, (x, y), seed=seed)
    with pytest.raises(SettingsError, match=r"^seed: must "):
        curvcal.hessian_trace(model, (x, y), probes=3, trace_method="hutchinson", seed=seed)
    with pytest.raises(SettingsError, match=r"^seed: must "):
        curvcal.hessian_density(model, (x, y), runs=1, steps=3, seed=seed)
    z = torch.randn(30, 3, dtype=torch.float64)
    with pytest.raises(SettingsError, match=r"^seed: must "):
        curvcal.calibration_metrics(z, torch.randint(0, 3, (30,)), bootstrap=10, seed=seed)


def test_a_numpy_integer_seed_is_the_same_seed(linear) -> None:
    model, x, y = linear
    ours = curvcal.hessian_trace(model, (x, y), probes=4, trace_method="hutchinson", seed=3)
    numpy = curvcal.hessian_trace(
        model, (x, y), probes=4, trace_method="hutchinson", seed=np.int64(3)
    )
    assert numpy.estimate == ours.estimate


@pytest.mark.parametrize("model", ["m", None, 5])
def test_a_model_that_is_no_module_is_named(linear, model) -> None:
    _, x, y = linear
    for call in (curvcal.hessian_eigenvalues, curvcal.hessian_operator, curvcal.HessianOperator):
        with pytest.raises(InputError, match=r"^model: expected a torch.nn.Module"):
            call(model, (x, y))


@pytest.mark.parametrize("settings", [{"probes": 3}, "x", 5])
def test_settings_that_are_no_hessian_settings_are_named(linear, settings) -> None:
    model, x, y = linear
    with pytest.raises(InputError, match=r"^settings: expected a HessianSettings"):
        curvcal.hessian_eigenvalues(model, (x, y), settings=settings)


@pytest.mark.parametrize("k", ["2", None, 2.0])
def test_k_is_checked_before_the_basis_is_sized_from_it(linear, k) -> None:
    model, x, y = linear
    with pytest.raises(InputError, match=r"^k: the number of eigenvalues must be"):
        curvcal.hessian_eigenvalues(model, (x, y), k=k, memory_budget="1MB")


@pytest.mark.parametrize(
    ("logits", "labels", "pattern"),
    [
        (torch.zeros(4, 3), torch.tensor([0, 1, 2, 3]), r"^labels: must lie in \[0, 3\)"),
        (torch.zeros(4, 3), torch.tensor([0, -1, 2, 1]), r"^labels: must lie in \[0, 3\)"),
        (torch.zeros(4, 3), torch.tensor([0.0, 2.7, 1.0, 1.0]), r"^labels: must be integers"),
        (np.zeros((4, 3)), torch.tensor([0, 1, 2, 1]), r"^logits: must be a torch tensor"),
        (torch.zeros(4, 3), [0, 1, 2, 1], r"^labels: must be a torch tensor"),
        (torch.zeros(4, 3, dtype=torch.complex64), torch.tensor([0, 1, 2, 1]), r"^logits: must"),
    ],
    ids=["above", "negative", "float", "numpy", "list", "complex"],
)
def test_focal_loss_refuses_labels_and_logits_it_cannot_index(logits, labels, pattern) -> None:
    with pytest.raises(InputError, match=pattern):
        curvcal.focal_loss(logits, labels, 2.0)


def test_focal_loss_of_checked_arguments_is_the_formula() -> None:
    """−(1 − p_y)^γ log p_y by hand, for p = softmax of a hand-picked row."""
    logits = torch.tensor([[0.0, float(np.log(3.0))]], dtype=torch.float64)  # p = (1/4, 3/4)
    value = curvcal.focal_loss(logits, torch.tensor([1]), 2.0)
    assert float(value) == pytest.approx(-((1 - 0.75) ** 2) * np.log(0.75), rel=1e-12)


@pytest.mark.parametrize(
    ("keywords", "pattern"),
    [
        ({"bins": 0}, r"^bins: "),
        ({"edges": "x"}, r"^edges: "),
        ({"prefix": 5}, r"^prefix: must be a string"),
        ({"loader": None}, r"^loader: must be a DataLoader"),
        ({"loader": iter([])}, r"^loader: must be a DataLoader"),
        ({"model": "x"}, r"^model: must be None or a function"),
    ],
    ids=["bins", "edges", "prefix", "none", "iterator", "model"],
)
@pytest.mark.parametrize("callback", ["CurvatureCallback", "CurvatureTrainerCallback"])
def test_a_training_callback_refuses_its_arguments_when_built(linear, callback, keywords, pattern):
    import curvcal.training

    _, x, y = linear
    arguments = {"loader": [(x, y)], **keywords}
    with pytest.raises((InputError, SettingsError), match=pattern):
        getattr(curvcal.training, callback)(**arguments)


@pytest.mark.parametrize(
    ("model", "quantities", "pattern"),
    [
        ("m", ("ece",), r"^model: expected a torch.nn.Module"),
        (None, 5, r"^quantities: must be a name or a sequence of names"),
        (None, None, r"^quantities: must be a name or a sequence of names"),
    ],
)
def test_measure_names_a_model_or_quantities_of_the_wrong_type(linear, model, quantities, pattern):
    from curvcal.training import measure

    network, x, y = linear
    with pytest.raises(InputError, match=pattern):
        measure(network if model is None else model, [(x, y)], quantities)


def test_a_landscape_point_whose_logits_overflow_is_not_finite_not_an_error(linear) -> None:
    from curvcal.calibration.metrics import expected_calibration_error
    from curvcal.curvature.landscape import loss_landscape
    from curvcal.losses import cross_entropy_sum

    model, x, y = linear
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    direction = {name: torch.full_like(p, 10.0) for name, p in model.named_parameters()}
    line = loss_landscape(
        model,
        lambda: iter([(x, y)]),
        cross_entropy_sum,
        [direction],
        [0.0, 1e308],
        ece=lambda logits, labels: expected_calibration_error(logits, labels),
    )
    near, far = line.points
    with torch.no_grad():
        logits = model(x)
    assert near.ece == pytest.approx(expected_calibration_error(logits, y), rel=1e-12)
    assert near.loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)))
    assert np.isnan(far.ece) and np.isnan(far.accuracy) and not np.isfinite(far.loss)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("path", [5, None, b"m.json"], ids=["int", "none", "bytes"])
def test_a_map_path_that_is_no_path_is_named(path, tmp_path) -> None:
    torch.manual_seed(0)
    fitted = curvcal.fit_map("ts", torch.randn(30, 3), torch.randint(0, 3, (30,)))
    with pytest.raises(InputError, match=r"^path: must be a file path"):
        fitted.save(path)
    with pytest.raises(InputError, match=r"^path: must be a file path"):
        curvcal.load_map(path)
    fitted.save(tmp_path / "m.json")  # a pathlib.Path is a path
    z = torch.randn(5, 3)
    assert torch.equal(
        curvcal.load_map(str(tmp_path / "m.json")).probabilities(z), fitted.probabilities(z)
    )


def test_the_trace_penalty_names_a_model_that_is_no_module(linear) -> None:
    model, x, y = linear
    loss = torch.nn.functional.cross_entropy(model(x), y)
    with pytest.raises(InputError, match=r"^model: expected a torch.nn.Module"):
        curvcal.hutchinson_trace_penalty("m", loss, 3, generator=torch.Generator())


@pytest.mark.parametrize("temperature", ["abc", None, True, "2", float("nan"), 0.0], ids=str)
def test_a_temperature_that_is_no_positive_number_is_named(temperature) -> None:
    z = torch.randn(5, 3)
    with pytest.raises(InputError, match=r"^temperature: "):
        curvcal.apply_temperature(z, temperature)
    with pytest.raises(InputError, match=r"^temperature: "):
        curvcal.apply_focal_temperature(z, temperature, 1.0)


@pytest.mark.parametrize("gamma", ["x", None, False, float("nan"), -1.0], ids=str)
def test_a_focal_gamma_that_is_no_number_is_named(gamma) -> None:
    with pytest.raises(InputError, match=r"^gamma: "):
        curvcal.apply_focal_temperature(torch.randn(5, 3), 1.5, gamma)


def test_a_temperature_as_a_one_element_tensor_is_the_number() -> None:
    z = torch.tensor([[0.0, 1.0, 3.0]], dtype=torch.float64)
    expected = torch.log_softmax(z / 2.0, dim=1)
    assert torch.allclose(curvcal.apply_temperature(z, torch.tensor(2.0)), expected, atol=0)


@pytest.mark.parametrize("shift", [3, -1], ids=["above", "negative"])
@pytest.mark.parametrize("loss", ["ce", "focal", "flsd53"])
def test_labels_outside_the_logits_are_named_before_any_product(linear, shift, loss) -> None:
    model, x, y = linear
    labels = y.clone()
    labels[8] = 2 + shift if shift > 0 else shift
    gamma = 2.0 if loss == "focal" else None
    with pytest.raises(InputError, match=r"^batches: labels must lie in \[0, 3\)"):
        curvcal.hessian_operator(model, [(x[:6], y[:6]), (x[6:], labels[6:])], loss, gamma=gamma)
    with pytest.raises(InputError, match=r"^batches: labels must lie in \[0, 3\)"):
        curvcal.hessian_trace(model, (x, labels), probes=4, loss=loss, gamma=gamma)


def test_a_loss_of_the_user_s_own_may_read_labels_otherwise(linear) -> None:
    """A squared error against a regression target coded as labels 0..9: the Hessian of
    (1/N) Σ_i ||W x_i + b − y_i·1||² in W is 2/N Σ x xᵀ per output row (no label term)."""
    model, x, _ = linear
    targets = torch.arange(12) % 10  # beyond the 3 logits

    def squared(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return ((logits - labels[:, None].to(logits.dtype)) ** 2).sum()

    squared.reduction = "sum"  # type: ignore[attr-defined]
    trace = curvcal.hessian_trace(model, (x, targets), loss=squared, trace_method="hutchinson")
    exact = 3 * (2.0 * float((x * x).sum()) / 12 + 2.0)  # weights' and biases' blocks
    assert trace.estimate == pytest.approx(exact, rel=0.3)
