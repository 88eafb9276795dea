"""Export, deploy and the tools around them: damaged export files (``.pdiparams``, ``.json``,
``.pdmodel``, ``inference.yml``, ``.onnx``) under deploy, ``--verify-only`` and ``--check``;
non-finite weights in training, export and eval (issue 15, item 3); bad inputs of quantize,
convert_weights, infer and benchmark."""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from .battery import Case, Run
from .faults import (all_checkpoint_files, checkpoint_file, empty, flip_bytes, garble,
                                      nonfinite_tensors, read_params, truncate, write_params, write_text)

EXPORT, DEPLOY, NAN, TOOLS = "export", "deploy", "NaN/inf", "tools"
DAMAGE = {"truncated": truncate, "garbled": garble, "empty": empty,
          "cut_100_bytes": lambda path: truncate(path, 1 - 100 / os.path.getsize(path)),
          "bit_flipped": lambda path: flip_bytes(path, 16)}


def _damaged_export(fixture, file, kind, consumer, backend="paddle-cpu"):
    def prepare(ctx):
        model_dir = ctx.copy(fixture, "model")
        path = os.path.join(model_dir, file)
        damage = kind
        if kind.startswith("unrecorded_"):  # as an export written before inference.yml recorded its files
            _drop_section(os.path.join(model_dir, "inference.yml"), "files")
            damage = kind[len("unrecorded_"):]
        if damage == "missing":
            os.remove(path)
        elif damage == "not_a_mapping":
            write_text(path, "- a list\n- not the ppdlx_inference mapping\n")
        elif damage == "no_preprocess":
            _drop_section(path, "preprocess")
        else:
            DAMAGE[damage](path)
        if consumer == "deploy":
            argv = ctx.deploy(model_dir, "--input", ctx.an_image(), "--backend", backend)
        elif consumer == "verify":
            weights = os.path.join(ctx.fx.get("run"), "latest")
            argv = ctx.classification("tools/export_model.py", f"model.weights={weights}", args=(
                "--verify-only", "--output-dir", model_dir, "--verify-images", "8"))
        elif consumer == "check":
            argv = ctx.tool("tools/prune_asp.py", "--check",
                            path if file.endswith(".onnx") else model_dir)
        else:
            raise ValueError(consumer)
        return Run(argv, mentions=[file] + (["preprocess"] if kind == "no_preprocess" else []),
                   description=f"{kind.replace('_', ' ')} {file} ({fixture.replace('_', ' ')})"
                   + (f", --backend {backend}" if consumer == "deploy" else ""))
    return prepare


def _drop_section(path, key):
    import yaml
    with open(path, encoding="utf-8") as f:
        meta = yaml.safe_load(f)
    meta.pop(key, None)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(meta, f, sort_keys=False)


def _export_case(name, fixture, file, kind, consumer, area=DEPLOY, tool="deploy/python/infer.py",
                 backend="paddle-cpu"):
    """A damaged export file: naming it is the fix (write it again), so no further fix is required."""
    return Case(name, area, tool, "", _damaged_export(fixture, file, kind, consumer, backend),
                needs_fix=kind in ("no_preprocess", "not_a_mapping"))


# ------------------------------------------------------------------------------------------ non-finite

def _nonfinite_weights(ctx, value):
    """A copy of the run's latest weights with one tensor set to ``value``; returns (prefix, tensor name)."""
    params = read_params(checkpoint_file(ctx.fx.get("run"), "latest", "pdparams"))
    name = sorted(k for k in params if k.endswith("weight") and params[k].ndim == 4)[3]
    params[name] = np.full_like(params[name], value)
    os.makedirs(ctx.path("bad"), exist_ok=True)
    write_params(ctx.path("bad", "weights.pdparams"), params)
    return ctx.path("bad", "weights"), name


def _export_nonfinite(value, word):
    def prepare(ctx):
        prefix, name = _nonfinite_weights(ctx, value)
        return Run(ctx.export(prefix, ctx.path("export")), mentions=[word, name],
                   description=f"export weights whose '{name}' is {word}")
    return prepare


def _eval_nan(ctx):
    prefix, name = _nonfinite_weights(ctx, np.nan)
    return Run(ctx.classification("tools/eval.py", f"model.weights={prefix}"), mentions=["NaN", name],
               description=f"eval weights whose '{name}' is NaN")


def _train_diverges(graph):
    def prepare(ctx):
        out = ctx.path("out")
        return Run(ctx.train(out, "lr.base_lr=1e6", f"train.graph={graph}"), mentions=["NaN"],
                   description=f"lr.base_lr=1e6, train.graph={graph}", facts={"out": out})
    return prepare


def _no_nonfinite_checkpoint(ctx, run, result):
    for path in all_checkpoint_files(run.facts["out"]):
        if path.endswith(".pdparams") and nonfinite_tensors(path):
            return f"saved non-finite weights in {os.path.relpath(path, ctx.dir)}"
    return None


