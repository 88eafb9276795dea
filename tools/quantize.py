"""int8 post-training quantization of a classifier for Paddle Inference on CPU (oneDNN) and Paddle-TRT:
``python tools/quantize.py -c CFG -o model.weights=PREFIX --calib-images DIR --output-dir DIR``
``    [--num-images N] [--algo abs_max] [--eval-images DIR] [--benchmark-rounds R]``

Exports the configured model as a legacy program (fp32, checked against the dynamic model), calibrates it
on images under --calib-images (pre-processed as the export's inference.yml says) and writes an export
directory that ``deploy/python/infer.py --precision int8`` runs: inference.pdmodel/.pdiparams with
quantize_linear/dequantize_linear ops, and inference.yml with ``precision: int8`` and the calibration.
The fp32 and int8 predictions are compared on --eval-images (an ImageFolder split: top-1 of both) or on
the calibration images; below --min-agreement nothing is written. See docs/int8.md.
"""
import shutil
import tempfile

from _cli import config_parser, load, run, write_report


def main():
    from ppdlx.quantization.ptq import (ALGOS, DEFAULT_ALGO, DEFAULT_BATCH_SIZE, DEFAULT_MIN_AGREEMENT,
                                       DEFAULT_NUM_IMAGES)
    parser = config_parser(__doc__)
    parser.add_argument("--calib-images", required=True, help="calibration images (any depth; e.g. data.root/train)")
    parser.add_argument("--output-dir", required=True, help="where the int8 export is written")
    parser.add_count("--num-images", minimum=1, default=DEFAULT_NUM_IMAGES,
                     help="calibration images used, evenly spread over the sorted files")
    parser.add_argument("--algo", choices=ALGOS, default=DEFAULT_ALGO, help="activation range algorithm")
    parser.add_count("--batch-size", minimum=1, default=DEFAULT_BATCH_SIZE, help="calibration batch size")
    parser.add_argument("--eval-images", help="ImageFolder split to compare fp32 and int8 on (adds top-1; "
                                              "default: the calibration images)")
    parser.add_argument("--min-agreement", type=float, default=DEFAULT_MIN_AGREEMENT,
                        help="refuse the int8 model below this fraction of images with the fp32 top-1")
    parser.add_argument("--no-check", action="store_true", help="skip the fp32-vs-int8 comparison")
    parser.add_argument("--activation-headroom", type=float,
                        help="factor on every calibrated activation range (default: 2 on CPUs without VNNI, whose "
                             "oneDNN int8 kernels saturate 16-bit sums, else 1; docs/int8.md)")
    parser.add_argument("--fp32-dir", help="keep the fp32 export here (default: a temporary directory, removed)")
    parser.add_argument("--labels", help="class names, one per line (default: as tools/export_model.py finds them)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the comparison predictors")
    parser.add_argument("--benchmark-rounds", type=int, default=0,
                        help="then time paddle-cpu fp32 / int8 and onnxruntime fp32 with deploy's predictors, this "
                             "many rounds (each runtime in a fresh process per round, order alternating)")
    parser.add_argument("--benchmark-batch-sizes", default="1,8")
    parser.add_argument("--benchmark-threads", type=int, help="threads of every timed runtime (default: usable cores)")
    parser.add_argument("--random-weights", action="store_true",
                        help="quantise without model.weights: random initial values (int8 speed tests)")
    args = parser.parse_args()
    cfg = load(args)

    from ppdlx.errors import ConfigError, UnsupportedError
    from ppdlx.export import export_model, read_labels
    from ppdlx.export.api import require_weights
    require_weights(cfg, args.random_weights, "quantise")
    from ppdlx.quantization.images import labelled_images, list_images
    from ppdlx.quantization.ptq import check_output_dir, quantize
    list_images(args.calib_images)  # a missing or empty directory is one line now, not after the export
    from ppdlx.export.files import ensure_output_dir
    ensure_output_dir(args.output_dir)  # an unwritable output is one line now, not after the calibration
    check_output_dir(args.output_dir)  # and another export there is never replaced
    if args.fp32_dir:
        ensure_output_dir(args.fp32_dir, "--fp32-dir")
    if args.eval_images:
        labelled_images(args.eval_images, None)
    try:
        sizes = [int(b) for b in args.benchmark_batch_sizes.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if args.benchmark_rounds and (not sizes or min(sizes) < 1):
        raise ConfigError(f"--benchmark-batch-sizes {args.benchmark_batch_sizes}: give positive integers, e.g. 1,8")
    labels = read_labels(args.labels, cfg.model.num_classes) if args.labels else None  # None: export_model finds them

    fp32_dir = args.fp32_dir or tempfile.mkdtemp(prefix="ppdlx_fp32_")
    try:
        try:
            exported = export_model(cfg, output_dir=fp32_dir, onnx=args.benchmark_rounds > 0, labels=labels,
                                    fmt="program")
        except UnsupportedError as err:
            raise UnsupportedError(f"int8: the calibration needs a legacy-program export of {cfg.model.name}, "
                                   f"which fails: {err}") from None
        print(f"export: {cfg.model.name} fp32 -> {exported['model_dir']} ({exported['seconds']:.1f} s)")
        report = quantize(fp32_dir, args.calib_images, args.output_dir, num_images=args.num_images,
                          algo=args.algo, batch_size=args.batch_size, eval_dir=args.eval_images,
                          check=not args.no_check, min_agreement=args.min_agreement, threads=args.threads,
                          activation_headroom=args.activation_headroom)
        ops = report["ops"]
        print(f"int8: {report['model_dir']} ({report['calibration']['images']} calibration images, {args.algo}; "
              f"{ops['quantize_linear']} quantize_linear + {ops['dequantize_linear']} dequantize_linear ops; "
              f"{report['seconds']:.1f} s)")
        headroom = report["activation_headroom"]
        print(f"activation ranges x {headroom['factor']:g} ({headroom['reason']})")
        check = report.get("check")
        if check:
            line = (f"check: top-1 agreement {100 * check['top1_agreement']:.2f} % on {check['images']} "
                    f"{'images of ' + check['directory'] if args.eval_images else 'calibration images'}")
            if "int8_top1" in check:
                line += (f"; top-1 fp32 {100 * check['fp32_top1']:.2f} %, int8 {100 * check['int8_top1']:.2f} % "
                         f"(drop {check['top1_drop_points']:.2f} points)")
            print(line)
        print(f"meta: {report['meta_file']}")
        if args.benchmark_rounds:
            from benchmarks.infer_int8 import compare_latency, format_latency
            report["latency"] = compare_latency(fp32_dir, args.output_dir, sizes, rounds=args.benchmark_rounds,
                                                threads=args.benchmark_threads,
                                                progress=lambda line: print(line, flush=True))
            print(format_latency(report["latency"]))
        write_report(args.report, report)
    finally:
        if not args.fp32_dir:
            shutil.rmtree(fp32_dir, ignore_errors=True)


if __name__ == "__main__":
    run(main)
