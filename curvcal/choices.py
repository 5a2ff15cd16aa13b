"""The choices of the Hessian options, as plain constants: ``--help`` shows them without
importing torch. The kernels check their settings against the same names (a test holds the
two sides together where a kernel keeps its own copy)."""

from __future__ import annotations

#: ``--loss`` of ``hessian`` and ``study``: cross-entropy, focal (with ``--gamma``), or the
#: loss recorded in each checkpoint's metadata.
HESSIAN_LOSSES = ("ce", "focal", "own")
#: ``--method``: eigenvalues by power iteration or by Lanczos with full reorthogonalisation.
EIGEN_METHODS = ("power", "lanczos")
#: ``--trace-method``: auto (the default: Gauss–Newton where it is exact, else its exact
#: Gauss–Newton part plus Hutch++ on the rest where that can run, else Hutch++), the
#: Gauss–Newton trace (exact for networks linear in each parameter tensor), the split traces
#: (the Gauss–Newton part exact, Hutch++ or XTrace on the rest), Hutch++, XTrace, or
#: Hutchinson's estimator.
TRACE_METHODS = (
    "auto",
    "gauss-newton",
    "gauss-newton+hutchpp",
    "gauss-newton+xtrace",
    "hutchpp",
    "xtrace",
    "hutchinson",
)
#: ``--probe-dist``: the distribution of the trace probes.
PROBE_DISTRIBUTIONS = ("rademacher", "gaussian")
#: ``--hvp``: how Hessian-vector products are taken (picked per width, torch.func, double
#: backward).
ENGINES = ("auto", "func", "autograd")
#: ``--mode``: the module mode while the loss is computed.
MODES = ("eval", "train")
#: ``--cache``: where batches stay between products.
CACHES = ("auto", "device", "host", "none")
#: ``--keep-graphs``: keep the gradient graphs between products when they fit in the memory
#: budget, whatever the budget, or never.
KEEP_GRAPHS = ("auto", "always", "never")
#: The largest ``--seed`` (and policy ``seed``): torch's and numpy's generators take a 64-bit
#: seed, and a larger integer overflows inside them.
MAX_SEED = 2**63 - 1
#: The most ``--bins`` (and policy ``bins``): more bins than this hold no samples on any data
#: set curvcal can score, and each stage keeps a row per bin (classwise ECE one per class).
MAX_BINS = 10_000
#: The most classes (``--num-classes``, a ``num_classes`` keyword or config entry): a
#: classifier head of more rows than this would not fit in memory next to any network.
MAX_CLASSES = 1_000_000