# ------------------------------------------------------------------------------------------ tools

def _deploy_args(description, mentions, *args, image=True):
    def prepare(ctx):
        model_dir = ctx.fx.get("export")
        extra = ("--input", ctx.an_image()) if image else ()
        return Run(ctx.deploy(model_dir, *extra, *args), mentions=list(mentions), description=description)
    return prepare


def _deploy_bad_image(kind):
    def prepare(ctx):
        image = ctx.path("images", "bad.jpg")
        os.makedirs(os.path.dirname(image))
        if kind == "empty":
            empty(image)
        else:
            write_text(image, "this is not a JPEG\n")
        return Run(ctx.deploy(ctx.fx.get("export"), "--input", image), mentions=["bad.jpg"],
                   description=f"deploy --input a {'zero-byte' if kind == 'empty' else 'text'} file named bad.jpg")
    return prepare


def _deploy_missing_input(ctx):
    return Run(ctx.deploy(ctx.fx.get("export"), "--input", ctx.path("nowhere.jpg")), mentions=["nowhere.jpg"],
               description="deploy --input names a file that does not exist")


def _export_unwritable(ctx):
    blocker = write_text(ctx.path("blocker"), "a file where a directory is needed\n")
    return Run(ctx.export(os.path.join(ctx.fx.get("run"), "latest"), os.path.join(blocker, "export")),
               mentions=["blocker"], description="export --output-dir under a regular file")


def _quantize_unwritable(ctx):
    blocker = write_text(ctx.path("blocker"), "a file where a directory is needed\n")
    weights = os.path.join(ctx.fx.get("run"), "latest")
    return Run(ctx.classification("tools/quantize.py", f"model.weights={weights}", args=(
        "--calib-images", os.path.join(ctx.fx.get("digits"), "val"), "--output-dir", os.path.join(blocker, "int8"),
        "--num-images", "8")), mentions=["blocker"], description="quantize --output-dir under a regular file")


def _deploy_report_unwritable(ctx):
    blocker = write_text(ctx.path("blocker"), "a file where a directory is needed\n")
    return Run(ctx.deploy(ctx.fx.get("export"), "--input", ctx.an_image(), "--benchmark", "--warmup", "1",
                          "--repeats", "2", "--report", os.path.join(blocker, "bench.json")), mentions=["blocker"],
               description="deploy --benchmark --report under a regular file")


def _infer_empty_image(ctx):
    image = empty(ctx.path("empty.jpg"))
    weights = os.path.join(ctx.fx.get("run"), "latest")
    return Run(ctx.classification("tools/infer.py", f"model.weights={weights}", args=("--image", image)),
               mentions=["empty.jpg"], description="tools/infer.py --image a zero-byte JPEG")


def _quantize(description, mentions, calib):
    def prepare(ctx):
        directory = calib(ctx)
        weights = os.path.join(ctx.fx.get("run"), "latest")
        return Run(ctx.classification("tools/quantize.py", f"model.weights={weights}", args=(
            "--calib-images", directory, "--output-dir", ctx.path("int8"), "--num-images", "8")),
            mentions=list(mentions), description=description)
    return prepare


def _calib_empty(ctx):
    os.makedirs(ctx.path("calib"))
    return ctx.path("calib")


def _calib_zero_byte(ctx):
    os.makedirs(ctx.path("calib"))
    empty(ctx.path("calib", "a_empty.jpg"))
    return ctx.path("calib")


