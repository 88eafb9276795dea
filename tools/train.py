"""Train a model: ``python tools/train.py -c configs/rn50_amp.yaml -o train.epochs=90``.

Works unchanged under ``python -m paddle.distributed.launch``.
"""
from _cli import config_parser, load, run, write_report


def main():
    args = config_parser(__doc__).parse_args()
    cfg = load(args)
    from ppdlx.engine.run import train
    report = train(cfg)
    from ppdlx.engine import dist
    if dist.rank() == 0:
        if "AP" in report:  # detection
            print(f"final: AP {report['AP']:.4f} AP50 {report['AP50']:.4f} AP75 {report['AP75']:.4f} "
                  f"({report.get('images', 0)} val images, {report['epochs']} epochs) -> {report['output_dir']}")
        else:
            print(f"final: top1 {report.get('top1', 0.0):.4f} top5 {report.get('top5', 0.0):.4f} "
                  f"({report.get('images', 0)} val images, {report['epochs']} epochs) -> {report['output_dir']}")
        write_report(args.report, report)


if __name__ == "__main__":
    run(main)
