"""Export for deployment: Paddle Inference programs (PIR ``.json`` or legacy ``.pdmodel``),
ONNX, and ``inference.yml`` (see :mod:`ppdlx.export.meta` for its schema).

``export_model(cfg, ...)`` is the entry point (``tools/export_model.py`` is a thin CLI over it);
``save_classifier`` / ``save_detector`` are the two separate graph builders; an *export spec*
(:mod:`ppdlx.export.families`) says which one a model takes and how it is fed and read.
"""
from ppdlx.export.api import export_model, labels_from_data, read_labels  # noqa: F401
from ppdlx.export.files import ModelFiles, find_model_files  # noqa: F401
from ppdlx.export.meta import META_FILE, read_meta, trt_shape_range, trt_suggestion  # noqa: F401
from ppdlx.export.onnx_export import ExportCheckError, OnnxRunner, export_onnx  # noqa: F401
from ppdlx.export.paddle_export import (ClassifierForExport, DetectorForExport, PaddleInferenceRunner,  # noqa: F401
                                        save_classifier, save_detector)
from ppdlx.tasks.classification import classification_export_spec  # noqa: F401  (the task plug-ins' export specs)
from ppdlx.tasks.detection import detection_export_spec  # noqa: F401
