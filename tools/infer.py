"""Detect objects in an image with a trained detection checkpoint and save a PNG with the boxes.

    python tools/infer.py -c configs/demo/efficientdet_demo.yaml \
        -o model.weights=output/efficientdet_demo/best --image some.jpg --output out.png

Uses the dynamic model + weights (the exported-model path is deploy/'s). Prints one line per
box (class, score, x1 y1 x2 y2 in image pixels). Class names: classes.json next to the weights
(written by training), else the config's COCO json categories.
"""
import os

from _cli import config_parser, load, run, write_report


def main():
    p = config_parser(__doc__)
    p.add_argument("--image", required=True, help="input image file")
    p.add_argument("--output", help="PNG to write (default: <image stem>_det.png next to the input)")
    p.add_argument("--score-threshold", type=float, default=0.3, help="draw boxes with at least this score")
    p.add_argument("--nms", choices=["hard", "soft"], default="hard",
                   help="hard = the exported model's per-class NMS; soft = the COCO-eval soft-NMS")
    args = p.parse_args()
    cfg = load(args)
    from ppdlx.engine.builders import resolve_device
    import paddle
    paddle.set_device(resolve_device(cfg.global_.device))
    from ppdlx.engine.detect_image import Detector, draw_detections
    det = Detector(cfg, nms=args.nms, score_threshold=args.score_threshold)
    image, boxes, scores, classes = det.detect(args.image)
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


if __name__ == "__main__":
    run(main)
