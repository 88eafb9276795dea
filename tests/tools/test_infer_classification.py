"""tools/infer.py on a classifier: ``--image`` as a list file, predictions as CSV or JSON (``--output``), and
class names from the class list saved with the checkpoint unless ``--labels`` overrides it; predicted with the genuine
EfficientNet-Lite0 ImageNet weights on real photos (tests/weights/lite0.py)."""
import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from PIL import Image

from ppdlx.checkpoint.files import atomic_save, load_states
from ppdlx.errors import ConfigError, DataError
from ppdlx.tasks.class_list import STATE_KEY, ClassList
from tests.weights.lite0 import convert_lite0, expected_indices, imagenet_like_names, photos, save_photo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFER = os.path.join(ROOT, "tools", "infer.py")


def infer_module():
    """tools/infer.py as a module (it imports ``_cli`` from its own folder, as ``python tools/infer.py`` does)."""
    tools = os.path.dirname(INFER)
    if tools not in sys.path:
        sys.path.insert(0, tools)
    spec = importlib.util.spec_from_file_location("tools_infer", INFER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_infer(*args):
    return subprocess.run([sys.executable, INFER, *map(str, args)], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def lite0(tmp_path_factory):
    """The converted genuine weights and the 7 photos as PNGs (name -> path)."""
    base = tmp_path_factory.mktemp("infer_lite0")
    images = photos()
    prefix = convert_lite0(base / "lite0")
    paths = {name: save_photo(base / "photos", name, rgb) for name, rgb in images.items()}
    return prefix, paths


def _write_png(path, size=(8, 6)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", size, (200, 30, 30)).save(path)
    return str(path)


def test_list_file_paths_are_relative_to_its_folder_and_skip_blank_and_comment_lines(tmp_path):
    infer = infer_module()
    a = _write_png(tmp_path / "imgs" / "a.png")
    b = _write_png(tmp_path / "imgs" / "sub" / "b.jpg")
    c = _write_png(tmp_path / "elsewhere.png")
    listing = tmp_path / "imgs" / "list.txt"
    listing.write_text(f"# photos to check\n\na.png\n   sub/b.jpg  \n  # indented comment\n{c}\n../elsewhere.png\r\n")
    assert infer.image_paths(str(listing)) == [a, b, c, c]
    assert infer.image_paths(a) == [a]  # an image file is itself, not a list


def test_a_list_naming_a_missing_file_or_nothing_is_one_line_naming_the_line(tmp_path):
    infer = infer_module()
    _write_png(tmp_path / "a.png")
    listing = tmp_path / "list.txt"
    listing.write_text("a.png\n\n# next one is gone\nmissing/b.png\n")
    with pytest.raises(DataError) as err:
        infer.image_paths(str(listing))
    assert str(err.value) == f"--image {listing} line 4: missing/b.png: no such image file"
    listing.write_text("# nothing yet\n\n")
    with pytest.raises(DataError, match=r"the list file names no images"):
        infer.image_paths(str(listing))
    with pytest.raises(ConfigError) as err:
        infer.prediction_format(str(tmp_path / "preds.txt"))
    assert str(err.value) == (f"--output {tmp_path / 'preds.txt'}: classification writes .csv or .json predictions "
                              f"(the table always prints)")
    assert (infer.prediction_format("p.CSV"), infer.prediction_format("p.json")) == ("csv", "json")


def test_missing_listed_image_exits_2_with_one_line(lite0, tmp_path):
    prefix, paths = lite0
    listing = tmp_path / "list.txt"
    listing.write_text(f"{paths['coffee']}\n# the rocket\nrocket.png\n")
    proc = run_infer("-o", "model.name=efficientnet_lite0", f"model.weights={prefix}", "--image", listing)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: --image {listing} line 3: rocket.png: no such image file"


def test_list_file_predictions_as_csv_rows(lite0, tmp_path):
    prefix, paths = lite0
    order = ["rocket", "grace_hopper.jpg", "coffee", "china.jpg", "chelsea", "flower.jpg", "stereo_motorcycle"]
    listing = tmp_path / "lists" / "photos.txt"
    listing.parent.mkdir()
    photo_dir = os.path.relpath(os.path.dirname(paths["coffee"]), listing.parent)
    listing.write_text("# the seven sample photos\n\n" + "".join(
        f"{os.path.join(photo_dir, os.path.basename(paths[n]))}\n" for n in order))
    names = imagenet_like_names()
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    out = tmp_path / "out" / "predictions.csv"
    proc = run_infer("-o", "model.name=efficientnet_lite0", f"model.weights={prefix}", "--image", listing,
                     "--top-k", 3, "--batch-size", 4, "--labels", tmp_path / "names.txt", "--output", out,
                     "--report", tmp_path / "report.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == f"7 images, top-3 of 1000 classes -> {out}"
    assert f"class names: {tmp_path / 'names.txt'}" in proc.stdout.splitlines()
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["image", "rank", "class_id", "class_name", "score"]
    rows = rows[1:]
    assert len(rows) == 21
    listed = [os.path.normpath(os.path.join(str(listing.parent), photo_dir, os.path.basename(paths[n])))
              for n in order]
    assert [r[0] for r in rows] == [p for p in listed for _ in range(3)]
    assert [int(r[1]) for r in rows] == [1, 2, 3] * 7
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["class_names_from"] == str(tmp_path / "names.txt")
    for name, image_rows, prediction in zip(order, (rows[i:i + 3] for i in range(0, 21, 3)), report["predictions"]):
        assert prediction["image"] == image_rows[0][0]
        top1 = int(image_rows[0][2])
        assert top1 in expected_indices(name), (name, image_rows)
        assert all(r[3] == names[int(r[2])] for r in image_rows)
        scores = [float(r[4]) for r in image_rows]
        assert scores == sorted(scores, reverse=True) and scores[0] > 0.2, (name, scores)
        assert [(int(r[2]), float(r[4])) for r in image_rows] == [(t["class_index"], t["score"])
                                                                  for t in prediction["top"]]


def test_class_list_saved_with_the_checkpoint_names_predictions_unless_labels_override_it(lite0, tmp_path):
    prefix, paths = lite0
    trained = str(tmp_path / "trained")
    shutil.copyfile(prefix + ".pdparams", trained + ".pdparams")
    saved = [f"n{k:08d}" for k in range(1000)]  # ImageNet-style folder names, as training saves them
    states = load_states(prefix + ".pdstates")
    states[STATE_KEY] = ClassList(saved, str(tmp_path / "train")).state_dict()
    atomic_save(states, trained + ".pdstates", plain_pickle=True)
    labels = imagenet_like_names()
    (tmp_path / "names.txt").write_text("\n".join(labels) + "\n")
    out = tmp_path / "predictions.json"
    common = ("-o", "model.name=efficientnet_lite0", f"model.weights={trained}", "--image", paths["coffee"],
              "--top-k", 2, "--output", out)

    proc = run_infer(*common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["class_names_from"] == f"{trained}.pdstates"
    (prediction,) = report["predictions"]
    assert prediction["image"] == paths["coffee"]
    assert [t["class_index"] for t in prediction["top"]][:1] == sorted(expected_indices("coffee"))
    assert [t["class"] for t in prediction["top"]] == [saved[t["class_index"]] for t in prediction["top"]]
    assert prediction["top"][0]["score"] > 0.9

    proc = run_infer(*common, "--labels", tmp_path / "names.txt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"note: --labels {tmp_path / 'names.txt'} differs from the class list saved with the checkpoint "
            f"(class 0: 'imagenet class 0' in --labels, 'n00000000' in {trained}.pdstates); showing --labels"
            ) in proc.stdout
    report = json.loads(out.read_text())
    assert report["class_names_from"] == str(tmp_path / "names.txt")
    assert [t["class"] for t in report["predictions"][0]["top"]] == [
        labels[t["class_index"]] for t in report["predictions"][0]["top"]]


def test_unreadable_images_of_a_folder_are_skipped_and_the_others_predicted(lite0, tmp_path):
    """One unreadable file no longer stops the run: it is one 'skipped' line on stderr, every other photo is
    predicted under its own name (its top-1 is one of that photo's classes, batches refilled after the gap),
    the CSV and report hold the predicted ones, and the run ends with a line counting the skipped files and
    exit code 2. An unreadable image file given alone stays a one-line error."""
    prefix, paths = lite0
    folder = tmp_path / "photos"
    folder.mkdir()
    for path in paths.values():
        shutil.copyfile(path, folder / os.path.basename(path))
    names = sorted(os.listdir(folder))
    bad = {names[1][:-4] + "_cut.png": b"", "zzzbad.jpg": b"this is not a JPEG\n"}  # inside the first batch; last
    for name, data in bad.items():
        (folder / name).write_bytes(data)
    out = tmp_path / "predictions.csv"
    proc = run_infer("-o", "model.name=efficientnet_lite0", f"model.weights={prefix}", "--image", folder,
                     "--top-k", 1, "--batch-size", 4, "--output", out, "--report", tmp_path / "report.json")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith(("skipped ", "error: "))]
    assert len(lines) == 3 and proc.stderr.strip().splitlines()[-1] == lines[2], proc.stderr
    for line, name in zip(lines, sorted(bad)):
        assert line.startswith(f"skipped {folder / name}: cannot read image (cannot identify image file "), line
    assert lines[2] == "error: 2 of 9 images skipped (cannot read image); the other 7 were predicted"
    assert proc.stdout.splitlines()[-1] == f"7 images, top-1 of 1000 classes -> {out}"
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    assert [r[0] for r in rows] == [str(folder / n) for n in names]
    by_png = {os.path.basename(p): photo for photo, p in paths.items()}
    for row in rows:
        assert int(row[2]) in expected_indices(by_png[os.path.basename(row[0])]), row
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["skipped"] == [str(folder / n) for n in sorted(bad)]
    assert [p["image"] for p in report["predictions"]] == [r[0] for r in rows]

    alone = run_infer("-o", "model.name=efficientnet_lite0", f"model.weights={prefix}", "--image",
                      folder / "zzzbad.jpg")
    assert alone.returncode == 2 and "Traceback" not in alone.stderr
    lines = [line for line in alone.stderr.strip().splitlines() if line.startswith(("skipped ", "error: "))]
    assert len(lines) == 1 and lines[0].startswith(f"error: {folder / 'zzzbad.jpg'}: cannot read image ("), lines
    assert alone.stderr.strip().splitlines()[-1] == lines[0] and alone.stdout.count("\n  ") == 0
