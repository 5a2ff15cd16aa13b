"""``folder:PATH``: an image folder, one sub-folder per class (torchvision's ``ImageFolder``
layout), preprocessed by :func:`curvcal.load.datasets.preprocessing.image_transform` with the ImageNet
preset; an unreadable image is an error naming its file."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from curvcal.errors import InputError
from curvcal.load.datasets.loaded_data import LoadedData, loaded_data
from curvcal.load.datasets.preprocessing import image_transform
from curvcal.load.files.tensorfile import as_labels
from curvcal.paths import readable_file, readable_folder
from curvcal.settings.data import DataSettings


class CheckedImages(Dataset[Any]):
    """A torchvision ``ImageFolder`` whose unreadable image (truncated, not an image, no
    permission) is an :class:`InputError` naming the file, and which names the file of any
    sample (:meth:`source_of`)."""

    def __init__(self, folder: Any) -> None:
        self.folder = folder
        self.targets = folder.targets
        self.classes = folder.classes

    def __len__(self) -> int:
        return len(self.folder)

    def source_of(self, index: int) -> str:
        return str(self.folder.samples[index][0])

    def __getitem__(self, index: int) -> Any:
        # an image named like one that is a named pipe or a device would block the decoder
        readable_file(Path(self.source_of(index)), "image file")
        try:
            with _bombs_refused(self.source_of(index)):
                return self.folder[index]
        except (OSError, ValueError, SyntaxError) as exc:  # what PIL raises for a bad file
            reason = " ".join(str(exc).split()) or type(exc).__name__
            if isinstance(exc, PermissionError):
                reason = exc.strerror or reason
            raise InputError(
                self.source_of(index), f"cannot be read as an image ({reason})"
            ) from exc


def load_image_folder(options: DataSettings, model: Mapping[str, Any] | None) -> LoadedData:
    """The images under ``folder:PATH``; ``model`` is the model's recorded preprocessing, used
    in place of the preset."""
    from torchvision.datasets import ImageFolder

    path = Path(options.spec[len("folder:") :]).expanduser()
    what = f"--data {options.spec}"
    if not path.is_dir():
        raise InputError(what, f"{path} is not a folder")
    readable_folder(path, "image folder")  # torchvision lists it and reads every image
    _refuse_files_reached_twice(path)
    try:
        folder = ImageFolder(str(path))
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(
            what, f"is not an image folder ({reason})", "put images in one sub-folder per class"
        ) from exc
    image = image_transform(
        options, "imagenet", 3, model, _first_image_size(folder), preset_assumed=True
    )
    folder.transform = image.transform
    dataset = CheckedImages(folder)
    labels = as_labels(torch.as_tensor(dataset.targets, dtype=torch.int64), what)
    # the folder, not each image: its digest covers every file's relative name and size, so a
    # report records what was read without hashing a whole image collection
    files = (path,)
    return loaded_data(dataset, options.spec, labels, files, dataset.classes, **image.provenance())


def _refuse_files_reached_twice(root: Path) -> None:
    """An :class:`InputError` naming the link when a folder or an image under ``root`` is
    reached twice.

    torchvision walks the class folders following symbolic links, and keeps no record of where
    it has been: a link to a folder above it (``a/up -> ..``) lists every image again under
    the link's class (``b``'s images counted as ``a``) until the path is too long, and two such
    links make the walk grow as 2^depth (a run that never ends). A folder linked twice, or one
    image under two names (a link or a hard link), counts that image twice, maybe under two
    classes. This walk follows links the same way but remembers each folder's and image's
    ``(st_dev, st_ino)``, so it stops at the first thing seen before. An image that is no link
    costs no system call (its inode comes with the directory listing, its device is its
    folder's); a folder or a link costs one ``stat``."""
    import os

    from torchvision.datasets.folder import IMG_EXTENSIONS

    seen: dict[tuple[int, int], str] = {}

    def refuse(place: str, before: str, noun: str) -> InputError:
        return InputError(
            place,
            f"is the {noun} {before} again (a symbolic or hard link): the image folder would "
            f"count {'its images' if noun == 'folder' else 'the image'} more than once",
            "remove the link, or copy what it points to",
        )

    try:
        status = root.stat()
    except OSError:
        return  # the loader says what is wrong with the folder itself
    seen[(status.st_dev, status.st_ino)] = str(root)
    pending = [(str(root), status.st_dev)]
    while pending:
        top, device = pending.pop()
        try:
            with os.scandir(top) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue  # unreadable: torchvision skips it too
        folders = []
        for entry in entries:
            try:
                if entry.is_dir():  # through a link too, as torchvision walks
                    status = os.stat(entry.path)
                    key, noun = (status.st_dev, status.st_ino), "folder"
                    folders.append((entry.path, status.st_dev))
                elif not entry.name.lower().endswith(IMG_EXTENSIONS):
                    continue
                elif entry.is_symlink():
                    status = os.stat(entry.path)
                    key, noun = (status.st_dev, status.st_ino), "image"
                else:
                    key, noun = (device, entry.inode()), "image"
            except OSError:
                continue  # a broken link: torchvision skips it, and a sample names a bad file
            before = seen.setdefault(key, entry.path)
            if before != entry.path:
                raise refuse(entry.path, before, noun)
        pending.extend(reversed(folders))  # depth first, in name order


def _first_image_size(folder: Any) -> tuple[int, int] | None:
    """(height, width) of the folder's first image, read from its header; None when it cannot
    be read (the sample's own read then names the file)."""
    from PIL import Image

    if not folder.samples:
        return None
    try:
        with _bombs_refused(folder.samples[0][0]), Image.open(folder.samples[0][0]) as picture:
            width, height = picture.size
    except (OSError, ValueError, SyntaxError):
        return None
    return int(height), int(width)


@contextmanager
def _bombs_refused(source: str) -> Iterator[None]:
    """PIL's guard against a decompression bomb (a small file that decodes to a huge image) as
    an :class:`InputError` naming the file: PIL warns past ``Image.MAX_IMAGE_PIXELS`` (a
    ``DecompressionBombWarning`` printed raw, before the image fills gigabytes: 12 KB of PNG
    decode to 1.2 GB of float32 pixels at 10,000²) and raises past twice that; both are
    refused."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        pixels = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(pixels.group(1)):,} pixels" if pixels else "too many pixels"
        raise InputError(
            source,
            f"decodes to {size}, more than the {Image.MAX_IMAGE_PIXELS:,} PIL reads without "
            "taking it for a decompression bomb",
            "resize such images before measuring",
        ) from exc
