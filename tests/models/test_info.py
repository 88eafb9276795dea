"""ppdlx.models.info + tools/model_info.py: parameters, MACs, per-layer shapes for every family."""
import json
import os
import subprocess
import sys

import paddle

import ppdlx.models  # noqa: F401
from ppdlx.config import load_config
from ppdlx.models.info import count_params, model_info
from ppdlx.models.model_cfg import classification_cfg, detection_cfg
from ppdlx.registry import MODELS
from ppdlx.tasks.preprocess import config_resolution

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "model_info.py")
BASE = os.path.join(ROOT, "configs", "base", "rn50_imagenet.yaml")


def test_resnet50_params_and_macs_at_224():
    info = model_info(MODELS.build("resnet50"), 224)
    assert info["params"] == 25_557_032  # torchvision's count (BN running stats excluded)
    assert info["macs"] == 4_089_184_256
    assert abs(info["macs"] / 4.09e9 - 1) < 0.02
    assert info["resolution"] == 224 and info["output_shape"] == [1, 1000]
    first = info["layers"][0]
    assert first == {"name": "stem", "type": "ConvNormAct", "out_shape": [1, 64, 112, 112]}
    assert {"name": "fc", "type": "Linear", "out_shape": [1, 1000]} in info["layers"]


def test_gpunet_0_at_320_and_the_fused_irb_padding_quirk():
    info = model_info(MODELS.build("gpunet_0"), 320)
    assert info["params"] == 11_885_432 and info["macs"] == 3_254_209_280
    shapes = {e["name"]: e["out_shape"] for e in info["layers"]}
    # per-stage spatial sizes of the spec: 160 -> 79 -> 39 -> 20 -> 10
    assert [shapes[f"network.{i}"][2] for i in (1, 4, 6, 9, 12)] == [160, 79, 39, 20, 10]
    assert shapes["network.14"] == [1, 1000] and all(e["out_shape"] for e in info["layers"])


def test_grouped_and_depthwise_convs_and_nhwc():
    net = paddle.nn.Sequential(paddle.nn.Conv2D(4, 8, 3, padding=1, groups=2),        # 8*16*16 * (4/2)*9
                               paddle.nn.Conv2D(8, 8, 5, stride=2, padding=2, groups=8),  # 8*8*8 * 1*25
                               paddle.nn.Conv2DTranspose(8, 6, 2, stride=2),              # in 8*8*8 * 6*4
                               paddle.nn.Flatten(), paddle.nn.Linear(6 * 16 * 16, 10))    # 10 * 1536
    info = model_info(net, 16, in_channels=4)
    assert info["macs"] == 8 * 16 * 16 * 2 * 9 + 8 * 8 * 8 * 25 + 8 * 8 * 8 * 6 * 4 + 10 * 1536
    assert info["params"] == count_params(net) == (8 * 2 * 9 + 8) + (8 * 25 + 8) + (8 * 6 * 4 + 6) + (1536 * 10 + 10)
    nhwc = model_info(MODELS.build("resnet18_bottleneck_tiny", data_format="NHWC"), 32, "NHWC")
    nchw = model_info(MODELS.build("resnet18_bottleneck_tiny"), 32)
    assert nhwc["macs"] == nchw["macs"] and nhwc["layers"][0]["out_shape"] == [1, 16, 16, 16]


def test_macs_by_layer_names_each_conv_and_linear_and_sums_to_the_total():
    model = paddle.nn.Sequential(paddle.nn.Conv2D(4, 8, 3, stride=2, padding=1), paddle.nn.ReLU(),
                                 paddle.nn.Flatten(), paddle.nn.Linear(8 * 8 * 8, 10))
    info = model_info(model, 16, in_channels=4)
    assert info["macs_by_layer"] == {"0": 8 * 8 * 8 * 4 * 3 * 3, "3": 512 * 10}
    assert info["macs"] == sum(info["macs_by_layer"].values())


def test_a_shared_layer_is_counted_once_per_call():
    class Twice(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = paddle.nn.Conv2D(3, 3, 1)

        def forward(self, x):
            return self.conv(self.conv(x))

    info = model_info(Twice(), 8)
    assert info["macs_by_layer"] == {"conv": 2 * 8 * 8 * 3 * 3}


def test_detection_lists_every_level():
    info = model_info(MODELS.build("efficientdet_d0", num_classes=3, image_size=128), 128)
    cls_shapes, box_shapes = info["output_shape"]
    assert [s[2] for s in cls_shapes] == [16, 8, 4, 2, 1] and cls_shapes[0] == [1, 27, 16, 16]
    assert box_shapes[-1] == [1, 36, 1, 1]
    heads = [e for e in info["layers"] if e["name"] == "class_net"]
    assert heads[0]["out_shape"] == cls_shapes
    assert info["params"] == 3_829_172 and info["macs"] == 139_270_528


def _tool(*args):
    return subprocess.run([sys.executable, TOOL, "-c", BASE, *args], capture_output=True, text=True, timeout=300)


def test_cli_report_and_one_line_user_json_error(tmp_path):
    report = tmp_path / "info.json"
    ok = _tool("-o", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.transforms.crop_size=32",
               "--report", str(report), "--max-layers", "3")
    assert ok.returncode == 0, ok.stderr[-2000:]
    data = json.loads(report.read_text())
    assert {"params", "macs", "resolution", "layers"} <= set(data) and data["resolution"] == 32
    assert isinstance(data["params"], int) and data["macs"] > 0 and len(data["layers"]) > 10
    assert set(data["layers"][0]) == {"name", "type", "out_shape"}
    assert "MACs" in ok.stdout.strip().splitlines()[-1]

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"layer_type": "data", "img_resolution": 32, "distill": False},
                               {"layer_type": "head", "num_in_channels": 3, "num_out_channels": 8, "stride": 2},
                               {"layer_type": "blob", "num_in_channels": 8}]))
    proc = _tool("-o", "model.name=gpunet_json", f"model.args.json_path={bad}")
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if not line.lstrip().startswith(("warnings.warn", "/"))]
    assert lines == [f"error: {bad}: entry 2: unknown layer_type 'blob' (known: head, conv, irb, fused_irb, tail)"]
    assert "Traceback" not in proc.stderr


def test_config_resolution_follows_the_models_task_not_the_dataset_name():
    detector, classifier = detection_cfg(512, "bilinear", "head"), classification_cfg(224, 0.875, "bicubic", "fc")
    for dataset in ("image_folder", "coco"):
        cfg = load_config(None, [f"data.dataset={dataset}", "data.coco.image_size=128", "data.transforms.crop_size=96"])
        assert (config_resolution(cfg, detector), config_resolution(cfg, classifier)) == (128, 96), dataset


def test_cli_builds_a_detection_model_at_the_coco_image_size(tmp_path):
    report = tmp_path / "info.json"
    proc = _tool("-o", "model.name=efficientdet_d0", "model.num_classes=3", "data.coco.image_size=128",
                 "--report", str(report), "--max-layers", "1")  # the base config's data.dataset is image_folder
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(report.read_text())
    assert data["resolution"] == 128 and [s[2] for s in data["output_shape"][0]] == [16, 8, 4, 2, 1]
    assert data["params"] == 3_829_172 and data["macs"] == 139_270_528
    assert "at 128x128" in proc.stdout.strip().splitlines()[-1]
