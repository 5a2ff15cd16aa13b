"""`python -m curvcal` (also what `torchrun -m curvcal` runs)."""

from curvcal.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
