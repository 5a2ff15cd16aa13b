"""Holes a third adversarial pass found on the surfaces the first two did not reach, each fixed
where every part goes through it:

- image folders (``--data folder:PATH``): torchvision walks the class folders following
  symbolic links and remembers nothing, so a link to a folder above (``a/up -> ..``) listed
  every image again under the link's class, until the path was too long (9 images read as
  369 samples, ``b``'s and ``c``'s counted as ``a``, exit 0), and two such links made the walk
  grow as 2^depth (still listing after 60 s). A folder linked twice, or one image under two
  names, counted those images twice. The loader now walks the folder first remembering each
  folder and image by device and inode, and refuses the first one reached again, exit 2
  naming the link.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from curvcal.errors import InputError
from curvcal.load.datasets.loaded_data import LoadedData


def _images(root: Path, classes: tuple[str, ...] = ("a", "b"), per_class: int = 2) -> Path:
    from PIL import Image

    for number, label in enumerate(classes):
        (root / label).mkdir(parents=True)
        for index in range(per_class):
            Image.new("RGB", (5, 5), (40 * number, 10 * index, 0)).save(
                root / label / f"{index}.png"
            )
    return root


def _load(root: Path) -> LoadedData:
    from curvcal.load.data import load_dataset
    from curvcal.settings.data import DataSettings

    return load_dataset(DataSettings(data=f"folder:{root}", resize=4, crop=4))


@pytest.mark.parametrize(
    ("link", "target", "again"),
    [
        ("a/up", "..", "."),  # a loop: every image again, under class a
        ("a/bb", "../b", "b"),  # b's images counted under a as well
    ],
)
def test_an_image_folder_reaching_a_folder_twice_is_refused(
    tmp_path: Path, link: str, target: str, again: str
) -> None:
    root = _images(tmp_path / "img")
    os.symlink(target, root / link)
    with pytest.raises(InputError) as caught:
        _load(root)
    assert caught.value.what == str(root / link)
    assert f"is the folder {os.path.normpath(root / again)} again" in caught.value.why
    assert caught.value.exit_code == 2


def test_two_loops_in_an_image_folder_are_refused_before_the_walk_runs_away(
    tmp_path: Path,
) -> None:
    """Before: two links to the folder above made torchvision's walk grow as 2^depth (still
    running after 60 s); each is now one look-up."""
    root = _images(tmp_path / "img")
    os.symlink("..", root / "a" / "u1")
    os.symlink("..", root / "a" / "u2")
    with pytest.raises(InputError) as caught:
        _load(root)
    assert caught.value.what == str(root / "a" / "u1")


def test_one_image_under_two_names_is_refused(tmp_path: Path) -> None:
    root = _images(tmp_path / "img")
    os.link(root / "b" / "0.png", root / "a" / "9.png")
    with pytest.raises(InputError) as caught:
        _load(root)
    assert caught.value.what == str(root / "b" / "0.png")
    assert f"is the image {root / 'a' / '9.png'} again" in caught.value.why


def test_an_image_folder_linking_outside_itself_once_is_read(tmp_path: Path) -> None:
    """A class folder that is a link to images kept elsewhere, reached once, is a dataset."""
    pool = _images(tmp_path / "pool", classes=("c",), per_class=3)
    root = _images(tmp_path / "img", classes=("a",))
    os.symlink(pool / "c", root / "c")
    data = _load(root)
    assert len(data.dataset) == 5
    assert sorted(int(label) for label in data.labels) == [0, 0, 1, 1, 1]
