"""How close the Hessian run's forecast comes to the time it took, on three models.

For each model the analysis runs with a progress hook on the real clock; after the first five
products the forecast of the time left is (products planned − products done) × (seconds per
product since the first report), :class:`curvcal.pace.Pace` exactly as the progress bar
computes it. The table compares it with the time the run then took, and the whole-run
forecast (planned × seconds per product) with the analysis's measured time after its first
product. Models: the bundled digits CNN on 200 digits, a torchvision ResNet-18 with random
weights on 64 random 3×64×64 images, and a two-layer transformer encoder on 128 random token
sequences; the first columns take the forecast at the first report past a tenth of the products
the run made, with the range the progress line shows and whether it held the time taken.

    python benchmarks/bench_forecast.py [MODEL-NAME-PART ...]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from curvcal.curvature.analysis import HessianSettings, analyse_batches
from curvcal.curvature.forecast import FORECAST_PRODUCTS, planned_by_stage
from curvcal.curvature.plan import selected_parameter_count
from curvcal.pace import Pace


def _digits() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    from safetensors.torch import load_file

    from curvcal.assets import _asset
    from curvcal.models import DigitsCNN

    model = DigitsCNN().eval()
    model.load_state_dict(load_file(str(_asset("digits_cnn.safetensors"))))
    data = load_file(str(_asset("digits_test.safetensors")))
    x = (data["x"][:200] / 16 - 0.3047) / 0.3758  # the checkpoint's recorded normalisation
    y = data["y"][:200]
    return model, [(x[:100], y[:100]), (x[100:], y[100:])]


def _resnet18() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval()
    x = torch.randn(64, 3, 64, 64)
    y = torch.randint(0, 10, (64,))
    return model, [(x, y)]


class _Encoder(nn.Module):
    def __init__(self, vocab: int = 100, width: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def _transformer() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = _Encoder().eval()
    x = torch.randint(0, 100, (128, 16))
    y = torch.randint(0, 4, (128,))
    return model, [(x[:64], y[:64]), (x[64:], y[64:])]


MODELS: dict[str, tuple[Callable[[], tuple[nn.Module, list]], HessianSettings]] = {
    "digits CNN, defaults (λ1, Gauss–Newton trace)": (_digits, HessianSettings()),
    "digits CNN, top-3 by power iteration": (
        _digits,
        HessianSettings(top_k=3, method="power", trace=False),
    ),
    "digits CNN": (
        _digits,
        HessianSettings(
            top_k=3,
            trace_method="hutchinson",
            probes=30,
            density=True,
            density_runs=2,
            density_steps=20,
        ),
    ),
    "ResNet-18 defaults (random, 64 × 3×64×64; λ1, Gauss–Newton trace)": (
        _resnet18,
        HessianSettings(),
    ),
    "ResNet-18 (random, 64 × 3×64×64)": (
        _resnet18,
        HessianSettings(top_k=1, trace_method="hutchinson", probes=20),
    ),
    "transformer (2 layers, 128 × 16 tokens), --per-layer": (
        _transformer,
        HessianSettings(top_k=2, trace_method="hutchinson", probes=20, per_layer=True),
    ),
    "transformer (2 layers, 128 × 16 tokens), whole model": (
        _transformer,
        HessianSettings(top_k=2, trace_method="hutchinson", probes=60),
    ),
}


def measure(model: nn.Module, batches: list, settings: HessianSettings) -> dict[str, float]:
    """The progress count as ``curvcal hessian`` keeps it (:func:`forecast_for`'s revised plan
    and typical part, :class:`Pace` restarted at each stage), sampled at every report; then at
    the first report past a tenth of the products the run made, and at the fifth product of the
    run and of its last stage: the forecast of the time left (the point estimate and the range
    shown) against the time the run then took."""
    from curvcal.curvature.forecast import forecast_for

    hook, replan, planned, typical = forecast_for(model, settings, lambda _note: None)
    pace = Pace(planned(), time.monotonic, *typical())
    marks: dict[str, tuple[float, float]] = {}  # label: (time, forecast of the time left)
    stage_start: dict[str, int] = {}
    current = [""]
    # (done, time, left, text, range)
    samples: list[tuple[int, float, float | None, str, tuple[float, float | None] | None]] = []

    def on_step(stage: str, done: int) -> None:
        hook(stage, done)
        if stage != current[0]:
            current[0] = stage
            stage_start.setdefault(stage, done)
            pace.restart()
        pace.plan(planned(), *typical())
        pace.update(done)
        left = pace.remaining()
        samples.append((done, time.monotonic(), left, pace.text(), pace.remaining_range()))
        if left is None:
            return
        if "first" not in marks and done >= FORECAST_PRODUCTS:
            marks["first"] = (time.monotonic(), left)
        if done - stage_start[stage] >= FORECAST_PRODUCTS:
            marks.setdefault(stage, (time.monotonic(), left))

    def on_plan(resolved: HessianSettings) -> None:
        replan(resolved)
        pace.plan(planned(), *typical())

    analysis = analyse_batches(model, batches, settings, on_step=on_step, on_plan=on_plan)
    end = time.monotonic()
    marks.setdefault("first", (end, 0.0))
    last = ([stage for stage in stage_start if stage in marks] or ["first"])[-1]
    made = int(analysis.operator["n_matvecs"])
    # a tenth of the work: the first report at or past 10% of the products the run made
    tenth = next(s for s in samples if s[0] >= max(1, made // 10) and s[2] is not None)
    return {
        "left 10%": tenth[2] or 0.0,
        "took 10%": end - tenth[1],
        "text 10%": tenth[3],  # type: ignore[dict-item]
        "in range 10%": _holds(tenth[4], end - tenth[1]),  # type: ignore[dict-item]
        "planned": float(planned_products_of(settings, model)),
        "made": float(made),
        "left": marks["first"][1],
        "took": end - marks["first"][0],
        "last stage": last,  # type: ignore[dict-item]
        "left last": marks[last][1],
        "took last": end - marks[last][0],
    }


def _holds(span: tuple[float, float | None] | None, took: float) -> str:
    """Whether the range shown held the time the run took (``-``: no range was shown)."""
    if span is None:
        return "-"
    low, high = span
    return "yes" if low <= took and (high is None or took <= high) else "no"


def planned_products_of(settings: HessianSettings, model: nn.Module) -> int:
    """The products planned before the run (as its first progress line counts them)."""
    n_params = selected_parameter_count(model, settings.params)
    blocks = {n.rpartition(".")[0] for n, p in model.named_parameters() if p.requires_grad}
    return sum(planned_by_stage(settings, n_params, len(blocks)).values())


def main() -> None:
    import sys

    torch.set_num_threads(1)
    chosen = sys.argv[1:] or list(MODELS)
    print("| model | planned | made | at 10% of the products: forecast left (shown) | took "
          "| ratio | range holds it | at 5 products: forecast left | took | ratio "
          "| at 5 into the last stage: forecast left | took | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for name, (build, settings) in MODELS.items():
        if not any(key in name for key in chosen):
            continue
        model, batches = build()
        m = measure(model, batches, settings)
        print(
            f"| {name} | {m['planned']:.0f} | {m['made']:.0f} | {m['left 10%']:.1f} s "
            f"({m['text 10%']}) | {m['took 10%']:.1f} s | {m['left 10%'] / m['took 10%']:.2f} "
            f"| {m['in range 10%']} "
            f"| {m['left']:.1f} s "
            f"| {m['took']:.1f} s | {m['left'] / m['took']:.2f} | {m['last stage']}: "
            f"{m['left last']:.1f} s | {m['took last']:.1f} s "
            f"| {m['left last'] / m['took last']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
