"""The run plan: what this run does on this machine, decided once from the (frozen) config.

The config says what was asked for (``global.cpu_fast_kernels: auto``, ``amp.dtype: bfloat16``,
``global.cpu_threads: null``); the plan says what runs (NHWC with oneDNN kernels or not, AMP or
float32 and why, how many threads, which graph and IR, the pre-processing with each value's source:
the config or the model's ``default_cfg``). It is logged in one line and written to
``<output_dir>/plan.yaml`` next to ``config.yaml``; builders read the config through
:meth:`RunPlan.configure`, which carries the plan's data layout, and build the model under
:attr:`RunPlan.layer_config` (which kernels its layers train on).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import paddle

from ppdlx import dist
from ppdlx.config import save_yaml
from ppdlx.engine.amp import AmpPlan
from ppdlx.engine.logger import setup_logging
from ppdlx.layers import LayerConfig
from ppdlx.layers.cpu_kernels import plan_fast_cpu_kernels

log = logging.getLogger("ppdlx")


@dataclass(frozen=True)
class RunEnv:
    rank: int
    world_size: int
    device: str
    cpu_threads: int


@dataclass(frozen=True)
class RunPlan:
    rank: int
    world_size: int
    device: str
    cpu_threads: int
    graph: str                # dynamic | to_static | static
    ir: str                   # the static IR of static programs ("PIR", legacy IR); "dygraph" otherwise
    data_format: str          # the layout models and loaders use (cpu_fast_kernels may switch it)
    fast_cpu_kernels: bool
    amp: AmpPlan
    # the pre-processing the data pipelines use: {key: {value, source: config | default_cfg}}
    # (ppdlx.tasks.preprocess; the run's config.yaml keeps the nulls it was given)
    preprocess: dict = field(default_factory=dict)

    def configure(self, cfg):
        """``cfg`` (pre-processing resolved) as the builders must see it: with the planned data layout."""
        return with_layout(cfg, self.data_format)

    @property
    def layer_config(self) -> LayerConfig:
        """What the layers of the model trained here pick (``ppdlx.layers.config``)."""
        return LayerConfig(cpu_kernels=self.fast_cpu_kernels, bf16=self.amp.cpu_bf16_convs)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["amp"] = {k: v for k, v in out["amp"].items() if k != "note" or v}
        return out

    def line(self) -> str:
        amp = f"{self.amp.dtype} {self.amp.level}" if self.amp.enabled else "off (float32)"
        if self.amp.cpu_bf16_convs:
            amp = "bfloat16 convolutions (oneDNN, float32 master weights)"
        return (f"plan: device {self.device} ({self.cpu_threads} CPU threads), {self.world_size} rank(s); "
                f"graph {self.graph} ({self.ir}); {self.data_format}, fast CPU kernels "
                f"{'on' if self.fast_cpu_kernels else 'off'}; amp {amp}")

    def save(self, path: str) -> None:
        save_yaml(self.to_dict(), path)


def start_run(cfg, collective_programs: bool = False) -> RunEnv:
    """Process set-up every entry point does: data-parallel init, logging, device, CPU threads."""
    device = dist.resolve_device(cfg.global_.device)
    rank, world = dist.init(device, collective_programs)
    setup_logging(rank)
    paddle.set_device(device)
    return RunEnv(rank, world, device, dist.configure_cpu_threads(cfg.global_.cpu_threads))


def plan_cpu_kernels(cfg, device: str) -> tuple[bool, str]:
    """``(fast kernels on, data layout)`` for a training run: the fast CPU kernels train in NHWC."""
    on = plan_fast_cpu_kernels(cfg.global_.cpu_fast_kernels, device, cfg.train.graph, cfg.distill.enabled,
                               cfg.qat.enabled)
    if on and cfg.model.data_format != "NHWC":
        log.info("global.cpu_fast_kernels: training in NHWC on CPU (model.data_format was %s; checkpoints "
                 "are layout-free; global.cpu_fast_kernels=false keeps it)", cfg.model.data_format)
    return on, ("NHWC" if on else cfg.model.data_format)


def with_layout(cfg, data_format: str):
    """``cfg`` with ``model.data_format`` set to ``data_format`` (``cfg`` itself when it has it)."""
    return cfg if cfg.model.data_format == data_format else cfg.replace({"model.data_format": data_format})
