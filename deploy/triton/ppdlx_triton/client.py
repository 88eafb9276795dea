"""A client of the served models: image files in, the same per-image results as
``ppdlx_deploy.Pipeline.predict`` out (classification ``[(class_id, label, score)]``, detection
``[(box, score, class_id, label)]``), over HTTP or gRPC with ``tritonclient``."""
from __future__ import annotations

import importlib
import json
from typing import Dict, List, Optional, Sequence

import numpy as np

from ppdlx_deploy.errors import DeployError, UnsupportedError

from .serving import IMAGE_INPUT, encode_files, family_outputs, served_family, served_results

PROTOCOLS = ("http", "grpc")


def protocol_module(protocol: str):
    """``tritonclient.http`` or ``tritonclient.grpc``; tritonclient is optional (only clients need it)."""
    if protocol not in PROTOCOLS:
        raise DeployError(f"protocol {protocol!r}: choose http or grpc")
    try:
        return importlib.import_module(f"tritonclient.{protocol}")
    except ImportError as err:
        raise UnsupportedError(f"tritonclient.{protocol} does not import ({err}): pip install "
                               f"'tritonclient[http,grpc]'") from None


class ServedModel:
    """One model of a running server: ``ServedModel("127.0.0.1:8001", "grpc", "resnet50")``."""

    def __init__(self, url: str, protocol: str, model: str):
        self.protocol, self.model = protocol, model
        self.module = protocol_module(protocol)
        self.client = self.module.InferenceServerClient(url)
        config = self.client.get_model_config(model, **({"as_json": True} if protocol == "grpc" else {}))
        config = config.get("config", config)
        outputs = {o["name"] for o in config.get("output", [])}
        self.family = served_family(model, outputs)
        parameters = config.get("parameters", {})
        self.labels = json.loads(parameters.get("labels", {}).get("string_value") or "[]")

    def infer_arrays(self, files: Sequence[bytes], class_count: int = 0) -> Dict[str, np.ndarray]:
        """The output arrays for these encoded files (one request). ``class_count``: also ask Triton's
        classification extension for the top classes of ``probabilities`` as ``score:id:label``."""
        rows = encode_files(files)
        image = self.module.InferInput(IMAGE_INPUT, list(rows.shape), "UINT8")
        image.set_data_from_numpy(rows)
        names = family_outputs(self.family)
        outputs = [self.module.InferRequestedOutput(n, class_count=class_count if n == "probabilities" else 0)
                   for n in names]
        answer = self.client.infer(self.model, [image], outputs=outputs)
        return {n: answer.as_numpy(n) for n in names}

    def label(self, class_id: int) -> str:
        return str(self.labels[class_id]) if 0 <= class_id < len(self.labels) else str(class_id)

    def predict(self, files: Sequence[bytes]) -> List[list]:
        """Per file, the results as ``ppdlx_deploy.postprocess`` gives them."""
        return served_results(self.family, self.infer_arrays(files), self.label)

    def close(self) -> None:
        self.client.close()


def read_files(paths: Sequence[str]) -> List[bytes]:
    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError as err:
            raise DeployError(f"{path}: cannot read ({err.strerror})") from None
    return out


def parse_classification(entries: np.ndarray) -> List[tuple]:
    """Triton's classification-extension strings ``b"score:id:label"`` as ``(id, label, score)``."""
    out = []
    for entry in np.asarray(entries).reshape(-1):
        text = entry.decode("utf-8") if isinstance(entry, bytes) else str(entry)
        score, class_id, label = (text.split(":", 2) + [""])[:3]
        out.append((int(class_id), label, float(score)))
    return out


def ask(url: str, protocol: str, model: str, paths: Sequence[str], topk: Optional[int] = None) -> tuple:
    """``(family, [(path, results)])`` for image files: one request per file."""
    served = ServedModel(url, protocol, model)
    try:
        answers = [(path, served.predict([data])[0]) for path, data in zip(paths, read_files(paths))]
    finally:
        served.close()
    return served.family, [(path, result[:topk] if topk else result) for path, result in answers]
