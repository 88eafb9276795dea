"""One export served from image files: ``inference.yml``, its pre-processing, a predictor and the
post-processing, in the order a service runs them. The command line predicts through it; so does
``tools/export_model.py --verify``, which compares the deployed model with the trained one and so
sees exactly what a user's service would (raw files in, the export's own pre-processing, the
chosen backend)."""
from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from .errors import DeployError
from .meta import load_meta
from .postprocess import clip_to_images, complete_outputs, postprocess
from .backends import create_predictor
from .preprocess import Preprocessor, load_image, readable_batches


class Pipeline:
    def __init__(self, meta: dict, predictor, preprocessor: Optional[Preprocessor] = None):
        self.meta = meta
        self.predictor = predictor
        self.preprocessor = preprocessor or Preprocessor(meta)
        self.backend = predictor.plan["backend"]
        self.graph = predictor.plan.get("graph", "program")

    @classmethod
    def open(cls, model_dir: str, backend: str = "auto", precision: str = "fp32",
             meta: Optional[dict] = None, **options) -> "Pipeline":
        """``options``: those of :func:`ppdlx_deploy.backends.create_predictor` (``backend="auto"``: the
        fastest CPU runtime here whose outputs agree with the export's, measured once and cached)."""
        meta = meta or load_meta(model_dir)
        return cls(meta, create_predictor(model_dir, backend, precision, meta=meta, **options))

    def run_feeds(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        """The outputs ``inference.yml`` lists, whichever graph the backend runs (a detection ONNX
        graph's NMS is completed here)."""
        return complete_outputs(self.meta, self.graph, self.predictor.run(feeds), feeds)

    def run(self, images: Sequence[Image.Image]) -> List[np.ndarray]:
        """The network's outputs for a batch of RGB images (detection boxes within each image)."""
        return clip_to_images(self.meta, self.run_feeds(self.preprocessor.feeds(images)), [im.size for im in images])

    def batches(self, paths: Sequence[str], batch_size: int = 1,
                on_unreadable: Optional[Callable[[str, DeployError], None]] = None
                ) -> Iterator[Tuple[List[str], List[Image.Image], List[np.ndarray]]]:
        """``(paths, images, outputs)`` per batch of files, in the order given. A file that cannot be read
        raises :class:`DeployError`; with ``on_unreadable`` it is handed to it (``(path, error)``) and left
        out instead, and the next readable files fill the batch, so each output row stays with its path."""
        for batch, images in readable_batches(paths, batch_size, load_image, on_unreadable):
            yield batch, images, self.run(images)

    def predict(self, paths: Sequence[str], batch_size: int = 1, topk: int = 5,
                score_threshold: Optional[float] = None,
                on_unreadable: Optional[Callable[[str, DeployError], None]] = None) -> Iterator[Tuple[str, list]]:
        """``(path, result)`` per file, the result as :func:`ppdlx_deploy.postprocess.postprocess`
        gives it (class names from ``inference.yml`` labels); ``on_unreadable`` as in :meth:`batches`."""
        for batch, _, outputs in self.batches(paths, batch_size, on_unreadable):
            yield from zip(batch, postprocess(self.meta, outputs, topk, score_threshold))
