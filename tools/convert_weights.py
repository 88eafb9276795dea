"""Convert a published checkpoint into ppdlx weights (``<PREFIX>.pdparams`` + ``.pdstates`` metadata).

    python tools/convert_weights.py --from torchvision resnet50-11ad3fa6.pth --model resnet50 --output w/rn50_tv
    python tools/convert_weights.py --from dle-gpunet 0.65ms.pth.tar --model gpunet_0 --output w/gpunet_0
    python tools/convert_weights.py --from timm model.safetensors --model resnet50 --output w/rn50 --num-classes 10

Sources: torchvision, timm, dle-paddle-rn50, dle-gpunet, effdet, lukemelas (docs/weights.md). The file
is read without PyTorch and without running code from it. Every tensor must be used exactly once and
every parameter filled, else one line names the file and the tensor. ``--num-classes`` different from
the file's leaves the classifier out: train with ``-o model.weights=PREFIX model.num_classes=N``.
"""
import argparse

from _cli import ToolParser, run, write_report


def main():
    parser = ToolParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", required=True, metavar="SOURCE", help="checkpoint layout")
    parser.add_argument("src", metavar="SRC", help="checkpoint file (.pth, .pth.tar, .safetensors, .pdparams)")
    parser.add_argument("--model", required=True, help="ppdlx model name, e.g. resnet50, gpunet_0, efficientdet_d0")
    parser.add_argument("--output", required=True, metavar="PREFIX", help="output prefix (writes .pdparams/.pdstates)")
    parser.add_argument("--num-classes", type=int, help="class count to train with (default: the file's)")
    parser.add_argument("--state-key", help="entry holding the state_dict, e.g. state_dict (default: EMA copy first)")
    parser.add_argument("--no-ema", action="store_true", help="prefer state_dict/model over state_dict_ema/model_ema")
    parser.add_argument("--report", help="write the import metadata as JSON to this file")
    args = parser.parse_args()
    from ppdlx.errors import ConfigError
    from ppdlx.checkpoint import convert_weights
    from ppdlx.weights import summary_line
    if args.num_classes is not None and args.num_classes < 1:
        raise ConfigError(f"--num-classes {args.num_classes}: must be at least 1")
    meta = convert_weights(args.source, args.src, args.model, args.output, num_classes=args.num_classes,
                           state_key=args.state_key, prefer_ema=not args.no_ema)
    print(summary_line(meta))
    for note in meta["notes"]:
        print(f"note: {note}")
    print(f"wrote {meta['output']}.pdparams; use -o model.name={meta['model']} model.num_classes={meta['num_classes']} "
          f"model.weights={meta['output']}")
    write_report(args.report, meta)


if __name__ == "__main__":
    run(main)
