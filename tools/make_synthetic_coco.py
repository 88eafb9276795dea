"""Write the synthetic COCO-format shapes set (coloured circles / squares / triangles, exact boxes).

    python tools/make_synthetic_coco.py                    # -> data/demo/shapes_coco
    python tools/make_synthetic_coco.py --train 512 --val 128 --output /tmp/shapes

Layout: <out>/{train,val}/*.jpg and <out>/annotations/instances_{train,val}.json
(category ids 1, 3, 7 = circle, square, triangle). Seeded: the same arguments give the same files.
"""
import argparse
import os

from _cli import run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default=os.path.join("data", "demo", "shapes_coco"))
    p.add_argument("--train", type=int, default=256, help="training images")
    p.add_argument("--val", type=int, default=32, help="validation images")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--min-size", type=int, default=64, help="smallest image side in pixels")
    p.add_argument("--max-size", type=int, default=96, help="largest image side in pixels")
    p.add_argument("--max-objects", type=int, default=2, help="shapes per image (1..N)")
    p.add_argument("--object-min", type=float, default=0.35, help="smallest shape side / image side")
    p.add_argument("--object-max", type=float, default=0.7, help="largest shape side / image side")
    p.add_argument("--force", action="store_true", help="rewrite an existing set")
    args = p.parse_args()
    from ppdlx.data.synthetic_coco import make_synthetic_coco
    if os.path.isfile(os.path.join(args.output, "annotations", "instances_val.json")) and not args.force:
        print(f"synthetic COCO set already at {args.output} (--force to rewrite)")
        return 0
    paths = make_synthetic_coco(args.output, args.train, args.val, args.seed, (args.min_size, args.max_size),
                                (args.object_min, args.object_max), args.max_objects)
    print(f"wrote {args.train} train and {args.val} val images to {args.output} ({paths['train']}, {paths['val']})")


if __name__ == "__main__":
    run(main)
