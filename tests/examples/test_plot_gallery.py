"""The gallery of docs/guide/plots.md: its images are what the commands shown above them write.

The gallery's console block is run as every docs block is (:mod:`tests.examples.test_readme`'s
placeholder files); each image the page shows must be one of the files those commands wrote,
with the same size in pixels, and small enough to keep in the repository. Set
``CURVCAL_WRITE_GALLERY=1`` to copy the images the commands wrote over the page's (after a
deliberate change of a figure).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from pathlib import Path

import matplotlib.image
import pytest
import test_readme as readme

PAGE = readme.ROOT / "docs" / "guide" / "plots.md"
IMAGES = PAGE.parent / "img"
#: The most bytes a gallery image may take.
MOST_BYTES = 150_000


def _gallery() -> list[tuple[str, readme.Command, int]]:
    text = PAGE.read_text()
    start = text.index("## Gallery")
    block = text.count("```console", 0, start)  # console blocks before the gallery's
    return readme._blocks(PAGE)[sorted(readme._blocks(PAGE))[block]]


def _shown() -> list[str]:
    text = PAGE.read_text()
    return re.findall(r"!\[[^\]]*\]\(img/([^)]+)\)", text[text.index("## Gallery") :])


def test_the_gallery_shows_committed_small_images() -> None:
    shown = _shown()
    assert shown == ["reliability.png", "spectrum.png", "spectrum-layers.png", "landscape.png"]
    for name in shown:
        assert (IMAGES / name).stat().st_size < MOST_BYTES, name


@pytest.mark.slow  # three commands end to end, the Hessian with its density (about 30 s)
def test_the_gallery_images_are_what_its_commands_write(
    tmp_path: Path, run_cli, monkeypatch
) -> None:
    commands = _gallery()
    assert [command.argv[0] for _, command, _ in commands] == ["metrics", "hessian", "landscape"]
    readme._run_block(commands, tmp_path, run_cli, monkeypatch, "docs/guide/plots.md")
    written = {
        Path(value).name
        for _, command, _ in commands
        for option, value in itertools.pairwise(command.argv)
        if option == "--plot"
    }
    written |= {f"{Path(name).stem}-layers.png" for name in written if name == "spectrum.png"}
    assert set(_shown()) == written
    if os.environ.get("CURVCAL_WRITE_GALLERY") == "1":
        for name in written:
            shutil.copyfile(tmp_path / name, IMAGES / name)
    for name in written:
        made = matplotlib.image.imread(tmp_path / name).shape[:2]
        assert matplotlib.image.imread(IMAGES / name).shape[:2] == made, name
        assert (tmp_path / name).stat().st_size < MOST_BYTES, name
