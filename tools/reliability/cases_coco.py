"""Bad COCO annotation files for detection training (issue 15, item 4): sizes missing or wrong, boxes
outside the image, a truncated json, annotations of absent images, duplicate image ids, no
annotations, a missing image file, an unknown category."""
from __future__ import annotations

import json
import os

from .battery import Case, Run
from .faults import truncate

AREA = "data (COCO)"
TRAIN_JSON = os.path.join("annotations", "instances_train.json")
VAL_JSON = os.path.join("annotations", "instances_val.json")


def _edit(edit, description, mentions=("instances_train.json",), overrides=(), json_file=TRAIN_JSON,
          tool="tools/train.py", args=(), **facts):
    """A prepare that copies the COCO fixture, lets ``edit(doc, root)`` change the train json (or ``json_file``, or
    the files), and trains the detection demo on it for one step (or runs ``tool``)."""
    def prepare(ctx):
        root = ctx.copy("coco")
        path = os.path.join(root, json_file)
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        doc = edit(doc, root)
        if doc is not None:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
        return Run(ctx.detection(tool, root, *overrides, args=tuple(a.format(case=ctx.dir) for a in args)),
                   mentions=list(mentions),
                   description=description, facts=dict(facts))
    return prepare


def _output_mentions(*alternatives):
    """Exit 0 is right when a line of the output names the problem (any of ``alternatives``) with a count."""
    def check(ctx, run, result):
        for line in result.output.splitlines():
            if any(a.lower() in line.lower() for a in alternatives) and any(ch.isdigit() for ch in line):
                return True, f"exit 0, reported: {line.strip()[:120]}"
        return False, f"exit 0 and no line mentioning {' / '.join(alternatives)}"
    return check


def _drop_sizes(doc, root):
    for image in doc["images"]:
        image.pop("width", None)
        image.pop("height", None)
    return doc


def _halve_sizes(doc, root):
    for image in doc["images"]:
        image["width"], image["height"] = image["width"] // 2, image["height"] // 2
    return doc


def _boxes_outside(doc, root):
    sizes = {i["id"]: (i["width"], i["height"]) for i in doc["images"]}
    for ann in doc["annotations"][:3]:
        width, _ = sizes[ann["image_id"]]
        ann["bbox"] = [width + 10, 5, 20, 20]
    return doc


def _truncate_json(doc, root):
    truncate(os.path.join(root, TRAIN_JSON))
    return None


def _absent_images(doc, root):
    extra = dict(doc["annotations"][0], id=10_000, image_id=999)
    doc["annotations"].append(extra)
    return doc


def _duplicate_ids(doc, root):
    second = doc["images"][1]
    second["id"] = doc["images"][0]["id"]
    return doc


def _no_annotations(doc, root):
    doc["annotations"] = []
    return doc


def _missing_file(doc, root):
    os.remove(os.path.join(root, "train", doc["images"][0]["file_name"]))
    return doc


def _unknown_category(doc, root):
    doc["annotations"][0]["category_id"] = 42
    return doc


def _file_name_outside(doc, root):
    """The first train image points at a val image by absolute path, the second climbs out with '..'."""
    with open(os.path.join(root, VAL_JSON), encoding="utf-8") as f:
        val_name = json.load(f)["images"][0]["file_name"]
    doc["images"][0]["file_name"] = os.path.join(root, "val", val_name)
    doc["images"][1]["file_name"] = os.path.join("..", "val", val_name)
    return doc


def _duplicate_annotation_ids(doc, root):
    doc["annotations"][1]["id"] = doc["annotations"][0]["id"]
    return doc


def _area_not_a_number(doc, root):
    doc["annotations"][0]["area"] = "big"
    return doc


def cases():
    return [
        Case("coco_no_width_height", AREA, "train.py", "", _edit(_drop_sizes, "train json images without "
             "width/height"), check=_output_mentions("width")),
        Case("coco_wrong_width_height", AREA, "train.py", "", _edit(_halve_sizes, "train json width/height halved "
             "(smaller than the JPEGs)"), check=_output_mentions("width", "size")),
        Case("coco_boxes_outside_image", AREA, "train.py", "", _edit(_boxes_outside, "3 boxes moved right of their "
             "image (data.coco.invalid=skip)"), check=_output_mentions("invalid", "outside", "skipped")),
        Case("coco_boxes_outside_image_error", AREA, "train.py", "", _edit(
            _boxes_outside, "3 boxes right of their image, data.coco.invalid=error",
            overrides=("data.coco.invalid=error",))),
        Case("coco_json_truncated", AREA, "train.py", "", _edit(_truncate_json, "train json cut in half"),
             needs_fix=False),
        Case("coco_annotation_of_absent_image", AREA, "train.py", "", _edit(_absent_images, "an annotation with "
             "image_id 999 (no such image)"), check=_output_mentions("999", "absent", "no image", "unknown image")),
        Case("coco_duplicate_image_ids", AREA, "train.py", "", _edit(_duplicate_ids, "two images with the same id"),
             check=_output_mentions("duplicate")),
        Case("coco_no_annotations", AREA, "train.py", "", _edit(_no_annotations, "train json with an empty "
             "annotations list")),
        Case("coco_missing_image_file", AREA, "train.py", "", _edit(_missing_file, "one train JPEG deleted "
             "(data.coco.invalid=skip)"), check=_output_mentions("train_00000", "missing", "not found")),
        Case("coco_unknown_category", AREA, "train.py", "", _edit(_unknown_category, "an annotation with "
             "category_id 42 (not in categories)"), check=_output_mentions("42", "category")),
        Case("coco_file_name_outside_image_folder", AREA, "train.py", "", _edit(
            _file_name_outside, "train json file_names: one the absolute path of a val image, one '../val/...'"),
             check=_output_mentions("outside the image folder", "leaves the image folder")),
        Case("coco_file_name_outside_error", AREA, "train.py", "", _edit(
            _file_name_outside, "train json file_name: the absolute path of a val image, data.coco.invalid=error",
            overrides=("data.coco.invalid=error",))),
        Case("check_data_coco_file_name_outside", AREA, "check_data.py", "", _edit(
            _file_name_outside, "check_data.py on a train json whose file_names leave the image folder",
            tool="tools/check_data.py", args=("--quick", "--out", "{case}/report")),
             check=_output_mentions("outside the image folder", "leaves the image folder")),
        Case("coco_duplicate_annotation_ids_val", AREA, "train.py", "", _edit(
            _duplicate_annotation_ids, "val json: two annotations with the same id", json_file=VAL_JSON,
            mentions=("instances_val.json", "duplicate annotation id"))),
        Case("check_data_coco_area_not_a_number", AREA, "check_data.py", "", _edit(
            _area_not_a_number, "check_data.py on a train json with an annotation whose area is \"big\"",
            tool="tools/check_data.py", args=("--quick", "--out", "{case}/report")),
             check=_output_mentions("area")),
    ]
