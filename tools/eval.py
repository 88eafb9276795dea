"""Evaluate a checkpoint: ``python tools/eval.py -c CFG -o model.weights=PREFIX [--report FILE] [--analysis [DIR]]``.

``--analysis`` also writes the per-class (classification) or per-category (detection) analysis --
``analysis.md`` and its figures -- to DIR (default ``<global.output_dir>/analysis``); the report holds it too.
"""
import os

from _cli import check_output_dir, config_parser, load, run, write_report


def main():
    parser = config_parser(__doc__)
    parser.add_output_dir("--analysis", nargs="?", const="", default=None, metavar="DIR",
                          help="write analysis.md and its figures to DIR (default <global.output_dir>/analysis)")
    args = parser.parse_args()
    cfg = load(args)
    analysis_dir = None
    if args.analysis is not None:
        analysis_dir = args.analysis or os.path.join(cfg.global_.output_dir, "analysis")
        if not args.analysis:  # the default comes from the config (a DIR given was checked with the arguments)
            check_output_dir("--analysis", analysis_dir)
    from ppdlx.engine.run import evaluate
    report = evaluate(cfg, analysis_dir)
    from ppdlx import dist
    if dist.rank() == 0:
        from ppdlx.tasks import task_of
        task = task_of(cfg)
        print(f"eval: {task.format_metrics(report, task.eval_headline)} ({report['images']} images, "
              f"{report['seconds']:.1f} s)")
        if "analysis" in report:
            files = report["analysis"].get("files")
            print(f"analysis: {', '.join(files.values()) if files else report['analysis'].get('skipped')}")
        write_report(args.report, report)


if __name__ == "__main__":
    run(main)
