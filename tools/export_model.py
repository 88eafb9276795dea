"""Export a model for deployment:
``python tools/export_model.py -c CFG -o model.weights=PREFIX [--output-dir DIR] [--onnx] [--format pir|program]``.

Writes DIR/inference.{json|pdmodel,pdiparams} (+ inference.onnx with --onnx) and DIR/inference.yml,
after checking Paddle Inference (and onnxruntime) against the dynamic model on random inputs.
DIR defaults to export.output_dir, else <global.output_dir>/inference.

``--verify [val|PATH]`` then runs the export through the deploy package (raw image files,
inference.yml) on every backend this machine offers and compares it with ppdlx's evaluator on the
same images (docs/verify.md); the figures go into inference.yml and the report, and a failed gate
exits 1 with one line naming the cause (labels, pre-processing or numerics). ``--verify-only``
verifies DIR as it is (e.g. an int8 export from tools/quantize.py) without exporting.
"""
from _cli import config_parser, load, run, write_report


def main():
    parser = config_parser(__doc__)
    parser.add_argument("--output-dir", help="export directory (default: export.output_dir)")
    parser.add_argument("--onnx", action="store_true", default=None,
                        help="also write inference.onnx (paddle2onnx) and check it with onnxruntime")
    parser.add_argument("--format", choices=("pir", "program"),
                        help="pir: inference.json (Paddle 3 default); program: legacy inference.pdmodel (default for "
                             "a qat.enabled classifier: its int8 program)")
    parser.add_argument("--labels", help="class names, one per line (default: the data's class folders / COCO "
                                         "categories, else classes.json next to model.weights)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the checks on random inputs against the dynamic model (Paddle Inference and, with "
                             "--onnx, onnxruntime); --verify still runs")
    parser.add_argument("--atol", type=float, default=1e-4, help="check tolerance: atol + rtol * max|output|")
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--trt-opt-batch", type=int, help="TRT shape range opt batch written to inference.yml")
    parser.add_argument("--trt-max-batch", type=int, help="TRT shape range max batch written to inference.yml")
    parser.add_argument("--verify", nargs="?", const="val", metavar="val|PATH",
                        help="after exporting, compare the deployed model with ppdlx's evaluator on the val split "
                             "(or on a dataset root laid out like data.root)")
    parser.add_argument("--verify-images", type=int, metavar="N", help="verify on N images spread over the split "
                                                                        "(default: all)")
    parser.add_argument("--max-drop", type=float, default=1.0,
                        help="bf16/int8: largest allowed top-1 (detection: AP x 100) drop in points (default 1)")
    parser.add_argument("--verify-only", action="store_true",
                        help="verify the export already in --output-dir instead of exporting")
    parser.add_argument("--threads", type=int, help="CPU threads of the verify predictors (default: usable cores)")
    parser.add_argument("--random-weights", action="store_true",
                        help="export without model.weights: random initial values (speed tests; inference.yml "
                             "says so)")
    args = parser.parse_args()
    cfg = load(args)
    from ppdlx.errors import ConfigError
    from ppdlx.export import export_model, read_labels
    from ppdlx.export.api import require_weights
    if args.verify_only and not args.verify:
        args.verify = "val"
    if args.verify_only:
        output_dir = args.output_dir or cfg.export.output_dir
        if not output_dir:
            raise ConfigError("--verify-only: give --output-dir (the export directory to verify)")
        report = {"model_dir": output_dir}
    else:
        require_weights(cfg, args.random_weights, "export")
        labels = read_labels(args.labels, cfg.model.num_classes) if args.labels else None
        report = export_model(cfg, output_dir=args.output_dir, onnx=args.onnx, labels=labels, fmt=args.format,
                              check=not args.no_check, atol=args.atol, rtol=args.rtol,
                              trt_opt_batch=args.trt_opt_batch, trt_max_batch=args.trt_max_batch)
        print(f"export: {report['family']} {report['name']} -> {report['model_dir']} ({report['format']}: "
              f"{', '.join(i['name'] + str(i['shape']) for i in report['inputs'])} -> "
              f"{', '.join(o['name'] + ':' + o['role'] for o in report['outputs'])}; {report['seconds']:.1f} s)")
        for key, value in report["checks"].items():
            print(f"check: {key} = {value:.3g}")
        print(f"meta: {report['meta_file']}")
    if args.verify:
        from ppdlx.export.verify import format_record, raise_on_failure, verify_export
        record = verify_export(cfg, report["model_dir"], source=args.verify, max_images=args.verify_images,
                               max_drop=args.max_drop, threads=args.threads)
        for line in format_record(record):
            print(line)
        report["verify"] = record
        write_report(args.report, report)
        raise_on_failure(record)
        return 0
    write_report(args.report, report)


if __name__ == "__main__":
    run(main)
