"""What the outputs of a judged run read: the verdict and the provenance around it.

``curvcal check`` and ``curvcal compare`` end with a :class:`~curvcal.policy.evaluate.Verdict`
inside their :class:`~curvcal.results.Report`; :func:`judged_run` takes it from there, with the
names the report records (model, data, baseline and the release it came from), so that every
renderer (markdown, JUnit, GitHub workflow commands, HTML, model card) shows the same rows and
nothing is computed twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from curvcal.policy.evaluate import Verdict, VerdictRow
from curvcal.report.tables import fmt_float
from curvcal.results import Report, to_jsonable

#: the commands whose report holds a verdict
JUDGING_COMMANDS = ("check", "compare")

#: hex digits of a SHA-256 or a commit shown (as the table of what was measured shows them)
SHORT_DIGEST = 12


@dataclass(frozen=True)
class Source:
    """A file a judged run read: ``path`` as given, its SHA-256, and, for a saved report, the
    ``commit`` and ``tag`` of the CI job that made it (empty when unknown)."""

    path: str
    sha256: str = ""
    commit: str = ""
    tag: str = ""

    @property
    def name(self) -> str:
        return PurePath(self.path).name

    def describe(self) -> str:
        """``release.json (tag v1.2, commit 0123456789ab, sha256 …)``: the name and what is
        known of where it came from."""
        known = [
            f"tag {self.tag}" if self.tag else "",
            f"commit {self.commit[:SHORT_DIGEST]}" if self.commit else "",
            f"sha256 {self.sha256[:SHORT_DIGEST]}" if self.sha256 else "",
        ]
        details = ", ".join(part for part in known if part)
        return f"{self.name} ({details})" if details else self.name


@dataclass(frozen=True)
class JudgedRun:
    """A verdict with the names around it: ``command`` (``check``/``compare``), the ``model``
    judged and its role among the inputs (``checkpoint``, or for ``compare`` the ``new``
    report), the ``data`` (spec and N; empty
    for ``compare``), the ``baseline`` (None without one), the ``policy`` file, the run's
    wall seconds and the curvcal version."""

    command: str
    verdict: Verdict
    model: Source
    model_role: str
    data_spec: str
    n_samples: int | None
    baseline: Source | None
    policy: str
    seconds: float
    version: str


def judged_run(report: Report) -> JudgedRun | None:
    """The verdict of ``report`` and its provenance; None when the report judged nothing (any
    command but ``check`` and ``compare``)."""
    verdict = report.results if isinstance(report.results, Verdict) else None
    if verdict is None:
        found = getattr(report.results, "verdict", None)
        verdict = found if isinstance(found, Verdict) else None
    if verdict is None or report.command not in JUDGING_COMMANDS:
        return None
    from curvcal import __version__

    inputs: dict[str, Any] = to_jsonable(report.inputs)
    data = inputs.get("data") if isinstance(inputs.get("data"), dict) else {}
    baseline = inputs.get("baseline", inputs.get("old"))
    model = inputs.get("checkpoint", inputs.get("new"))
    policy = inputs.get("policy")
    n_samples = data.get("n_samples") if isinstance(data, dict) else None
    return JudgedRun(
        command=report.command,
        verdict=verdict,
        model=_source(model) or Source(path="?"),
        model_role="checkpoint" if "checkpoint" in inputs else "new",
        data_spec=str(data.get("spec", "")) if isinstance(data, dict) else "",
        n_samples=n_samples if isinstance(n_samples, int) else None,
        baseline=_source(baseline),
        policy=str(policy.get("path", "")) if isinstance(policy, dict) else "",
        seconds=float(report.timings.get("total", sum(report.timings.values()))),
        version=__version__,
    )


def _source(described: Any) -> Source | None:
    if not isinstance(described, dict) or "path" not in described:
        return None
    found = described.get("revision")
    revision: dict[str, Any] = found if isinstance(found, dict) else {}
    sha = described.get("sha256")
    return Source(
        path=str(described["path"]),
        sha256=sha if isinstance(sha, str) and sha != "<masked>" else "",
        commit=str(revision.get("commit", "")),
        tag=str(revision.get("tag", "")),
    )


def value_text(row: VerdictRow) -> str:
    """The measured value with its 95 % interval: ``0.0339 [0.021, 0.047]``."""
    text = fmt_float(row.value)
    if row.interval is not None:
        text += f" [{fmt_float(row.interval[0])}, {fmt_float(row.interval[1])}]"
    return text


def row_message(row: VerdictRow) -> str:
    """One line for a judged bound: ``ts.ece = 0.063 [0.04, 0.09], bound <= 0.05: above max;
    baseline 0.05``."""
    text = f"{row.metric} = {value_text(row)}, bound {row.bound_text}"
    if row.baseline is not None:
        text += f", baseline {fmt_float(row.baseline)}"
    if row.reason:
        text += f": {row.reason}"
    return text
