"""Predict with a checkpoint (trained, or converted by tools/convert_weights.py) on the dynamic model.

    python tools/infer.py -o model.name=efficientnet_lite0 model.weights=w/lite0 --image photos/ --labels names.txt
    python tools/infer.py -c configs/demo/efficientdet_demo.yaml \
        -o model.weights=output/efficientdet_demo/best --image some.jpg --output out.png

The task the model's ``default_cfg`` names picks what is predicted (the exported-model path is deploy/'s).

Classification: ``--image`` is an image file, a folder of images, or a list file (any other file: one
image path per line, relative paths from the list file's folder; blank lines and ``#`` lines skipped).
Prints the top-k classes with their softmax scores for each image; ``--output FILE.csv`` also writes
them as CSV rows (image, rank, class_id, class_name, score), ``--output FILE.json`` as JSON (the
``--report`` content). Pre-processing (``--preprocess``): ``model`` = the model's ``default_cfg``
(what published weights expect), ``config`` = the config's ``data.transforms`` (what training used);
``auto`` (default) = ``config`` when ``-c`` is given, else ``model``. Class names, first found:
``--labels FILE`` (one per line, line k = class k), the class list saved with the checkpoint, the config's
training folders (``data.root/<train_split>``), ``class <k>``.
An image of a folder or list that cannot be read is one ``skipped PATH: cannot read image (reason)`` line
on stderr and the others are predicted; the run then ends with a line counting the skipped images and exit
code 2. An image file given alone that cannot be read is one ``error:`` line (exit 2).

Detection: one image. Prints one line per box (class, score, x1 y1 x2 y2 in image pixels) and saves
a PNG with the boxes. Class names: classes.json next to the weights (written by training), else the
config's COCO json categories.
"""
import os

from _cli import config_parser, load, run, write_report


def image_paths(path):
    """The images ``--image`` names: the image file itself, the images directly inside the folder (sorted by
    name), or the images a list file names (any file without an image extension)."""
    from ppdlx.data.image_folder import IMAGE_EXTENSIONS
    from ppdlx.errors import DataError
    if os.path.isfile(path):
        return [path] if path.lower().endswith(IMAGE_EXTENSIONS) else read_image_list(path)
    if not os.path.isdir(path):
        raise DataError(f"--image {path}: no such image file, folder or list file")
    found = sorted(os.path.join(path, f) for f in os.listdir(path) if f.lower().endswith(IMAGE_EXTENSIONS))
    if not found:
        raise DataError(f"--image {path}: no images with extensions {', '.join(IMAGE_EXTENSIONS)} in the folder")
    return found


