"""Inputs of the tools around training (issue 41): a metrics.jsonl that is empty or binary for tools/plot.py, a
PyTorch zip checkpoint cut in half for tools/convert_weights.py, and HOME pointing at a regular file (``import
paddle`` creates its cache folder there)."""
from __future__ import annotations

import os
import pickle
import zipfile

from .battery import Case, Run
from .faults import garble, truncate, write_text

AREA = "tools"


def _plot(kind):
    def prepare(ctx):
        path = ctx.path("run", "metrics.jsonl")
        write_text(path, "")
        if kind == "binary":
            garble(path)
        return Run(ctx.tool("tools/plot.py", ctx.path("run")), mentions=["metrics.jsonl"],
                   description=f"tools/plot.py on a run whose metrics.jsonl is {kind}")
    return prepare


def _cut_torch_zip(ctx):
    path = ctx.path("model.pth")
    with zipfile.ZipFile(path, "w") as zf:  # the layout of torch.save: <archive>/data.pkl and its storages
        zf.writestr("archive/data.pkl", pickle.dumps({"fc.bias": "storage 0"}, protocol=2))
        zf.writestr("archive/data/0", os.urandom(1 << 16))
    truncate(path)
    return Run(ctx.tool("tools/convert_weights.py", "--from", "torchvision", path, "--model", "resnet50", "--output",
                        ctx.path("converted")), mentions=["model.pth", "cut short"],
               description="convert_weights --from torchvision a torch.save zip cut in half")


def _home_is_a_file(ctx):
    home = write_text(ctx.path("home"), "a file where HOME's directory should be\n")
    return Run(ctx.train(ctx.path("out"), epochs=1), mentions=["HOME"], env={"HOME": home},
               description="HOME points at a regular file (import paddle creates $HOME/.cache)")


def cases():
    return [
        Case("plot_empty_metrics", AREA, "plot.py", "", _plot("empty")),
        Case("plot_binary_metrics", AREA, "plot.py", "", _plot("binary")),
        Case("convert_truncated_torch_zip", AREA, "convert_weights.py", "", _cut_torch_zip),
        Case("home_is_a_file", AREA, "train.py", "", _home_is_a_file),
    ]
