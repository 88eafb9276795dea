"""The Triton Python-backend model of a ppdlx export. ``make_repo.py`` copies this file to
``REPO/<model>/1/model.py`` with the ``ppdlx_triton`` and ``ppdlx_deploy`` packages and the export
beside it, so a repository runs wherever Triton's Python backend finds paddle, numpy, Pillow and PyYAML.

What it computes is ``ppdlx_triton.serving`` (its role comes from the model config's ``role``
parameter); this file is Triton's plumbing: the requests of one dynamic batch are prepared one by one
(a request whose image cannot be read gets its own INVALID_ARG error response) and run through the
network together, and the answers are split back per request. Tensors cross the stub by DLPack, not
NumPy (``ppdlx_triton.serving`` says why).
"""
import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

# The repository's copies of ppdlx_triton and ppdlx_deploy sit next to this file.
VERSION_DIR = os.path.dirname(os.path.abspath(__file__))
if VERSION_DIR not in sys.path:
    sys.path.insert(0, VERSION_DIR)

from ppdlx_deploy import load_meta  # noqa: E402
from ppdlx_deploy.errors import DeployError  # noqa: E402
from ppdlx_triton.serving import make_step, split_rows, step_options  # noqa: E402

EXPORT_DIR = os.path.join(VERSION_DIR, "export")
RENAMED_CAPSULE = "PyCapsule_GetPointer called with incorrect name"


def _ignore_renamed_dlpack_capsules(default_hook):
    """The Python backend renames a DLPack capsule it consumed to ``used_dlpack`` where the DLPack
    protocol says ``used_dltensor``; NumPy's capsule destructor then reports (never raises) that it
    cannot read it, once per output tensor. The tensor is freed by the backend either way, so exactly
    that report is dropped and every other unraisable error still reaches the log."""
    def hook(unraisable):
        if isinstance(unraisable.exc_value, ValueError) and unraisable.object is None \
                and str(unraisable.exc_value) == RENAMED_CAPSULE:
            return
        default_hook(unraisable)
    return hook


class TritonPythonModel:
    def initialize(self, args):
        sys.unraisablehook = _ignore_renamed_dlpack_capsules(sys.unraisablehook)
        config = json.loads(args["model_config"])
        parameters = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
        parameters.setdefault("max_batch_size", str(config.get("max_batch_size") or 1))
        options = step_options(parameters, args.get("model_instance_kind", "CPU"),
                               int(args.get("model_instance_device_id") or 0))
        try:
            self.step = make_step(options["role"], EXPORT_DIR, load_meta(EXPORT_DIR), options)
        except DeployError as err:  # a load failure Triton reports in one line, naming the model
            raise pb_utils.TritonModelException(f"{args['model_name']}: {err}") from None

    def execute(self, requests):
        responses = [None] * len(requests)
        rows, counts, accepted = [], [], []
        for index, request in enumerate(requests):
            try:
                inputs = {name: np.from_dlpack(pb_utils.get_input_tensor_by_name(request, name))
                          for name in self.step.input_names}
                prepared = self.step.prepare(inputs)
            except DeployError as err:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(err), pb_utils.TritonError.INVALID_ARG))
                continue
            rows += prepared
            counts.append(len(prepared))
            accepted.append(index)
        if not accepted:
            return responses
        try:
            parts = split_rows(self.step.run(rows), counts)
        except Exception as err:  # every request of the batch is answered, and the model keeps serving
            message = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            for index in accepted:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
            return responses
        for index, arrays in zip(accepted, parts):
            responses[index] = pb_utils.InferenceResponse(
                [pb_utils.Tensor.from_dlpack(name, arrays[name]) for name in self.step.output_names])
        return responses
