"""The files of an exported model, checked before ``--check`` reads them: Paddle's loader names no file when the
weights are damaged (``Cannot read tensor desc size``) and onnx's parser raises a bare protobuf DecodeError, so a
damaged export would be a traceback or a line that does not say which file to write again. The checks are the
deploy package's own (``ppdlx_deploy.integrity``: the sizes and hashes inference.yml recorded, else the file
structure)."""
from __future__ import annotations

import os

from ppdlx_deploy import META_FILE, DeployError, load_meta
from ppdlx_deploy.integrity import check_export_files, check_onnx_file

from ppdlx.errors import DataError

REEXPORT_ONNX = "re-export the model with tools/export_model.py --onnx"


def check_inference_files(prefix: str, program_ext: str) -> None:
    """``prefix`` + ``program_ext`` (".json" | ".pdmodel") and ``prefix.pdiparams`` as deploy checks them;
    ``DataError`` naming the damaged file. inference.yml's record is used when it describes this prefix."""
    model_dir = os.path.dirname(prefix) or "."
    try:
        meta = None
        if os.path.isfile(os.path.join(model_dir, META_FILE)):
            meta = load_meta(model_dir)
            if os.path.splitext(meta["model"]["params_file"])[0] != os.path.basename(prefix):
                meta = None  # it describes another export in the same folder
        check_export_files({"model_file": prefix + program_ext, "params_file": prefix + ".pdiparams"}, meta)
    except DeployError as err:
        raise DataError(f"--check {prefix}: {err}") from None


def read_onnx(path: str):
    """The ``onnx.ModelProto`` of ``path``; an empty or unparsable file is a ``DataError`` naming it."""
    import onnx  # optional (ppdlx[onnx]): only an ONNX export needs it
    try:
        check_onnx_file(path)
    except DeployError as err:
        raise DataError(f"--check {err}") from None
    try:
        return onnx.load(path)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError (either implementation), onnx's own errors
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise DataError(f"--check {path}: not a readable ONNX model ({lines[0][:160] if lines else type(err).__name__}"
                        f"); {REEXPORT_ONNX}") from None
