"""Evaluate a checkpoint: ``python tools/eval.py -c CFG -o model.weights=PREFIX [--report FILE]``."""
from _cli import config_parser, load, run, write_report


def main():
    args = config_parser(__doc__).parse_args()
    cfg = load(args)
    from ppdlx.engine.run import evaluate
    report = evaluate(cfg)
    from ppdlx.engine import dist
    if dist.rank() == 0:
        if "AP" in report:  # detection
            print(f"eval: AP {report['AP']:.4f} AP50 {report['AP50']:.4f} AP75 {report['AP75']:.4f} APs "
                  f"{report['APs']:.4f} APm {report['APm']:.4f} APl {report['APl']:.4f} AR100 {report['AR100']:.4f} "
                  f"({report['images']} images, {report['seconds']:.1f} s)")
        else:
            print(f"eval: top1 {report['top1']:.4f} top5 {report['top5']:.4f} ({report['images']} images, "
                  f"{report['seconds']:.1f} s)")
        write_report(args.report, report)


if __name__ == "__main__":
    run(main)
