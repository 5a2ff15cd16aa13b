"""`python -m curvcal` (also what `torchrun -m curvcal` runs).

Ctrl-C is taken over before anything else is imported (see :mod:`curvcal.interrupt`): an
interrupt during the imports of click, numpy or torch ends the run with exit 130 like any
other, instead of surfacing as a half-imported module's error.
"""

if __name__ == "__main__":
    from curvcal import interrupt

    interrupt.install()

    from curvcal.cli import run

    run()
