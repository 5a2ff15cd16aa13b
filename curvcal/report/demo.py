"""The demo's own table: accuracy and mean confidence on the held-out digits."""

from __future__ import annotations

from curvcal.report.tables import Table, fmt_float


def digits_table(n_samples: int, accuracy: float, confidence: float) -> Table:
    """Samples, top-1 accuracy and mean confidence, with a caption saying which way the model
    leans (over- or under-confident on average)."""
    return Table(
        title="held-out digits",
        columns=("quantity", "value"),
        rows=(
            ("samples", str(n_samples)),
            ("accuracy", fmt_float(accuracy)),
            ("mean confidence", fmt_float(confidence)),
        ),
        caption=_confidence_caption(accuracy, confidence),
    )


def _confidence_caption(accuracy: float, mean_confidence: float) -> str:
    if mean_confidence > accuracy:
        return "mean confidence above accuracy: over-confident on average"
    if mean_confidence < accuracy:
        return "mean confidence below accuracy: under-confident on average"
    return "mean confidence equals accuracy"
