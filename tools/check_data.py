"""Check a config's train/val data before training: ``python tools/check_data.py -c CFG [-o k=v ...]``.

Prints per split the image and class counts (and the imbalance), image sizes, files the configured loader
cannot decode, files repeated across train/val; for COCO also boxes per image, COCO's small/medium/large
counts, boxes per category and boxes at or past the image border. Writes ``data_report.md`` and
``data_samples.png`` to ``--out`` (default: the config's ``global.output_dir``). Exits non-zero with one
line when the data cannot train (no images, a class without any, train/val classes that differ, ...).
"""
import argparse

from _cli import check_output_dir, config_parser, load, run, write_report


def main():
    parser = config_parser(__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_output_dir("--out", help="directory for data_report.md and data_samples.png "
                                        "(default: global.output_dir)")
    parser.add_count("--samples", minimum=0, default=8,
                     help="images per class (classification) or images (detection) in data_samples.png")
    parser.add_argument("--quick", action="store_true",
                        help="count files and read annotations only: no decoding, no content hashes")
    args = parser.parse_args()
    cfg = load(args)
    out_dir = args.out or cfg.global_.output_dir
    if not args.out:  # the default comes from the config (an --out given was checked with the arguments)
        check_output_dir("--out", out_dir)
        from ppdlx.data.data_dirs import refuse_output_inside_data
        refuse_output_inside_data(cfg, out_dir)  # as training would: its folder would become part of the data
    from ppdlx.analysis import check_data, plotting_available
    from ppdlx.analysis.figures import PLOT_EXTRA
    report = check_data(cfg, decode=not args.quick, hash_files=not args.quick, config_path=args.config)
    print(report.table())
    figures = plotting_available() and args.samples > 0
    written = report.write(out_dir, samples=args.samples, figures=figures)
    if not figures and args.samples > 0:
        print(f"data_samples.png not drawn: matplotlib is not installed ({PLOT_EXTRA})")
    print("wrote " + ", ".join(written.values()))
    write_report(args.report, report.to_dict())
    report.raise_if_unusable()


if __name__ == "__main__":
    run(main)
