"""Look at the data and the runs: dataset report, training curves, per-class analysis, drawn predictions.

Importing this package (and computing any report) needs no matplotlib; only the functions that draw a PNG
import it (``pip install 'ppdlx[plot]'``), so the training path never depends on it. Entry points:

* ``check_data(cfg, decode=True, hash_files=True) -> DataReport`` (``.table()``, ``.write(out_dir)``,
  ``.problems``, ``.raise_if_unusable()``) -- ``tools/check_data.py``; ``check_before_training(cfg)`` is its
  seconds-long form for the start of a run;
* ``plot_curves(run_dirs, out_png)`` / ``write_run_figures(run_dir)`` -- ``curves.png`` from ``metrics.jsonl``,
  ``tools/plot.py``;
* ``classification_analysis(labels, scores, paths, class_names, out_dir)`` and
  ``detection_analysis(coco_eval, out_dir, image_dir)`` -- ``analysis.md``, ``confusion.png`` / ``errors.png``,
  ``pr_curves.png`` / ``detections.png``, and a dict for an eval report.
"""
from ppdlx.analysis.classification import classification_analysis, classification_metrics  # noqa: F401
from ppdlx.analysis.curves import plot_curves, read_metrics, write_run_figures  # noqa: F401
from ppdlx.analysis.data_report import DataReport, check_before_training, check_data  # noqa: F401
from ppdlx.analysis.detection import detection_analysis, per_category_ap  # noqa: F401
from ppdlx.analysis.figures import plotting_available  # noqa: F401
