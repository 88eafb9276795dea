"""Evaluate a checkpoint: ``python tools/eval.py -c CFG -o model.weights=PREFIX [--report FILE]``."""
from _cli import config_parser, load, run, write_report


def main():
    args = config_parser(__doc__).parse_args()
    cfg = load(args)
    from ppdlx.engine.run import evaluate
    report = evaluate(cfg)
    from ppdlx.engine import dist
    if dist.rank() == 0:
        from ppdlx.engine.tasks import task_of
        task = task_of(cfg)
        print(f"eval: {task.format_metrics(report, task.eval_headline)} ({report['images']} images, "
              f"{report['seconds']:.1f} s)")
        write_report(args.report, report)


if __name__ == "__main__":
    run(main)
