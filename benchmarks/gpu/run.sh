#!/usr/bin/env bash
# The one-shot GPU run from the repository root, nothing installed: results to benchmarks/results
# and to $OUT when set. Extra arguments go to run.py (--smoke, --parts, --total-budget, ...).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" benchmarks/gpu/run.py ${OUT:+--out "$OUT"} "$@"
