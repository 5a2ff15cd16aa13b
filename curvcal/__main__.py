"""`python -m curvcal` (also what `torchrun -m curvcal` runs)."""

from curvcal.cli import run

if __name__ == "__main__":
    run()
