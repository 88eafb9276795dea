"""Export a model for deployment:
``python tools/export_model.py -c CFG -o model.weights=PREFIX [--output-dir DIR] [--onnx] [--format pir|program]``.

Writes DIR/inference.{json|pdmodel,pdiparams} (+ inference.onnx with --onnx) and DIR/inference.yml,
after checking Paddle Inference (and onnxruntime) against the dynamic model on random inputs.
DIR defaults to export.output_dir, else <global.output_dir>/inference.
"""
from _cli import config_parser, load, run, write_report


def main():
    parser = config_parser(__doc__)
    parser.add_argument("--output-dir", help="export directory (default: export.output_dir)")
    parser.add_argument("--onnx", action="store_true", default=None,
                        help="also write inference.onnx (paddle2onnx) and check it with onnxruntime")
    parser.add_argument("--format", choices=("pir", "program"), default="pir",
                        help="pir: inference.json (Paddle 3 default); program: legacy inference.pdmodel")
    parser.add_argument("--labels", help="class names, one per line (default: data.root/<train_split> folders)")
    parser.add_argument("--no-check", action="store_true", help="skip the Paddle Inference vs dynamic check")
    parser.add_argument("--atol", type=float, default=1e-4, help="check tolerance: atol + rtol * max|output|")
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--trt-opt-batch", type=int, help="TRT shape range opt batch written to inference.yml")
    parser.add_argument("--trt-max-batch", type=int, help="TRT shape range max batch written to inference.yml")
    args = parser.parse_args()
    cfg = load(args)
    from ppdlx.export import export_model, labels_from_data, read_labels
    labels = read_labels(args.labels, cfg.model.num_classes) if args.labels else labels_from_data(cfg)
    report = export_model(cfg, output_dir=args.output_dir, onnx=args.onnx, labels=labels, fmt=args.format,
                          check=not args.no_check, atol=args.atol, rtol=args.rtol,
                          trt_opt_batch=args.trt_opt_batch, trt_max_batch=args.trt_max_batch)
    print(f"export: {report['family']} {report['name']} -> {report['model_dir']} ({report['format']}: "
          f"{', '.join(i['name'] + str(i['shape']) for i in report['inputs'])} -> "
          f"{', '.join(o['name'] + ':' + o['role'] for o in report['outputs'])}; {report['seconds']:.1f} s)")
    for key, value in report["checks"].items():
        print(f"check: {key} = {value:.3g}")
    print(f"meta: {report['meta_file']}")
    write_report(args.report, report)


if __name__ == "__main__":
    run(main)
