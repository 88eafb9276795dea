"""Train a model: ``python tools/train.py -c configs/rn50_amp.yaml -o train.epochs=90``.

Works unchanged under ``python -m paddle.distributed.launch``.
"""
from _cli import config_parser, load, run, write_report


def main():
    args = config_parser(__doc__).parse_args()
    cfg = load(args)
    from ppdlx.engine.run import train
    report = train(cfg)
    from ppdlx import dist
    if dist.rank() == 0:
        from ppdlx.tasks import task_of
        task = task_of(cfg)
        print(f"final: {task.format_metrics(report, task.headline)} ({report.get('images', 0)} val images, "
              f"{report['epochs']} epochs) -> {report['output_dir']}")
        write_report(args.report, report)


if __name__ == "__main__":
    run(main)
