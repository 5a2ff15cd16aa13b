"""The CPU-only install README and the docs show: torch's CPU wheels first, from the CPU index,
with the constraints that pin them, then curvcal with the same constraints (pip is not run: no
network in tests)."""

from __future__ import annotations

import re

from tests.examples import test_readme as readme

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INSTALL_PAGE = readme.ROOT / "docs" / "index.md"


def test_the_cpu_route_installs_the_pinned_cpu_wheels_before_curvcal() -> None:
    page = INSTALL_PAGE
    installs = [
        command.argv for program, command, _ in readme.all_commands(page) if program == "pip"
    ]
    cpu = [argv for argv in installs if CPU_INDEX in argv]
    assert len(cpu) == 1, installs
    (argv,) = cpu
    assert argv[argv.index("--index-url") + 1] == CPU_INDEX
    assert {"torch", "torchvision"} <= set(argv)
    constraints = readme.ROOT / argv[argv.index("-c") + 1]
    pinned = dict(re.findall(r"^(torch|torchvision)==(\S+)$", constraints.read_text(), re.M))
    assert set(pinned) == {"torch", "torchvision"}  # a +cpu build of each satisfies the pin
    after = installs[installs.index(argv) + 1]  # then curvcal itself, under the same pins
    assert after[-1].startswith(".") and after[after.index("-c") + 1] == argv[argv.index("-c") + 1]
    # the sizes beside it are said, in the docs and in README's quick start (which shows
    # make targets only, so it names the two pip lines in its text)
    for text in (page.read_text(), readme.README.read_text()):
        assert "5.2 GB" in text and "0.66 GB" in text
        assert " ".join(["pip", *argv]) in " ".join(text.split())
