"""What is in one split of a dataset: files, classes, image sizes, files the loader cannot decode, content hashes.

Decoding goes through the configured loader's own code, so a file counts as unreadable exactly when
training would skip (or stop on) it:

* ``data.backend: paddle``: the dataset's ``__getitem__`` (``ImageFolder`` / ``CocoDetection``: PIL open +
  RGB convert, the same exceptions caught), with its transform replaced by one that returns the decoded size;
* ``data.backend: dali``: ``ppdlx.data.dali_fed_loader.find_undecodable`` (DALI's CPU decoder, file by file), the
  function the DALI loader uses to name a file that stopped its pipeline; sizes from the image header.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Optional

from ppdlx.data.image_file import open_image, why_unreadable
from ppdlx.data.image_folder import ImageFolder, scan_image_folder
from ppdlx.data.loader_common import dali_required
from ppdlx.errors import DataError


@dataclass
class SplitReport:
    """One split. ``class_counts`` are images per class (classification) or boxes per category (detection)."""

    name: str
    source: str                                        # the split directory or the annotation json
    classes: list = field(default_factory=list)
    class_counts: list = field(default_factory=list)
    paths: list = field(default_factory=list)          # every image file the loader would read
    labels: list = field(default_factory=list)         # classification: the label of each path
    unreadable: list = field(default_factory=list)     # (path, reason)
    sizes: dict = field(default_factory=dict)          # path -> (width, height)
    digests: dict = field(default_factory=dict)        # path -> sha1 of the file's bytes
    error: Optional[str] = None                        # why the loader would refuse this split
    decoder: str = ""                                  # what decided "unreadable" ("" = not decoded)
    # detection only
    cat_ids: list = field(default_factory=list)
    image_boxes: list = field(default_factory=list)    # per image of ``paths``: [(x, y, w, h, class index)]
    category_images: list = field(default_factory=list)
    areas: dict = field(default_factory=dict)          # small / medium / large box counts (COCO's ranges)
    crowd: int = 0
    touching: int = 0                                  # boxes with an edge on the image border
    leaving: int = 0                                   # boxes reaching past the border (the loader clips them)
    invalid: list = field(default_factory=list)        # (annotation id, image id, file, reason): left out
    size_mismatch: list = field(default_factory=list)  # (path, size in the json, decoded size)
    sized_from_file: int = 0                           # images the json gives no width/height (read from the file)

    @property
    def images(self) -> int:
        return len(self.paths)

    @property
    def boxes(self) -> int:
        return sum(len(b) for b in self.image_boxes)

    @property
    def imbalance(self) -> Optional[float]:
        """Largest over smallest class count (inf when a class has none, None without classes)."""
        if not self.class_counts:
            return None
        low = min(self.class_counts)
        return float("inf") if low == 0 else max(self.class_counts) / low


def file_digests(paths) -> dict:
    out = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                out[path] = hashlib.file_digest(f, "sha1").hexdigest()
        except OSError:
            pass  # a file that cannot be read at all is reported by the decode check
    return out


def header_sizes(paths) -> dict:
    """(width, height) from each image's header (no full decode)."""
    out = {}
    for path in paths:
        try:
            with open_image(path) as img:
                out[path] = img.size
        except (OSError, ValueError, SyntaxError):
            pass
    return out


def _decoded_size(img, rng):
    return img.size


def decode_with_dali(paths):
    """(unreadable [(path, reason)], sizes) the way the DALI loaders see the files."""
    with dali_required():
        from ppdlx.data.dali_fed_loader import find_undecodable  # the DALI backend: optional (nvidia-dali)
    bad = find_undecodable(list(paths))
    failed = {p for p, _ in bad}
    return bad, {p: s for p, s in header_sizes(paths).items() if p not in failed}


def decode_with_dataset(dataset, paths):
    """(unreadable, sizes) from ``dataset[i]`` whose transform returns the decoded size (None = not decodable)."""
    bad, sizes = [], {}
    for i, path in enumerate(paths):
        size = dataset[i][0]
        if size is None:
            bad.append((path, f"cannot be decoded (PIL: {why_unreadable(path) or 'no reason given'})"))
        else:
            sizes[path] = tuple(size)
    return bad, sizes


def decode_split(report, backend: str, make_probe) -> None:
    """Fill ``report.decoder/unreadable/sizes`` the way the configured loader decodes: DALI's CPU decoder, or the
    paddle.io dataset that ``make_probe()`` returns with the paths of its items."""
    if backend == "dali":
        report.decoder = "DALI's CPU decoder, as the data.backend=dali loader"
        report.unreadable, report.sizes = decode_with_dali(report.paths)
    else:
        report.decoder = "PIL, as the paddle.io loader"
        probe, paths = make_probe()
        report.unreadable, report.sizes = decode_with_dataset(probe, paths)


def scan_image_folder_split(root: str, split: str, name: str, backend: str, decode=True, hash_files=True):
    """A ``SplitReport`` of ``root/split``; ``decode``/``hash_files`` off keeps it to a directory walk."""
    split_dir = os.path.join(root, split)
    report = SplitReport(name=name, source=split_dir)
    try:
        report.classes, samples = scan_image_folder(split_dir)
    except DataError as err:
        report.error = str(err)
        if os.path.isdir(split_dir):
            report.classes = sorted(d.name for d in os.scandir(split_dir) if d.is_dir())
            report.class_counts = [0] * len(report.classes)
        return report
    report.paths = [p for p, _ in samples]
    report.labels = [label for _, label in samples]
    report.class_counts = [0] * len(report.classes)
    for label in report.labels:
        report.class_counts[label] += 1
    if decode:
        def folder_probe():
            probe = ImageFolder(root, split, transform=_decoded_size)
            return probe, [p for p, _ in probe.samples]
        decode_split(report, backend, folder_probe)
    if hash_files:
        report.digests = file_digests(report.paths)
    return report


def cross_split_duplicates(first: SplitReport, second: SplitReport) -> list:
    """``[(path in second, path in first)]``: files of ``second`` whose bytes equal a file of ``first``."""
    by_digest = {}
    for path, digest in first.digests.items():
        by_digest.setdefault(digest, path)
    return [(path, by_digest[d]) for path, d in second.digests.items() if d in by_digest]


def within_split_duplicates(split: SplitReport) -> int:
    """Files whose bytes repeat an earlier file of the same split."""
    return len(split.digests) - len(set(split.digests.values()))
