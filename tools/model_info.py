"""Parameters, MACs and per-layer output shapes of a config's model at its resolution.

``python tools/model_info.py -c configs/gpunet/gpunet_0.yaml [--report info.json] [--resolution R]``

The resolution is ``--resolution``, else ``data.transforms.crop_size``, or ``data.coco.image_size``
when the model's ``default_cfg["task"]`` is detection (null: the model's ``default_cfg`` input size).
Report JSON: ``{"model", "params", "macs", "resolution", "output_shape", "layers": [{"name", "type",
"out_shape"}, ...]}`` (see ``ppdlx.models.info``).
"""
from _cli import config_parser, load, run, write_report


def main():
    parser = config_parser(__doc__)
    parser.add_argument("--resolution", type=int, help="input size (default: the config's)")
    parser.add_argument("--max-layers", type=int, default=None, help="print at most this many layer rows")
    args = parser.parse_args()
    cfg = load(args)
    from ppdlx.errors import ConfigError
    from ppdlx.models.from_config import build_model
    from ppdlx.models.info import model_info
    from ppdlx.tasks import task_of_model
    from ppdlx.tasks.preprocess import config_resolution, resolve_preprocessing
    if args.resolution is not None and args.resolution < 8:
        raise ConfigError(f"--resolution {args.resolution}: must be at least 8")
    model = build_model(cfg)
    resolution = args.resolution or config_resolution(resolve_preprocessing(cfg), model.default_cfg)
    sized = task_of_model(model.default_cfg).config_at_resolution(cfg, model, resolution)
    if sized is not cfg:  # a detection model is built for one input size (its anchors)
        cfg, model = sized, build_model(sized)
    info = {"model": cfg.model.name, **model_info(model, resolution, cfg.model.data_format)}
    rows = info["layers"] if args.max_layers is None else info["layers"][:args.max_layers]
    width = max([len(r["name"]) for r in rows] + [4])
    for r in rows:
        print(f"{r['name']:<{width}}  {r['type']:<24} {r['out_shape']}")
    if len(rows) < len(info["layers"]):
        print(f"... ({len(info['layers']) - len(rows)} more layers)")
    print(f"model {info['model']}: {info['params']:,} parameters, {info['macs']:,} MACs "
          f"({info['macs'] / 1e9:.3f} G) at {resolution}x{resolution}, output {info['output_shape']}")
    write_report(args.report, info)


if __name__ == "__main__":
    run(main)