def _safetensors(path):
    """A one-tensor safetensors file cut inside its data."""
    header = json.dumps({"fc.weight": {"dtype": "F32", "shape": [10, 128], "data_offsets": [0, 5120]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0" * 1000)
    return path


DESCRIBE_SOURCE = {"safetensors": "truncated .safetensors", "pth": "random-bytes .pth"}


def _convert(kind):
    def prepare(ctx):
        if kind == "safetensors":
            src, source = _safetensors(ctx.path("model.safetensors")), "timm"
        else:
            src, source = garble(write_text(ctx.path("model.pth"), "x" * 4096)), "torchvision"
        return Run(ctx.tool("tools/convert_weights.py", "--from", source, src, "--model", "resnet50", "--output",
                            ctx.path("converted")), mentions=[os.path.basename(src)],
                   description=f"convert_weights --from {source} a {DESCRIBE_SOURCE[kind]}")
    return prepare


def _benchmark_prepare(ctx):
    argv = ctx.tool("tools/benchmark.py", "train", "-c", "configs/demo/rn50_demo.yaml", "--steps", "0", "-o",
                    "model.name=resnet18_bottleneck_tiny", f"data.root={ctx.fx.get('digits')}")
    return Run(argv, mentions=["--steps"], description="benchmark.py train --steps 0")


# Damaged export files deploy/python/infer.py must name: (case, fixture, file, kind)
DAMAGED_FOR_DEPLOY = (
    ("deploy_truncated_pdiparams", "export", "inference.pdiparams", "truncated"),
    ("deploy_empty_pdiparams", "export", "inference.pdiparams", "empty"),
    ("deploy_missing_pdiparams", "export", "inference.pdiparams", "missing"),
    ("deploy_pdiparams_cut_100_bytes", "export", "inference.pdiparams", "cut_100_bytes"),
    ("deploy_bit_flipped_pdiparams", "export", "inference.pdiparams", "bit_flipped"),
    ("deploy_unrecorded_pdiparams_cut_100_bytes", "export", "inference.pdiparams", "unrecorded_cut_100_bytes"),
    ("deploy_truncated_json", "export", "inference.json", "truncated"),
    ("deploy_garbled_json", "export", "inference.json", "garbled"),
    ("deploy_truncated_pdmodel", "export_program", "inference.pdmodel", "truncated"),
    ("deploy_empty_pdmodel", "export_program", "inference.pdmodel", "empty"),
    ("deploy_unrecorded_garbled_pdmodel", "export_program", "inference.pdmodel", "unrecorded_garbled"),
    ("deploy_truncated_inference_yml", "export", "inference.yml", "truncated"),
    ("deploy_inference_yml_not_a_mapping", "export", "inference.yml", "not_a_mapping"),
    ("deploy_inference_yml_no_preprocess", "export", "inference.yml", "no_preprocess"),
)


def cases():
    return [
        *(_export_case(name, fixture, file, kind, "deploy") for name, fixture, file, kind in DAMAGED_FOR_DEPLOY),
        _export_case("deploy_truncated_onnx", "export", "inference.onnx", "truncated", "deploy",
                     backend="onnxruntime"),
        _export_case("verify_only_truncated_pdiparams", "export", "inference.pdiparams", "truncated", "verify",
                     area=EXPORT, tool="export_model.py --verify-only"),
        _export_case("prune_check_truncated_pdiparams", "export", "inference.pdiparams", "truncated", "check",
                     area="checkpoints", tool="prune_asp.py --check"),
        _export_case("prune_check_truncated_onnx", "export", "inference.onnx", "truncated", "check",
                     area="checkpoints", tool="prune_asp.py --check"),
        Case("deploy_batch_size_zero", DEPLOY, "deploy/python/infer.py", "",
             _deploy_args("deploy --batch-size 0", ["--batch-size"], "--batch-size", "0")),
        Case("deploy_missing_input", DEPLOY, "deploy/python/infer.py", "", _deploy_missing_input, needs_fix=False),
        Case("deploy_empty_image", DEPLOY, "deploy/python/infer.py", "", _deploy_bad_image("empty"), needs_fix=False),
        Case("deploy_text_as_image", DEPLOY, "deploy/python/infer.py", "", _deploy_bad_image("text"),
             needs_fix=False),
        Case("export_output_dir_unwritable", EXPORT, "export_model.py", "", _export_unwritable),
        Case("quantize_output_dir_unwritable", TOOLS, "quantize.py", "", _quantize_unwritable),
        Case("deploy_report_unwritable", DEPLOY, "deploy/python/infer.py", "", _deploy_report_unwritable),
        Case("export_nan_weights", NAN, "export_model.py", "", _export_nonfinite(np.nan, "NaN")),
        Case("export_inf_weights", NAN, "export_model.py", "", _export_nonfinite(np.inf, "inf")),
        Case("eval_nan_weights", NAN, "eval.py", "", _eval_nan),
        Case("train_lr_1e6_dynamic", NAN, "train.py", "", _train_diverges("dynamic"), after=_no_nonfinite_checkpoint),
        Case("train_lr_1e6_static", NAN, "train.py", "", _train_diverges("static"), after=_no_nonfinite_checkpoint),
        Case("infer_empty_image", TOOLS, "infer.py", "", _infer_empty_image, needs_fix=False),
        Case("quantize_empty_calib_dir", TOOLS, "quantize.py", "", _quantize(
            "quantize --calib-images an empty directory", ["calib"], _calib_empty), needs_fix=False),
        Case("quantize_zero_byte_calib_image", TOOLS, "quantize.py", "", _quantize(
            "quantize --calib-images holding one zero-byte JPEG", ["a_empty.jpg"], _calib_zero_byte),
             needs_fix=False),
        Case("convert_truncated_safetensors", TOOLS, "convert_weights.py", "", _convert("safetensors"),
             needs_fix=False),
        Case("convert_random_bytes_pth", TOOLS, "convert_weights.py", "", _convert("pth"), needs_fix=False),
        Case("benchmark_zero_steps", TOOLS, "benchmark.py", "", _benchmark_prepare),
    ]
