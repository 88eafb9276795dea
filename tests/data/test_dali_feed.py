"""``ppdlx/data/dali_feed.py``: what both DALI loaders share. The GPU graphs cannot run without CUDA,
but DALI traces and serialises them on any machine (``device_id=None``): the arguments the ``mixed``
decoders would get on a GPU are checked there."""
import pytest

dali = pytest.importorskip("nvidia.dali")

from ppdlx.config import load_config  # noqa: E402
from ppdlx.data import dali as classification  # noqa: E402
from ppdlx.data import dali_coco  # noqa: E402
from ppdlx.data.dali_feed import EpochFeed  # noqa: E402
from ppdlx.tasks.preprocess import resolve_preprocessing  # noqa: E402


def _serialised(graph) -> bytes:
    return dali.pipeline_def(graph)(batch_size=2, num_threads=1, device_id=None).serialize()


def _classification_graph(training_random, *extra, conditionals=False):
    cfg = resolve_preprocessing(load_config(None, ["data.root=/unused", "data.backend=dali", "data.dali.device=gpu",
                                                   "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                                                   "model.num_classes=3", *extra]))
    feed = EpochFeed(["/unused.jpg"], [0], 2)
    return dali.pipeline_def(lambda: classification._graph(feed, cfg.data.transforms, "gpu", "NCHW", training_random,
                                                           "float16"), enable_conditionals=conditionals)(
        batch_size=2, num_threads=1, device_id=None).serialize()


def _coco_graph(training_random):
    feed = EpochFeed(["/unused.jpg"], [0], 2)
    return _serialised(lambda: dali_coco._graph(feed, 64, [0, 0, 0], [1, 1, 1], training_random, 0.5, [0.8, 1.2],
                                                "bilinear", "NCHW", "gpu"))


@pytest.mark.parametrize("graph", [_classification_graph, _coco_graph], ids=["classification", "coco"])
def test_gpu_decoders_evaluate_like_libjpeg_and_only_training_reserves_buffers(graph):
    """Before: every classification mixed decoder (evaluation too) reserved 211 MB of GPU and 2 x 140 MB
    of pinned host memory per thread for the whole run, and all of them upsampled chroma unlike the
    CPU decoder and PIL, so a model scored differently on the GPU decoder."""
    evaluation, training = graph(False), graph(True)
    assert b"decoders__Image" in evaluation and b"mixed" in evaluation
    assert b"jpeg_fancy_upsampling" in evaluation and b"device_memory_padding" not in evaluation
    assert b"device_memory_padding" in training and b"host_memory_padding" in training
    assert b"preallocate_width_hint" in training and b"preallocate_width_hint" not in evaluation
    assert b"jpeg_fancy_upsampling" not in training


def test_the_gpu_training_graph_runs_randaugment_and_erasing_on_the_gpu():
    """GPUNet's recipe on ``data.dali.device=gpu``: RandAugment's warps, colour ops and the erasing mask are GPU
    operators after the mixed decoder (traced and serialised here; DALI checks the devices of their inputs)."""
    graph = _classification_graph(True, "data.transforms.randaugment=rand-m9-mstd0.5",
                                  "data.transforms.random_erasing=0.2", conditionals=True)
    for op in (b"WarpAffine", b"Rotate", b"Equalize", b"Filter", b"Saturation", b"Brightness", b"Erase", b"Flip"):
        assert op in graph, op
    assert graph.count(b"\x12\x03gpu") > 40  # the ops' device fields
