"""Training curves of one or more runs: ``python tools/plot.py RUN_DIR [RUN_DIR ...] [--out PNG]``.

Reads each run directory's ``metrics.jsonl`` and draws train loss, val loss, learning rate, top-1/top-5
(or AP/AP50) and throughput per epoch into one ``curves.png``; several runs overlay, each named in the
legend by its directory and the config values (``config.yaml``) that differ between the runs.
Default output: ``RUN_DIR/curves.png`` for one run, ``./curves.png`` for several.
"""
import argparse
import os

from _cli import run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's global.output_dir")
    parser.add_argument("--out", help="PNG to write")
    parser.add_argument("--label", action="append", help="legend entry per run (repeat once per RUN_DIR)")
    args = parser.parse_args()
    from ppdlx.analysis import plot_curves
    from ppdlx.errors import ConfigError
    if args.label and len(args.label) != len(args.run_dirs):
        raise ConfigError(f"--label given {len(args.label)} times for {len(args.run_dirs)} run directories")
    out = args.out or (os.path.join(args.run_dirs[0], "curves.png") if len(args.run_dirs) == 1 else "curves.png")
    result = plot_curves(args.run_dirs, out, labels=args.label)
    for title, labels in result["panels"].items():
        print(f"{title}: {len(labels)} curve{'s' if len(labels) != 1 else ''}")
    print(f"wrote {result['path']}")


if __name__ == "__main__":
    run(main)
