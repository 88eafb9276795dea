"""The config schema: every section, every key, its type and default.

Unknown keys and wrong types are rejected (``extra="forbid"``, strict-ish types);
``ppdlx.config.load_config`` turns pydantic's errors into one line naming the file,
the key path, the bad value and a "did you mean".

A loaded config is frozen: assigning to a key raises, and its lists and mappings are tuples and
read-only dicts (``ppdlx.config.frozen.FrozenDict``), so nothing changes it in place. A changed copy is
``cfg.replace({"data.backend": "paddle"})`` (validated like a loaded one); what a run decides at
run time (data layout, AMP, threads) is its plan (``ppdlx.engine.plan``), not the config.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Literal, Mapping, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ppdlx.config.frozen import deep_freeze
from ppdlx.config.randaugment import parse_rand_augment
from ppdlx.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __setattr__(self, name, value):
        if name.startswith("_"):  # pydantic's private attributes
            return super().__setattr__(name, value)
        path = ".".join(filter(None, (_section_path(type(self)), name)))
        raise ConfigError(f"the config is frozen after loading (cannot set {path} = {value!r}); make a changed "
                          f"copy with cfg.replace({{{path!r}: ...}})")


def _section_path(cls, root=None, prefix="") -> str:
    """``"data.transforms"`` for ``TransformsConfig`` (the first key path holding that section)."""
    root = root or Config
    for name, field in root.model_fields.items():
        tp = field.annotation
        if isinstance(tp, type) and issubclass(tp, Section):
            path = f"{prefix}{field.alias or name}"
            if tp is cls:
                return path
            found = _section_path(cls, tp, path + ".")
            if found:
                return found
    return ""


class GlobalConfig(Section):
    output_dir: str = "output/run"
    seed: int = 42
    device: Literal["auto", "cpu", "gpu"] = "auto"
    log_interval: int = Field(10, ge=1)
    # CPU threads for paddle's math library; null = the usable cores divided by the processes of
    # the job on this machine (paddle's own default is 1 thread). The resolved number is saved.
    cpu_threads: Optional[int] = Field(None, ge=1)
    # MKL_DEBUG_CPU_TYPE for MKL's vendor check, applied by the tools before paddle loads. auto = 5
    # (MKL's AVX2 paths) only on a non-Intel CPU with avx2, detected at run time (ppdlx/cpu_features.py),
    # else unset; a number = that value on every CPU; null = leave the environment alone.
    mkl_debug_cpu_type: Union[int, Literal["auto"], None] = "auto"
    # CPU dynamic-graph training (classification, detection) in NHWC with ppdlx's oneDNN ops and
    # stride-1 1x1 convs as matmuls (ppdlx/layers/cpu_kernels.py; sets model.data_format=NHWC). auto = on
    # where it applies and the oneDNN op builds (needs onednn-devel's headers), else one log line;
    # true = on or an error; false = Paddle's kernels. The decision is saved as true/false.
    cpu_fast_kernels: Union[bool, Literal["auto"]] = "auto"


class ModelConfig(Section):
    name: str = "resnet50"
    num_classes: int = Field(1000, ge=1)
    weights: Optional[str] = None
    # model.weights whose classifier (default_cfg["classifier"]) has another class count: auto = re-initialise
    # it when only the classifier's shapes differ (one log line); true = always; false = one-line error
    reset_head: Union[bool, Literal["auto"]] = "auto"
    # a ppdlx checkpoint keeps the raw weights and, with ema.enabled, the EMA: auto = the copy its
    # metrics were measured on (the EMA with ema.eval_with_ema, which also picked best); ema; raw
    weights_copy: Literal["auto", "ema", "raw"] = "auto"
    data_format: Literal["NCHW", "NHWC"] = "NCHW"
    # Family-specific constructor arguments, checked against the builder's signature.
    args: Mapping[str, Any] = Field(default_factory=dict)

    @field_validator("args", mode="after")
    @classmethod
    def _freeze_args(cls, value):
        return deep_freeze(value)


# in 0..255, as data.transforms holds them: the fix a wrong mean/std message suggests
_IMAGENET_NORMALISATION = {"mean": "[123.675, 116.28, 103.53]", "std": "[58.395, 57.12, 57.375]"}


class TransformsConfig(Section):
    # null = the model's default_cfg (input size, crop_pct, mean/std in 0..255, interpolation), filled in by
    # ppdlx.tasks.preprocess before data or export reads them; a value given here wins.
    crop_size: Optional[int] = Field(None, ge=8)
    # null = floor(crop_size / crop_pct), crop_pct from this section or else from the model's default_cfg
    resize_short: Optional[int] = Field(None, ge=8)
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    hflip: float = Field(0.5, ge=0.0, le=1.0)
    mean: Optional[Tuple[float, ...]] = None
    std: Optional[Tuple[float, ...]] = None
    interpolation: Optional[Literal["bilinear", "bicubic"]] = None
    # Off for tests that need identical batches across graph modes.
    random: bool = True
    # timm's training extras (paddle.io: ppdlx.data.augment; DALI: ppdlx.data.dali_augment): RandAugment, e.g.
    # "rand-m9-mstd0.5" (null = off); random erasing probability on the normalised image and its fill
    randaugment: Optional[str] = None
    random_erasing: float = Field(0.0, ge=0.0, le=1.0)
    random_erasing_mode: Literal["pixel", "rand", "const"] = "pixel"
    # timm crop_pct: when set, resize_short = floor(crop_size / crop_pct) (resize_short is derived)
    crop_pct: Optional[float] = Field(None, gt=0.0, le=1.0)

    @field_validator("mean", "std")
    @classmethod
    def _check_channel_values(cls, value, info):
        # A wrong count broadcasts against nothing: every image would fail to normalise, reported as
        # undecodable files (paddle.io) or a DALI assert, long after the config was accepted.
        if value is None:
            return value
        example = _IMAGENET_NORMALISATION[info.field_name]
        if len(value) not in (1, 3):
            raise ValueError(f"needs 1 number (every channel) or 3 (R, G, B), got {len(value)}; give e.g. "
                             f"{example}, or null for the model's default_cfg")
        if info.field_name == "std" and not all(v > 0 for v in value):
            raise ValueError(f"every std must be above 0 (images are divided by it); give e.g. {example}, or null "
                             f"for the model's default_cfg")
        return value

    @field_validator("randaugment")
    @classmethod
    def _check_randaugment(cls, value):
        if value:
            parse_rand_augment(value)  # ConfigError naming the key and the accepted sections
        return value

    @model_validator(mode="after")
    def _resize_from_crop_pct(self):
        if self.crop_pct is not None and self.crop_size is not None:
            self.__dict__["resize_short"] = int(math.floor(self.crop_size / self.crop_pct + 1e-6))
        return self


class DaliConfig(Section):
    device: Literal["auto", "cpu", "gpu"] = "auto"  # auto: gpu (mixed decoding) where paddle runs on a GPU
    num_threads: int = Field(2, ge=1)
    prefetch_queue_depth: int = Field(2, ge=1)
    # the training batches' dtype (float16 feeds an amp.dtype=float16 run on GPU); validation is float32
    output_dtype: Literal["float32", "float16"] = "float32"
    # A file DALI cannot decode: "skip" = warn once and leave it out (as the paddle.io path),
    # "error" = stop with a DataError naming it.
    corrupt_files: Literal["skip", "error"] = "skip"


class CocoConfig(Section):
    """``data.dataset: coco`` (detection). Paths are relative to ``data.root`` unless absolute.
    mean/std, hflip, interpolation and ``random`` come from ``data.transforms``."""
    train_json: str = "annotations/instances_train2017.json"
    val_json: str = "annotations/instances_val2017.json"
    train_images: str = "train2017"
    val_images: str = "val2017"
    # square network input: training crops/pads to it, eval resizes the longer side to it and pads;
    # null = the model's default_cfg input size (filled in as data.transforms' nulls are)
    image_size: Optional[int] = Field(None, ge=32)
    # training scale jitter: the image is resized to fit image_size * U(lo, hi), then cropped/padded
    scale_range: Tuple[float, float] = (0.1, 2.0)
    max_instances: int = Field(100, ge=1)
    skip_crowd: bool = True  # leave iscrowd=1 boxes out of the training targets
    # an invalid annotation (zero/negative size, outside the image, unknown category id) or a
    # missing image file: "skip" = report it (file + annotation id) and leave it out, "error" = stop
    invalid: Literal["skip", "error"] = "skip"


class SyntheticConfig(Section):
    num_images: int = Field(1024, ge=1)


class DataConfig(Section):
    # "image_folder" (classification) or "coco" (detection): picks the task's pipeline
    dataset: Literal["image_folder", "coco"] = "image_folder"
    root: str = "data/imagenet"
    backend: Literal["paddle", "dali", "synthetic"] = "paddle"
    train_split: str = "train"
    val_split: str = "val"
    batch_size: int = Field(256, ge=1)  # per device
    # a rank's last partial training batch: drop it, or fill it from the start of its share (NVIDIA's DALI)
    last_batch: Literal["drop", "fill"] = "drop"
    workers: int = Field(4, ge=0)
    transforms: TransformsConfig = Field(default_factory=TransformsConfig)
    dali: DaliConfig = Field(default_factory=DaliConfig)
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    coco: CocoConfig = Field(default_factory=CocoConfig)


class TrainConfig(Section):
    epochs: int = Field(90, ge=1)
    graph: Literal["dynamic", "static", "to_static"] = "dynamic"
    resume: Optional[str] = None  # "auto", "never" (start over, replacing checkpoints) or a checkpoint path
    accumulate: int = Field(1, ge=1)
    # Mixup / CutMix on the device, timm's semantics (ppdlx.data.mixing): Beta(alpha, alpha) per step; a step
    # mixes with mix_prob, CutMix with mix_switch_prob when both alphas are set (timm --mixup-*)
    mixup_alpha: float = Field(0.0, ge=0.0)
    cutmix_alpha: float = Field(0.0, ge=0.0)
    mix_prob: float = Field(1.0, ge=0.0, le=1.0)
    mix_switch_prob: float = Field(0.5, ge=0.0, le=1.0)
    # Stop with an error after this many consecutive non-finite losses.
    max_nonfinite_steps: int = Field(10, ge=1)
    # Cap on optimizer steps per epoch (benchmarks, smoke runs); null = the whole split.
    steps_per_epoch: Optional[int] = Field(None, ge=1)
    save_interval: int = Field(1, ge=1)
    keep_epoch_checkpoints: bool = True


class OptimizerConfig(Section):
    name: str = "momentum"
    momentum: float = 0.875
    weight_decay: float = Field(1.0 / 32768, ge=0.0)
    # which parameters decay (ppdlx.optim.optimizers.DECAY_PARAMS): all; all_but_bn (NVIDIA's ResNet50: BN
    # scales/shifts excluded); all_but_1d (timm: BN and biases excluded); conv_kernels (EfficientDet: 4-D only)
    decay_params: Literal["all", "all_but_bn", "all_but_1d", "conv_kernels"] = "all_but_1d"
    nesterov: bool = False
    grad_clip_norm: Optional[float] = Field(None, gt=0.0)
    # RMSprop (TF style) knobs
    rho: float = 0.9
    epsilon: float = 1e-3


class LRConfig(Section):
    name: str = "cosine"
    # Learning rate for `base_batch` images; scaled linearly to the global batch.
    base_lr: float = Field(0.256, gt=0.0)
    base_batch: int = Field(256, ge=1)
    scale_with_batch: bool = True
    warmup_epochs: float = Field(5.0, ge=0.0)
    warmup_start_lr: float = Field(0.0, ge=0.0)
    min_lr: float = Field(0.0, ge=0.0)
    # step decay
    decay_epochs: float = Field(2.4, gt=0.0)
    decay_rate: float = Field(0.97, gt=0.0)


class LossConfig(Section):
    name: str = "cross_entropy"
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0)


class AmpConfig(Section):
    enabled: bool = False
    dtype: Literal["float16", "bfloat16"] = "float16"
    level: Literal["O1", "O2"] = "O1"
    # bfloat16 on CPU (ppdlx/models/cpu_bf16.py): auto = the oneDNN convolutions train in bf16 where
    # the CPU has bf16 hardware and they measured faster than float32 there; true = wherever the
    # CPU has bf16 hardware (else an error); false = float32
    cpu_bf16: Union[bool, Literal["auto"]] = "auto"
    init_loss_scaling: float = Field(128.0, gt=0.0)
    use_dynamic_loss_scaling: bool = True
    incr_every_n_steps: int = Field(2000, ge=1)
    decr_every_n_nan_or_inf: int = Field(1, ge=1)


class EmaConfig(Section):
    enabled: bool = False
    decay: float = Field(0.9999, gt=0.0, lt=1.0)
    # decay = min(decay, (1 + n) / (10 + n)) after n updates
    dynamic_decay: bool = False
    eval_with_ema: bool = True


class AspConfig(Section):
    # n:m structured sparsity (ppdlx.sparsity): keep n of every m consecutive input channels
    # (2:4 = TensorRT's sparse pattern). tools/prune_asp.py forces enabled=true.
    enabled: bool = False
    n: int = Field(2, ge=1)
    m: int = Field(4, ge=2)
    mask_algo: Literal["mask_1d", "mask_2d_greedy"] = "mask_1d"
    # fnmatch patterns over layer or parameter names never pruned, e.g. ["stem.*", "*.shortcut.conv"]
    exclude: Tuple[str, ...] = ()
    # the classifier = last Linear (or conv) whose output width is model.num_classes
    prune_classifier: bool = False
    # layer kinds that may be pruned (grouped/depthwise convs and Cin % m != 0 are always skipped)
    layer_types: Tuple[Literal["conv2d", "linear"], ...] = ("conv2d", "linear")


class QatConfig(Section):  # quantization-aware training (ppdlx.models.qat, docs/int8.md)
    enabled: bool = False  # activation ranges: moving average (at moving_rate) of each batch's abs max
    moving_rate: float = Field(0.9, gt=0.0, lt=1.0)


class DistillConfig(Section):
    enabled: bool = False
    teacher_config: Optional[str] = None
    teacher_weights: Optional[str] = None
    teacher_resolution: Optional[int] = Field(None, ge=8)
    temperature: float = Field(1.0, gt=0.0)
    weight: float = Field(1.0, ge=0.0)


class EvalConfig(Section):
    batch_size: Optional[int] = Field(None, ge=1)  # null = data.batch_size
    interval: int = Field(1, ge=1)  # epochs
    topk: Tuple[int, int] = (1, 5)


class DetectionConfig(Section):
    """Detection evaluation / post-processing (``data.dataset: coco``)."""
    # "soft": per-class gaussian soft-NMS in numpy (the reference's COCO eval); "hard": per-class
    # hard NMS in paddle ops (what the exported model does)
    nms: Literal["soft", "hard"] = "soft"
    soft_nms_sigma: float = Field(0.5, gt=0.0)
    iou_threshold: float = Field(0.5, gt=0.0, le=1.0)  # hard NMS
    score_threshold: float = Field(0.001, ge=0.0)
    pre_nms_top_k: int = Field(5000, ge=1)
    max_detections: int = Field(100, ge=1)
    # write the val detections as COCO results JSON to <global.output_dir>/detections_val.json
    save_results: bool = True
    # BatchNorm running-statistics momentum for training (paddle convention: running = m * running +
    # (1 - m) * batch); null keeps the model's (0.99, as the reference). Short runs (the CPU demo):
    # a smaller m lets the eval statistics catch up within a few hundred steps.
    bn_momentum: Optional[float] = Field(None, gt=0.0, lt=1.0)
    # before each evaluation during training, re-estimate the BN running statistics of the weights
    # being evaluated (EMA or raw) from this many batches of training images passed through the
    # evaluation transform (eval.batch_size each; "precise BN"); 0 = off
    precise_bn_batches: int = Field(0, ge=0)
    # BatchNorm layers whose feature maps have at most this many pixels (h * w) at data.coco.image_size
    # keep fixed statistics (mean 0, variance 1: a per-channel affine) in training and eval. Small CPU
    # inputs make P6/P7 1x1 maps whose batch statistics are degenerate (variance ~0) and make eval
    # explode; 0 = off (the reference at 512 px has no such layers)
    freeze_bn_max_pixels: int = Field(0, ge=0)


class ExportConfig(Section):
    output_dir: Optional[str] = None
    output: Literal["logits", "probabilities"] = "logits"
    # the exported graph's layout, whatever model.data_format trained in (the same weights): paddle2onnx and
    # paddle.tensorrt convert convolutions as NCHW only, so an NHWC graph serves Paddle Inference's kernels alone
    data_format: Literal["NCHW", "NHWC"] = "NCHW"
    onnx: bool = False
    opset: int = Field(13, ge=7)
    int8_activation_headroom: Optional[float] = Field(None, ge=1.0)  # QAT int8 program; null: 2 without VNNI


class Config(Section):
    global_: GlobalConfig = Field(default_factory=GlobalConfig, alias="global")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    lr: LRConfig = Field(default_factory=LRConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    amp: AmpConfig = Field(default_factory=AmpConfig)
    ema: EmaConfig = Field(default_factory=EmaConfig)
    asp: AspConfig = Field(default_factory=AspConfig)
    qat: QatConfig = Field(default_factory=QatConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    detection: DetectionConfig = Field(default_factory=DetectionConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @property
    def global_cfg(self) -> GlobalConfig:
        return self.global_

    def to_dict(self) -> dict:
        return self.model_dump(by_alias=True, mode="json")

    def replace(self, changes: Mapping[str, Any]) -> "Config":
        """A validated copy with ``changes`` (``{"key.path": value}``) applied; ``self`` is unchanged."""
        raw = copy.deepcopy(self.to_dict())
        for path, value in changes.items():
            keys = path.split(".")
            node = raw
            for key in keys[:-1]:
                node = node.get("global" if key == "global_" else key)
                if not isinstance(node, dict):
                    raise ConfigError(f"cfg.replace: '{path}' is not a key path of the config")
            node[keys[-1]] = value
        return Config.model_validate(raw)
