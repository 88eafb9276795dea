"""Write the embedded demo data as an ImageFolder JPEG tree.

    python tools/prepare_demo_data.py                      # digits -> data/demo/digits
    python tools/prepare_demo_data.py --dataset fashion_mnist --limit 12000
"""
import argparse
import os

from _cli import run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits", choices=["digits", "fashion_mnist"])
    p.add_argument("--output", help="output directory (default data/demo/<dataset>)")
    p.add_argument("--size", type=int, default=32, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0, help="seed of the fixed train/val split")
    p.add_argument("--limit", type=int, help="use only the first N images (fashion_mnist)")
    args = p.parse_args()
    from ppdlx.data.demo import prepare
    out = args.output or os.path.join("data", "demo", args.dataset)
    if os.path.isdir(os.path.join(out, "train")) and os.path.isdir(os.path.join(out, "val")):
        print(f"demo data already at {out} (delete it to rewrite)")
        return 0
    counts = prepare(args.dataset, out, args.size, args.seed, args.limit)
    print(f"wrote {counts['train']} train and {counts['val']} val images to {out}")


if __name__ == "__main__":
    run(main)