def read_image_list(path):
    """One image path per line, relative ones from the list file's folder; blank and ``#`` lines skipped."""
    from ppdlx.data.image_folder import IMAGE_EXTENSIONS
    from ppdlx.errors import DataError
    folder = os.path.dirname(os.path.abspath(path))
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError:
        raise DataError(f"--image {path}: neither an image ({', '.join(IMAGE_EXTENSIONS)}) nor a text list of "
                        f"image paths") from None
    found = []
    for number, line in enumerate(lines, 1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        image = os.path.normpath(os.path.join(folder, entry))
        if not os.path.isfile(image):
            raise DataError(f"--image {path} line {number}: {entry}: no such image file")
        found.append(image)
    if not found:
        raise DataError(f"--image {path}: the list file names no images (one path per line)")
    return found


def read_rgb(path):
    from ppdlx.data.image_file import open_rgb
    from ppdlx.errors import DataError
    try:
        return open_rgb(path)
    except (OSError, ValueError, SyntaxError) as err:  # what Pillow raises for a damaged or foreign file
        raise DataError(f"{path}: cannot read image ({err})") from None


def readable_batches(paths, batch_size, transform, skipped=None):
    """``(paths, arrays)`` batches of ``transform(image)``. An unreadable file raises DataError; with a
    ``skipped`` list it is one ``skipped PATH: cannot read image (reason)`` line on stderr, goes into the list
    and is left out, and the next files fill its place in the batch, so results stay with their paths."""
    import sys

    from ppdlx_deploy.preprocess import readable_batches as batches_of

    from ppdlx.errors import DataError

    def skip(path, err):
        print(f"skipped {err}", file=sys.stderr)
        skipped.append(path)
    return batches_of(paths, batch_size, lambda path: transform(read_rgb(path)),
                      None if skipped is None else skip, DataError)


def prediction_format(output):
    """``--output``'s format for classification, from its extension: ``csv`` or ``json``."""
    from ppdlx.errors import ConfigError
    fmt = os.path.splitext(output)[1].lower().lstrip(".")
    if fmt not in ("csv", "json"):
        raise ConfigError(f"--output {output}: classification writes .csv or .json predictions "
                          f"(the table always prints)")
    return fmt


def class_names(args, cfg):
    """``(names, where they come from)``: ``--labels`` (what the user asked for), else the checkpoint's saved
    class list, else the training folders, else ``class <k>``."""
    from ppdlx.export import labels_from_data, read_labels
    num_classes = cfg.model.num_classes
    given = read_labels(args.labels, num_classes) if args.labels else None
    saved = saved_class_names(cfg.model.weights, num_classes)
    if given is not None:
        if saved is not None and given != saved[0]:
            names, origin = saved
            k = next(i for i, (a, b) in enumerate(zip(given, names)) if a != b)
            print(f"note: --labels {args.labels} differs from the class list saved with the checkpoint "
                  f"(class {k}: {given[k]!r} in --labels, {names[k]!r} in {origin}); showing --labels")
        return given, args.labels
    if saved is not None:
        return saved
    names = labels_from_data(cfg)
    if names is not None:
        return names, os.path.join(cfg.data.root, cfg.data.train_split)
    return [f"class {k}" for k in range(num_classes)], None


def saved_class_names(weights, num_classes):
    """``(names, where)`` of the class list saved with the checkpoint ``weights``: its ``.pdstates`` (training
    saves the class folder names there), else a ``classes.json`` beside it; None when it has neither."""
    from ppdlx.checkpoint import strip_suffix
    from ppdlx.errors import ConfigError
    from ppdlx.export.api import labels_from_checkpoint
    from ppdlx.tasks.class_list import saved_class_names as from_states
    if not weights:
        return None
    names = from_states(weights)
    if names is not None:
        if len(names) != num_classes:
            raise ConfigError(f"model.weights={weights}: its saved class list has {len(names)} names but "
                              f"model.num_classes={num_classes}; set model.num_classes={len(names)}")
        return names, strip_suffix(weights) + ".pdstates"
    names = labels_from_checkpoint(weights, num_classes)
    if names is not None:
        return names, os.path.join(os.path.dirname(os.path.abspath(weights)), "classes.json")
    return None


def write_predictions_csv(path, predictions):
    import csv
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "rank", "class_id", "class_name", "score"])
        for prediction in predictions:
            for rank, row in enumerate(prediction["top"], 1):
                writer.writerow([prediction["image"], rank, row["class_index"], row["class"], f"{row['score']:.6f}"])


def classify(args, cfg, model):
    import numpy as np
    import paddle

    from ppdlx.checkpoint import load_weights
    from ppdlx.data.transforms import EvalTransform
    from ppdlx.errors import ConfigError
    from ppdlx.tasks.preprocess import eval_transforms_changes, resolve_preprocessing
    if not cfg.model.weights:
        raise ConfigError("model.weights is not set: pass -o model.weights=<checkpoint prefix>")
    output_format = prediction_format(args.output) if args.output else None
    num_classes = cfg.model.num_classes
    paths = image_paths(args.image)
    names, names_from = class_names(args, cfg)
    missing = load_weights(model, cfg.model.weights, copy=cfg.model.weights_copy)
    if missing:
        raise ConfigError(f"model.weights={cfg.model.weights}: {len(missing)} model parameters are not in the file "
                          f"(e.g. '{missing[0]}'), so predictions would use random values")
    model.eval()
    source = args.preprocess if args.preprocess != "auto" else ("config" if args.config else "model")
    if source == "model":
        cfg = cfg.replace(eval_transforms_changes(model.default_cfg))
    else:  # what training used: the config's values, its nulls from the model's default_cfg
        cfg = resolve_preprocessing(cfg)
    t = cfg.data.transforms
    transform = EvalTransform(t, cfg.model.data_format)
    preprocess = {"source": "model default_cfg" if source == "model" else "config data.transforms",
                  "resize_short": t.resize_short, "crop_size": t.crop_size, "interpolation": t.interpolation,
                  "mean": list(t.mean), "std": list(t.std)}
    print(f"preprocess ({preprocess['source']}): shorter side {t.resize_short} ({t.interpolation}), centre crop "
          f"{t.crop_size}, (pixel - {list(t.mean)}) / {list(t.std)}")
    print(f"class names: {names_from or 'none found, class indices'}")
    k = min(args.top_k, num_classes)
    predictions, skipped = [], []
    # a folder's or list's unreadable image is skipped and the others predicted; an image file given is the run
    single_image = paths == [args.image]
    for chunk, arrays in readable_batches(paths, args.batch_size, transform, None if single_image else skipped):
        with paddle.no_grad():
            probs = paddle.nn.functional.softmax(model(paddle.to_tensor(np.stack(arrays))), axis=-1).numpy()
        for path, p in zip(chunk, probs):
            top = np.argsort(-p, kind="stable")[:k]
            rows = [{"class_index": int(c), "class": names[int(c)], "score": round(float(p[c]), 6)} for c in top]
            predictions.append({"image": path, "top": rows})
            print(path)
            for r in rows:
                print(f"  {r['score']:.4f}  {r['class_index']:>5d}  {r['class']}")
    report = {"task": "classification", "model": cfg.model.name, "weights": cfg.model.weights,
              "preprocess": preprocess, "class_names_from": names_from, "predictions": predictions,
              "skipped": skipped}
    if output_format == "csv":
        write_predictions_csv(args.output, predictions)
    elif output_format == "json":
        write_report(args.output, report, "--output")
    print(f"{len(predictions)} images, top-{k} of {num_classes} classes" + (f" -> {args.output}" if args.output
                                                                              else ""))
    write_report(args.report, report)
    if skipped:
        from ppdlx.errors import DataError
        raise DataError(f"{len(skipped)} of {len(paths)} images skipped (cannot read image); "
                        f"the other {len(predictions)} were predicted")


