"""Knowledge distillation from a frozen teacher (the GPUNet recipe), as a training objective.

Design (``distill.*`` in the config):

* The teacher is any ppdlx classification model: ``distill.teacher_config`` (a ppdlx YAML; its
  ``model`` section builds it, its ``data.transforms`` give its resolution and normalisation, its
  model's ``default_cfg`` what they leave null)
  and ``distill.teacher_weights`` (a checkpoint prefix; else the teacher config's
  ``model.weights``). Every teacher parameter must come from the file.
* Resolutions: the training loader produces batches at the **teacher's** resolution
  (``distill.teacher_resolution``, else the teacher config's ``crop_size``; the classification
  task builds the train loader from ``teacher_data_config(cfg)``). The teacher sees that batch as is;
  the student gets it resized bicubically to its own ``data.transforms.crop_size``
  (``F.interpolate(..., mode="bicubic")``, as the reference's ``train_one_epoch``). Validation
  uses the student's own transforms, so eval accuracy is the student's at its resolution.
  (The reference's ``useTwoRes`` test compares ``data_config["input_size"]`` with itself, so its
  teacher in fact saw student-resolution batches; set ``distill.teacher_resolution`` equal to the
  student ``crop_size`` to reproduce that.)
* If the teacher was trained with another mean/std, the batch is re-normalised for it.
* Loss: ``CE_smoothed(student, y) + weight * T^2 * mean(sum(-softmax(t / T) * log_softmax(s / T)))``
  (soft-target cross-entropy = KL(teacher || student) + the teacher's entropy, a constant; the
  reference uses T = 1, weight 1).
* The teacher is frozen: ``stop_gradient`` on every parameter, ``eval()`` before every forward,
  forward under ``paddle.no_grad()``. It is held by the objective, **not** by the model, so the
  trainer's ``model.train()`` never reaches it and it is absent from the student's
  ``.pdparams``, optimizer state, EMA and exported files.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import paddle
import paddle.nn.functional as F

from ppdlx.checkpoint import load_weights
from ppdlx.config import load_config
from ppdlx.data.mixing import MixSpec
from ppdlx.errors import ConfigError
from ppdlx.models.from_config import build_model
from ppdlx.tasks.objectives import mixed
from ppdlx.tasks.preprocess import resolve_preprocessing

log = logging.getLogger("ppdlx")


def teacher_resolution(cfg, teacher_cfg=None) -> int:
    if cfg.distill.teacher_resolution:
        return int(cfg.distill.teacher_resolution)
    if teacher_cfg is None:
        teacher_cfg = load_teacher_config(cfg)
    return int(teacher_cfg.data.transforms.crop_size)


def load_teacher_config(cfg):
    path = cfg.distill.teacher_config
    if not path:
        raise ConfigError("distill.enabled=true but distill.teacher_config is not set: give the teacher's ppdlx "
                          "config, e.g. -o distill.teacher_config=configs/demo/rn50_demo.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"distill.teacher_config={path}: file not found")
    teacher_cfg = resolve_preprocessing(load_config(path))  # its resolution and mean/std: its own model's
    if teacher_cfg.model.data_format != cfg.model.data_format:  # the batch's layout
        teacher_cfg = teacher_cfg.replace({"model.data_format": cfg.model.data_format})
    return teacher_cfg


def teacher_data_config(cfg):
    """The config the training loader is built from when distilling: batches at the teacher's
    resolution (random-resized-crop straight to it; the non-random path keeps its crop ratio)."""
    if not cfg.distill.enabled:
        return cfg
    res = teacher_resolution(cfg)
    student = cfg.data.transforms.crop_size
    if res == student:
        return cfg
    resize = int(round(cfg.data.transforms.resize_short * res / student))
    return cfg.replace({"data.transforms.crop_pct": None, "data.transforms.crop_size": res,
                        "data.transforms.resize_short": resize})


def build_teacher(cfg):
    """The frozen teacher (eval mode, stop_gradient) and its config."""
    teacher_cfg = load_teacher_config(cfg)
    if teacher_cfg.model.num_classes != cfg.model.num_classes:
        raise ConfigError(f"distill.teacher_config={cfg.distill.teacher_config}: teacher has model.num_classes="
                          f"{teacher_cfg.model.num_classes} but the student has {cfg.model.num_classes}; the soft "
                          f"targets need the same classes")
    weights = cfg.distill.teacher_weights or teacher_cfg.model.weights
    if not weights:
        raise ConfigError("distill.teacher_weights is not set (nor model.weights in the teacher config): pass "
                          "-o distill.teacher_weights=<teacher checkpoint prefix>")
    teacher = build_model(teacher_cfg)
    try:
        missing = load_weights(teacher, weights)
    except ConfigError as err:
        raise ConfigError(f"distill.teacher_weights: {err}") from None
    if missing:
        raise ConfigError(f"distill.teacher_weights={weights}: {len(missing)} teacher parameters are not in the file "
                          f"(e.g. '{missing[0]}'); is it a checkpoint of {teacher_cfg.model.name}?")
    for p in teacher.parameters():
        p.stop_gradient = True
    teacher.eval()
    return teacher, teacher_cfg


def _channel_shape(data_format):
    return [1, -1, 1, 1] if data_format == "NCHW" else [1, 1, 1, -1]


class DistillationObjective:
    """``objective(model, batch, epoch, step) -> (loss, n_images)`` with a frozen teacher."""

    def __init__(self, criterion, teacher, student_resolution: int, temperature: float = 1.0, weight: float = 1.0,
                 data_format: str = "NCHW", renormalize=None, mix: MixSpec = MixSpec(), seed: int = 0,
                 interpolation: str = "bicubic"):
        self.criterion = criterion
        self.teacher = teacher
        self.student_resolution = int(student_resolution)
        self.temperature, self.weight = float(temperature), float(weight)
        self.data_format = data_format
        self.interpolation = interpolation
        self.mix, self.seed = mix, seed
        self.renormalize = None
        if renormalize is not None:  # (scale, shift): x_teacher = x * scale + shift, per channel
            shape = _channel_shape(data_format)
            self.renormalize = tuple(paddle.to_tensor(np.asarray(v, np.float32)).reshape(shape) for v in renormalize)
        self.last = {}

    def _spatial(self, images):
        return tuple(images.shape[2:4]) if self.data_format == "NCHW" else tuple(images.shape[1:3])

    def student_input(self, images):
        r = self.student_resolution
        if self._spatial(images) == (r, r):
            return images
        return F.interpolate(images, size=[r, r], mode=self.interpolation, align_corners=False,
                             data_format=self.data_format)

    @paddle.no_grad()
    def teacher_logits(self, images):
        self.teacher.eval()
        if images.dtype != paddle.float32:  # DALI's float16 batches (data.dali.output_dtype)
            images = images.astype("float32")
        if self.renormalize is not None:
            images = images * self.renormalize[0] + self.renormalize[1]
        # in float32 outside the student's autocast, as the reference's train_one_epoch calls its teacher
        with paddle.amp.auto_cast(enable=False):
            return self.teacher(images).detach().astype("float32")

    def soft_target_loss(self, student_logits, teacher_logits):
        t = self.temperature
        soft = F.softmax(teacher_logits / t, axis=-1)
        log_p = F.log_softmax(student_logits.astype("float32") / t, axis=-1)
        return (-(soft * log_p).sum(axis=-1)).mean() * (t * t)

    def __call__(self, model, batch, epoch: int, step: int):
        images, labels = batch
        targets = None
        if self.mix.enabled:
            images, targets = mixed(self.criterion, images, labels, self.mix, self.seed, epoch, step,
                                    self.data_format == "NHWC")
        logits = model(self.student_input(images))
        ce = self.criterion(logits, targets=targets) if targets is not None else self.criterion(logits, labels)
        kd = self.soft_target_loss(logits, self.teacher_logits(images))
        self.last = {"ce": ce, "kd": kd}
        return ce + self.weight * kd, int(images.shape[0])


def build_distillation_objective(cfg, criterion):
    d = cfg.distill
    teacher, teacher_cfg = build_teacher(cfg)
    t_res = teacher_resolution(cfg, teacher_cfg)
    s = cfg.data.transforms
    ts = teacher_cfg.data.transforms
    renorm = None
    if list(s.mean) != list(ts.mean) or list(s.std) != list(ts.std):
        # student-normalised x -> pixel = x * std_s + mean_s -> teacher-normalised (pixel - mean_t) / std_t
        scale = np.asarray(s.std, np.float64) / np.asarray(ts.std, np.float64)
        shift = (np.asarray(s.mean, np.float64) - np.asarray(ts.mean, np.float64)) / np.asarray(ts.std, np.float64)
        renorm = (scale, shift)
    log.info("distillation: teacher %s (%s, weights %s) at %d px, student %s at %d px (bicubic resize%s), "
             "T=%g, weight %g%s", teacher_cfg.model.name, d.teacher_config,
             d.teacher_weights or teacher_cfg.model.weights,
             t_res, cfg.model.name, s.crop_size, "" if t_res != s.crop_size else " not needed", d.temperature, d.weight,
             "; batch re-normalised for the teacher" if renorm is not None else "")
    return DistillationObjective(criterion, teacher, s.crop_size, d.temperature, d.weight, cfg.model.data_format,
                                 renorm, MixSpec.of(cfg.train), cfg.global_.seed)
