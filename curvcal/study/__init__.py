"""Curvature against calibration across checkpoints: the library behind ``curvcal study``
(:mod:`~curvcal.study.summary`: each checkpoint's row; :mod:`~curvcal.study.spearman`: rank
correlations with exact p-values)."""