def detect(args, cfg, model):
    from _infer_detection import Detector, draw_detections  # infer.py's detection half: it imports paddle

    from ppdlx.errors import ConfigError
    if args.labels:
        raise ConfigError("--labels is for classification: detection names come from classes.json next to the "
                          "weights or the config's COCO json")
    if os.path.isdir(args.image):
        raise ConfigError(f"--image {args.image}: detection takes one image file, not a folder")
    del model  # the detector builds its own at data.coco.image_size
    det = Detector(cfg, nms=args.nms, score_threshold=args.score_threshold)
    image, boxes, scores, classes = det.detect(read_rgb(args.image))
    out = args.output or os.path.splitext(args.image)[0] + "_det.png"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    draw_detections(image, boxes, scores, classes, det.names).save(out, format="PNG")
    rows = []
    for b, s, c in zip(boxes.tolist(), scores.tolist(), classes.tolist()):
        name = det.names[int(c)] if 0 <= int(c) < len(det.names) else f"class {int(c)}"
        rows.append({"class": name, "class_index": int(c), "score": round(float(s), 4),
                     "box_xyxy": [round(v, 1) for v in b]})
        print(f"{name:>12s} {s:.3f}  {b[0]:.1f} {b[1]:.1f} {b[2]:.1f} {b[3]:.1f}")
    print(f"{len(rows)} boxes with score >= {args.score_threshold} -> {out}")
    write_report(args.report, {"image": args.image, "output": out, "detections": rows})


def main():
    p = config_parser(__doc__, config_required=False)
    p.add_argument("--image", required=True,
                   help="input image file (classification: or a folder of images, or a list file of image paths)")
    p.add_argument("--top-k", type=int, default=5, help="classification: classes to print per image")
    p.add_argument("--labels", help="classification: class names, one per line (line k = class k); overrides the "
                                    "class list saved with the checkpoint (a note names the first difference)")
    p.add_argument("--preprocess", choices=("auto", "model", "config"), default="auto",
                   help="classification: the model's default_cfg or the config's data.transforms "
                        "(auto: config when -c is given)")
    p.add_argument("--batch-size", type=int, default=8, help="classification: images per forward pass")
    p.add_output_file("--output", example="predictions.csv",
                      help="classification: predictions as .csv or .json; detection: PNG to write "
                           "(default: <image stem>_det.png next to the input)")
    p.add_argument("--score-threshold", type=float, default=0.3, help="detection: draw boxes with at least this score")
    p.add_argument("--nms", choices=["hard", "soft"], default="hard",
                   help="detection: hard = the exported model's per-class NMS; soft = the COCO-eval soft-NMS")
    args = p.parse_args()
    cfg = load(args)
    from ppdlx.errors import ConfigError
    if args.top_k < 1 or args.batch_size < 1:
        raise ConfigError(f"--top-k {args.top_k} / --batch-size {args.batch_size}: both must be at least 1")
    import paddle

    from ppdlx.dist import resolve_device
    from ppdlx.models.from_config import build_model
    from ppdlx.tasks import task_of_model
    paddle.set_device(resolve_device(cfg.global_.device))
    model = build_model(cfg)
    predict = PREDICT[task_of_model(model.default_cfg).name]
    return predict(args, cfg, model)


# what each task predicts for an image (the task the model's default_cfg names)
PREDICT = {"classification": classify, "detection": detect}

if __name__ == "__main__":
    run(main)
