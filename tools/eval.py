"""Evaluate a checkpoint: ``python tools/eval.py -c CFG -o model.weights=PREFIX [--report FILE]``."""
from _cli import config_parser, load, run, write_report


def main():
    args = config_parser(__doc__).parse_args()
    cfg = load(args)
    from ppdlx.engine.run import evaluate
    report = evaluate(cfg)
    from ppdlx.engine import dist
    if dist.rank() == 0:
        print(f"eval: top1 {report['top1']:.4f} top5 {report['top5']:.4f} ({report['images']} images, "
              f"{report['seconds']:.1f} s)")
        write_report(args.report, report)


if __name__ == "__main__":
    run(main)
