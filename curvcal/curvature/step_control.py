"""The step and the rule of a central-difference product: three points (two gradient
passes) at a step set from the measured derivatives, Richardson's five points (two passes more)
only when the three-point error bound exceeds the one the operator states.

Model, along a vector v at the absolute step δ = ε‖v‖, errors per unit ‖v‖ (N samples, G the
summed gradient, u the unit roundoff, B the batches summed):

* three points, D₃ = (G(θ + εv) − G(θ − εv)) / (2εN): truncation (δ²/6)‖∇⁴L[v̂,v̂,v̂,·]‖,
  rounding R/δ with R = u·‖G(θ)‖·√B / N, or 1.5 × the rounding measured once at a short step
  where larger (it counts the rounding of θ + εv to the parameters' grid too);
* the even part of the same two passes, S = G(θ + εv) + G(θ − εv) − 2G(θ) = ε²∇³L[v,v,·] + O(ε⁴),
  measures the next derivative, A = ‖S‖ / (N δ²) (G(θ) is one gradient pass, taken once);
* the derivative ladder: each derivative along v̂ is one length ℓ = ‖H v̂‖ / A shorter, so the
  truncation coefficient is K = c · A² / ‖H v̂‖ (per δ²; c = 1 to start; the true ratio was
  0.47 along a Gaussian vector and 0.60 along the top eigenvector of a GELU transformer, whose
  K differ by 1000×);
* the product's bound K δ² + R/δ, against b·‖D₃ v̂‖ (b the operator's ``own_error``): relative
  to the product itself, what a trace's vᵀHv needs along a Gaussian vector, whose ‖Hv‖ is far
  below ‖H‖‖v‖ (0.45 against 13.3 on the transformer above; with b·‖H‖ there, a Hutchinson
  trace after the eigenvalues was 1.5e-4 off in float32); or, while the eigenvalues are
  computed (``relative_to_norm``), against b'·‖H‖, the bound the eigenvalue rules allow for
  (‖H‖ ≥ the largest ‖D v̂‖ seen, so never laxer than b'), b' = max(b, tol/10): the products
  spend a tenth of the eigenvalues' tolerance, so the noise (√m + 1)·b' they leave in a
  residual of m ≤ 80 products stays within it.

Step, while the eigenvalues are computed: δ = (R / (2 K_max))^{1/3}, the least of K δ² + R/δ for
the most curved direction seen so far (K_max), never over the default step δ₀ and never under
R / (b' ‖H‖) (where rounding alone would spend the bound); otherwise the last probe's five-point
step (δ₀ before one). Where three points are not enough at that step, the pair is taken again
at the direction's own three-point step (from its ladder) when that is over 2× off and three
points are predicted to be enough there; else the pair is taken again at the eigenvalues'
direction's own three-point step when under half the one taken, or at another product's own
five-point step (:meth:`StepControl.five_point_step`) when over 2× off, or where five points
are predicted over the bound at the step taken and less at their own; Richardson's five points
complete the last pair taken.
Calibration: the first product runs Richardson, and every Richardson
product whose measured truncation ‖D₃(2ε) − D₃(ε)‖/3 is over four times its rounding raises c
to at least twice the measured / predicted ratio.

Five points outside the eigenvalue stage (a trace's probe, whose ‖H v̂‖ can be far below the
gradient's scale): taken at δ₀, they were over b·‖H v̂‖ for 4 of 30 products of the softplus
MLP of the tests (up to 1.8× the bound, float32 and float64), every time from the rounding
(the truncation 1e-5 of the bound): a longer step, not a higher order, is what those products
need. So five points take their own step, the least of a δ⁴ + (3/2) R/δ, up to
:data:`FIVE_POINT_REACH` δ₀ and a quarter of the ladder's length ℓ = ‖H v̂‖ / A (beyond it the
expansion is not the model), and the next probe starts at the step the last one wanted (the
probes of a trace are alike). Along a longer step the ladder's prediction of the five-point
truncation, a = c · ladder · (ladder / ‖H v̂‖) / 5, proved too low on a GELU transformer (with
no margin 6 of 30 products over the bound, up to 3.1×; with 2× one, 1.4×; with 4× none, the
worst 0.77): it carries :data:`FIVE_POINT_SAFETY`, twice the least margin that held. Each
five-point product's predicted error as taken (c as its own measured three-point truncation
set it) is kept; one predicted over b·‖H v̂‖ even at its best step is counted
(:attr:`StepControl.over_bound`): the prediction is the bound that holds for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: c's lower limit and the margin a Richardson measurement sets it with
SAFETY = 1.0
MARGIN = 2.0
#: the margin on the rounding measured along one vector (along the top eigenvector of a GELU
#: transformer it was up to 1.9× a Gaussian vector's)
ROUNDING_MARGIN = 1.5
#: a measured truncation counts for calibration when over this many roundings
CLEAR_OF_ROUNDING = 4.0
#: the longest five-point step outside the eigenvalue stage, in units of δ₀ (the steps the
#: rounding asked for on the test and benchmark models were 1 to 9 δ₀)
FIVE_POINT_REACH = 16.0
#: the five-point step stays under this share of the ladder's length ℓ = ‖H v̂‖ / A
LADDER_SHARE = 0.25
#: the margin on the ladder's five-point truncation: twice the least that held (module
#: docstring)
FIVE_POINT_SAFETY = 8.0


@dataclass(frozen=True)
class Judgement:
    """One three-point product's predicted errors per unit ‖v‖: ``truncation`` K δ²,
    ``rounding`` R/δ, their sum ``bound``; ``allowed`` b·‖H v̂‖; ``ladder`` A²/‖H v̂‖ (K / c)."""

    truncation: float
    rounding: float
    allowed: float
    ladder: float

    @property
    def bound(self) -> float:
        return self.truncation + self.rounding

    @property
    def three_points_enough(self) -> bool:
        return self.bound <= self.allowed


@dataclass
class StepControl:
    """The adaptive rule's state over a run (module docstring): b = ``bound`` (relative to a
    product's own norm), b' = ``norm_bound`` (relative to ‖H‖‖v‖, the eigenvalue stage's;
    ``bound`` when 0), the default
    step δ₀ = ``default_step``, R = ``rounding_unit`` (set once G(θ) is measured), c =
    ``safety``, K_max / c = ``ladder_max``, the largest ‖D v̂‖ seen ``norm_seen``; the error
    allowed is b·‖D₃ v̂‖ (relative to the product itself), or b·‖H‖ with
    ``relative_to_norm`` (what the eigenvalue rules need)."""

    bound: float
    default_step: float
    norm_bound: float = 0.0
    rounding_unit: float = 0.0
    safety: float = SAFETY
    ladder_max: float = 0.0
    norm_seen: float = 0.0
    calibrated: bool = False
    relative_to_norm: bool = False
    #: the first step of a product outside the eigenvalue stage (0: δ₀): the last five-point
    #: step taken there
    probe_step: float = 0.0
    #: five-point products predicted over the bound at their best step, and the largest
    #: predicted / allowed among them (module docstring)
    over_bound: int = 0
    worst_over_bound: float = 0.0

    def __post_init__(self) -> None:
        self.norm_bound = self.norm_bound or self.bound

    def step(self) -> float:
        """The first step of a product: with ``relative_to_norm``, :meth:`step_for` the most
        curved direction seen (the largest ladder and ‖H v̂‖; δ₀ until a product is judged);
        else the step the last five-point product outside the stage took (δ₀ before one): a
        trace's probes are alike, and where three points are not enough their five points
        want a step set by the rounding (module docstring)."""
        if not self.relative_to_norm:
            return self.probe_step or self.default_step
        return self.step_for(self.ladder_max, self.norm_seen)

    def step_for(self, ladder: float, image_norm: float) -> float:
        """δ = (R / (2 c · ``ladder``))^{1/3}, the least of K δ² + R/δ, within
        [R / (b · ``image_norm``), δ₀] (below it rounding alone spends the bound)."""
        coefficient = self.safety * ladder
        if coefficient <= 0.0 or self.rounding_unit <= 0.0 or coefficient == math.inf:
            return self.default_step
        best = (self.rounding_unit / (2 * coefficient)) ** (1 / 3)
        bound = self.norm_bound if self.relative_to_norm else self.bound
        least = self.rounding_unit / (bound * image_norm) if image_norm > 0 else 0.0
        return min(self.default_step, max(best, least))

    def five_point_coefficient(self, judgement: Judgement, image_norm: float) -> float:
        """a in the five-point truncation a δ⁴ along the direction judged: the ladder one more
        length ℓ = ‖H v̂‖/A down for each of two derivatives, a = c · ladder · (ladder /
        ‖H v̂‖) / 5 (the five-point error (δ⁴/30)∇⁶L against the three-point (δ²/6)∇⁴L); ∞
        where nothing bounds it (no curvature seen, or an infinite ladder)."""
        if image_norm <= 0 or judgement.ladder == math.inf:
            return math.inf
        ratio = judgement.ladder * (judgement.ladder / image_norm) / 5
        return FIVE_POINT_SAFETY * self.safety * ratio

    def five_point_step(self, judgement: Judgement, image_norm: float) -> float:
        """The step of Richardson's five points along the direction judged: the least of
        a δ⁴ + (3/2) R/δ, δ = (3R / (8a))^{1/5} (a from :meth:`five_point_coefficient`), within
        δ₀ in the eigenvalue stage; outside it up to :data:`FIVE_POINT_REACH` δ₀ and
        :data:`LADDER_SHARE` ℓ (module docstring)."""
        coefficient = self.five_point_coefficient(judgement, image_norm)
        if coefficient in (0.0, math.inf) or self.rounding_unit <= 0:
            return self.default_step
        best = (3 * self.rounding_unit / (8 * coefficient)) ** 0.2
        if self.relative_to_norm:
            return min(self.default_step, best)
        # ℓ = ‖H v̂‖ / A = √(‖H v̂‖ / ladder)
        length = math.sqrt(image_norm / judgement.ladder)
        return min(FIVE_POINT_REACH * self.default_step, LADDER_SHARE * length, best)

    def five_point_bound(self, judgement: Judgement, step: float, image_norm: float) -> float:
        """The predicted error per unit ‖v‖ of Richardson's five points at ``step`` along the
        direction judged: a δ⁴ + (3/2) R/δ (the five-point rule's weights sum to 3/2 × the
        three-point rule's over its denominator)."""
        coefficient = self.five_point_coefficient(judgement, image_norm)
        truncation = coefficient * step**4 if coefficient != math.inf else math.inf
        return truncation + 1.5 * self.rounding_unit / step

    def five_points_taken(self, judgement: Judgement, step: float, image_norm: float) -> float:
        """Record a five-point product taken at ``step`` (after :meth:`measured`, so c is the
        one its own truncation set): outside the eigenvalue stage the next probe starts at this
        step, and a prediction over b·‖H v̂‖ is counted; returns the prediction per unit ‖v‖
        (:meth:`five_point_bound`)."""
        predicted = self.five_point_bound(judgement, step, image_norm)
        if not self.relative_to_norm:
            self.probe_step = step
            if predicted > judgement.allowed:
                self.over_bound += 1
                self.worst_over_bound = max(self.worst_over_bound, predicted / judgement.allowed)
        return predicted

    def judge(self, step: float, image_norm: float, even_norm: float) -> Judgement:
        """The three-point product at ``step`` δ with ‖D₃‖/‖v‖ = ``image_norm`` and
        ‖S‖/N = ``even_norm`` (= δ²A): its predicted errors; records ‖H v̂‖ and the ladder for
        the next step."""
        self.norm_seen = max(self.norm_seen, image_norm)
        second = even_norm / (step * step)  # A
        if image_norm > 0:
            ladder = second * second / image_norm
        else:  # no curvature seen along v: any change of it is infinitely steep
            ladder = 0.0 if second == 0 else math.inf
        if ladder != math.inf:
            self.ladder_max = max(self.ladder_max, ladder)
        return self.expect(ladder, step, image_norm)

    def expect(self, ladder: float, step: float, image_norm: float) -> Judgement:
        """The predicted errors of a three-point product at ``step`` along a direction whose
        ladder A²/‖H v̂‖ is ``ladder`` and product ‖H v̂‖ = ``image_norm``."""
        return Judgement(
            truncation=self.safety * ladder * step * step,
            rounding=self.rounding_unit / step,
            allowed=(
                self.norm_bound * self.norm_seen
                if self.relative_to_norm
                else self.bound * image_norm
            ),
            ladder=ladder,
        )

    def rounding_measured(self, step: float, error: float) -> None:
        """R ≥ ``MARGIN`` × the rounding measured at a short ``step`` (the error per unit ‖v‖
        of a three-point product there against a five-point reference): it also counts the
        rounding of θ + εv to the parameters' grid (about u·|θ_i| an entry), which u·‖G(θ)‖
        does not."""
        self.rounding_unit = max(self.rounding_unit, ROUNDING_MARGIN * error * step)

    def needs_richardson(self, judgement: Judgement) -> bool:
        """Richardson for the first product (it calibrates c) and where three points are not
        enough."""
        return not self.calibrated or not judgement.three_points_enough

    def measured(self, step: float, judgement: Judgement, truncation: float) -> None:
        """A Richardson product's measured three-point truncation (per unit ‖v‖): c ≥ twice
        measured / predicted (A²/‖H v̂‖ · δ²), where the measure is clear of rounding."""
        self.calibrated = True
        predicted = judgement.ladder * step * step
        if predicted > 0 and truncation > CLEAR_OF_ROUNDING * judgement.rounding:
            self.safety = max(self.safety, MARGIN * truncation / predicted)


__all__ = [
    "CLEAR_OF_ROUNDING",
    "FIVE_POINT_REACH",
    "FIVE_POINT_SAFETY",
    "LADDER_SHARE",
    "MARGIN",
    "ROUNDING_MARGIN",
    "SAFETY",
    "Judgement",
    "StepControl",
]
