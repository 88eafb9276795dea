"""n:m (2:4) structured sparsity: prune a dense model and fine-tune it with the masks kept,
or check that a checkpoint / exported model follows the pattern.

    python tools/prune_asp.py -c configs/rn50_asp.yaml -o model.weights=output/rn50_amp/latest
    python tools/prune_asp.py --check output/rn50_asp/latest       # checkpoint (.pdparams)
    python tools/prune_asp.py --check output/rn50_asp/inference    # exported model (dir or prefix)
    python tools/prune_asp.py --check output/rn50_asp/inference/inference.onnx   # its ONNX file

Pruning prints a per-layer density table and the share of parameters and FLOPs (at the
configured crop size) that became sparse. --check prints the table and exits non-zero
naming the first layer that violates the pattern.
"""
import glob
import os
import sys

from _cli import config_parser, load, run, write_report


def _legacy_export(path: str) -> bool:
    """A .pdmodel export (no .json): Paddle 3 reads it only with FLAGS_enable_pir_api=0."""
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "*.pdiparams")))
        prefix = found[0][: -len(".pdiparams")] if found else path
    else:
        prefix = path
        for suffix in (".pdiparams.info", ".pdiparams", ".pdmodel", ".json"):
            if prefix.endswith(suffix):
                prefix = prefix[: -len(suffix)]
                break
    return os.path.isfile(prefix + ".pdmodel") and not os.path.isfile(prefix + ".json")


def check(args, parser):
    if _legacy_export(args.check) and os.environ.get("FLAGS_enable_pir_api") not in ("0", "false", "False"):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "FLAGS_enable_pir_api": "0"})
    from ppdlx.sparsity.check import check_path, raise_on_violation
    from ppdlx.sparsity.report import format_table
    from ppdlx.sparsity.rules import SparsityRules
    rules, model = SparsityRules(prune_classifier=args.prune_classifier), None
    if args.config:
        cfg = load(args)
        rules = SparsityRules.from_config(cfg.asp)
        if args.prune_classifier:
            rules = SparsityRules(**{**rules.to_dict(), "prune_classifier": True})
        from ppdlx.models.from_config import build_model
        model = build_model(cfg)
    result = check_path(args.check, rules, model)
    print(f"{result['source']}: {result['format']}, pattern {result['pattern']}")
    print(format_table(result["rows"], ("layer", "kind", "shape", "params", "density", "status", "note")))
    print(f"{result['checked']} weights checked, {result['violations']} violating")
    write_report(args.report, result)
    raise_on_violation(result)
    return 0


def prune(args):
    cfg = load(args)
    from ppdlx.errors import ConfigError
    if not cfg.model.weights and not cfg.train.resume:
        raise ConfigError("model.weights is not set: ASP prunes a trained dense model; "
                          "pass -o model.weights=<dense checkpoint prefix> (or train.resume=auto to continue)")
    cfg = cfg.replace({"asp.enabled": True})
    from ppdlx import dist
    from ppdlx.engine.run import train
    from ppdlx.models.from_config import build_model
    from ppdlx.models.info import count_trainable_params, model_info
    from ppdlx.tasks.preprocess import config_resolution, resolve_preprocessing
    from ppdlx.tasks import task_of
    from ppdlx.sparsity import ASPHook, check_path, raise_on_violation
    from ppdlx.sparsity.report import add_flops, format_table, summarize, summary_lines
    hook = ASPHook.from_config(cfg.asp)
    report = train(cfg, hooks=[hook])
    if dist.rank() != 0:
        return 0
    if hook.model is None:
        from ppdlx.errors import UnsupportedError
        raise UnsupportedError(f"prune_asp: the {cfg.data.dataset} trainer did not run the ASP hook (before_train)")
    rows = hook.layer_report()
    fresh = build_model(cfg)  # a dynamic copy of the architecture (the trained one may be a static program)
    macs = model_info(fresh, config_resolution(resolve_preprocessing(cfg), fresh.default_cfg))["macs_by_layer"]
    add_flops(rows, macs)
    summary = summarize(rows, count_trainable_params(fresh), macs, hook.rules.n, hook.rules.m)
    print(format_table(rows))
    for line in summary_lines(summary):
        print(line)
    latest = os.path.join(cfg.global_.output_dir, "latest")
    checked = check_path(latest)
    task = task_of(cfg)
    print(f"final: {task.format_metrics(report, task.headline)} ({report['epochs']} epochs) -> "
          f"{report['output_dir']}; {latest}: "
          f"{checked['checked']} weights checked, {checked['violations']} violating")
    write_report(args.report, {**report, "sparsity": summary, "layers": rows,
                               "check": {k: v for k, v in checked.items() if k != "rows"}})
    raise_on_violation(checked)
    return 0


def main():
    parser = config_parser(__doc__, config_required=False)
    parser.add_argument("--check", metavar="PATH",
                        help="verify the n:m pattern of a checkpoint or exported model and exit")
    parser.add_argument("--prune-classifier", action="store_true",
                        help="with --check: the classifier must be sparse too")
    args = parser.parse_args()
    if args.check:
        return check(args, parser)
    if not args.config:
        parser.error("-c CFG is required (or --check PATH)")
    return prune(args)


if __name__ == "__main__":
    run(main)
