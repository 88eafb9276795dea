"""Input pipelines: DALI CPU vs paddle.io images/s (train and val), plus end-to-end training real vs synthetic.

    python tools/benchmark.py loader -c configs/rn50_amp.yaml --backend both --steps 12 --report out.json

The JPEG tree (``--data``, written on first use) has ``--unique`` generated natural-looking
images of about 500x375 (smooth multi-scale colour fields, shapes, blur, sensor-like
noise; JPEG quality 92, ~70 KB each, so decoding costs what an ImageNet JPEG costs),
hard-linked ``--images`` times over the class folders so that one measurement fits in
one epoch. Both backends get the same transforms, batch size, output (float32
normalised tensors in ``model.data_format``) and ``--workers`` worker processes
(paddle.io) / threads (DALI). The cases are measured interleaved, ``--repeats`` times,
and the median is reported, because this machine is shared and noisy.

End-to-end (``--e2e-config``, default the demo config on its digits JPEGs): one
trainer per input (synthetic tensors, DALI CPU, paddle.io), each timing whole
epochs of ``train_one_epoch()`` interleaved; the ratio real/synthetic says whether the
input pipeline slows training down.
"""
from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time

import numpy as np

DEFAULT_CONFIG = "configs/rn50_amp.yaml"
DEFAULT_E2E_CONFIG = "configs/demo/rn50_demo.yaml"


def add_arguments(p):
    p.add_argument("-c", "--config", default=DEFAULT_CONFIG, help="config whose data.transforms are measured")
    p.add_argument("-o", "--override", action="append", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--backend", choices=["dali", "paddle", "both"], default="both")
    p.add_argument("--steps", type=int, default=12, help="timed batches per measurement")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches first (worker start-up, prefetch)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved measurements per case (median reported)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                   help="paddle.io worker processes = DALI threads")
    p.add_argument("--data", default="output/bench_jpeg", help="JPEG tree (written if missing)")
    p.add_argument("--unique", type=int, default=256, help="distinct generated JPEGs")
    p.add_argument("--images", type=int, default=2048, help="train files (hard links of the unique ones)")
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--split", choices=["train", "val", "both"], default="both")
    p.add_argument("--stages", type=int, default=1,
                   help="1 = also time DALI CPU stages (decode, resize, normalise) on one thread, 0 = skip")
    p.add_argument("--e2e-config", default=DEFAULT_E2E_CONFIG,
                   help="config for the end-to-end real-vs-synthetic training measurement ('' to skip)")
    p.add_argument("--e2e-epochs", type=int, default=3, help="timed epochs per end-to-end case (0 skips it)")
    p.add_argument("--e2e-steps", type=int, default=None, help="cap on steps per epoch (default: whole epoch)")


# --------------------------------------------------------------------------- data
def natural_image(rng: np.random.Generator, width: int = 500, height: int = 375):
    """A photo-like RGB image: 1/f-ish colour field, a few shapes, blur and noise."""
    from PIL import Image, ImageDraw, ImageFilter
    acc = np.zeros((height, width, 3), np.float32)
    for cells, weight in ((4, 1.0), (12, 0.5), (40, 0.25), (120, 0.12)):
        small = rng.standard_normal((max(2, cells * height // width), cells, 3)).astype(np.float32)
        small = ((small - small.min()) / (np.ptp(small) + 1e-6) * 255).astype(np.uint8)
        acc += weight * (np.asarray(Image.fromarray(small).resize((width, height), Image.BICUBIC), np.float32)
                         - 128.0)
    acc = acc / 1.9 + rng.uniform(60, 190, 3).astype(np.float32)
    img = Image.fromarray(np.clip(acc, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        box = (x0, y0, x0 + int(rng.integers(20, 200)), y0 + int(rng.integers(20, 160)))
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 1.5))))
    arr = np.asarray(img, np.float32)
    arr = arr + rng.normal(0, rng.uniform(5, 10), (height, width, 1)) + rng.normal(0, 4, (height, width, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def write_jpeg_tree(root: str, unique: int = 256, images: int = 2048, classes: int = 8, val_images: int = None,
                    seed: int = 0) -> dict:
    """``root/{train,val}/cNN/*.jpg``; ``unique`` generated files, the rest hard links to them."""
    val_images = val_images or images // 2
    marker = os.path.join(root, f".done_{unique}_{images}_{val_images}_{classes}")
    if os.path.exists(marker):
        return {"train": images, "val": val_images, "unique": unique}
    rng = np.random.default_rng(seed)
    pool = os.path.join(root, "_unique")
    os.makedirs(pool, exist_ok=True)
    sources = []
    for i in range(unique):
        path = os.path.join(pool, f"{i:05d}.jpg")
        if not os.path.exists(path):
            natural_image(rng).save(path + ".tmp", format="JPEG", quality=92)
            os.replace(path + ".tmp", path)
        sources.append(path)
    for split, count in (("train", images), ("val", val_images)):
        for i in range(count):
            folder = os.path.join(root, split, f"c{i % classes:02d}")
            os.makedirs(folder, exist_ok=True)
            target = os.path.join(folder, f"{split}_{i:06d}.jpg")
            if not os.path.exists(target):
                try:
                    os.link(sources[i % unique], target)
                except OSError:
                    import shutil
                    shutil.copyfile(sources[i % unique], target)
    open(marker, "w").close()
    return {"train": images, "val": val_images, "unique": unique}


# ---------------------------------------------------------------------- loaders
def _measure(loader, steps: int, warmup: int, epoch: int):
    """images/s over ``steps`` batches after ``warmup`` untimed ones (one epoch must hold both)."""
    loader.set_epoch(epoch)
    need = steps + warmup
    if len(loader) < need:
        raise ValueError(f"loader has {len(loader)} batches, need {need}: raise --images")
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    images = 0
    start = time.perf_counter()
    for _ in range(steps):
        x, _ = next(it)
        images += int(x.shape[0])
    elapsed = time.perf_counter() - start
    del it
    return images / elapsed


def _loader_cases(args):
    from ppdlx.config import flatten_overrides, load_config
    from ppdlx.data.loader import build_classification_loader
    from ppdlx.tasks.preprocess import resolve_preprocessing
    counts = write_jpeg_tree(args.data, args.unique, args.images, args.classes)
    overrides = list(flatten_overrides(args.override)) + [
        f"data.root={args.data}", f"model.num_classes={args.classes}", f"data.batch_size={args.batch_size}",
        f"data.workers={args.workers}", f"data.dali.num_threads={args.workers}", "data.dali.device=cpu",
        "global.device=cpu"]
    cfg = resolve_preprocessing(load_config(args.config, overrides))
    backends = ["dali", "paddle"] if args.backend == "both" else [args.backend]
    splits = ["train", "val"] if args.split == "both" else [args.split]
    loaders = {}
    for split in splits:
        for backend in backends:
            c = cfg.replace({"data.backend": backend})
            loaders[(split, backend)] = build_classification_loader(c, split, 0, 1, batch_size=args.batch_size)
    return cfg, counts, loaders


def backends_of(loaders) -> set:
    return {backend for _, backend in loaders}


def _run_loaders(args, notes):
    import paddle
    paddle.set_device("cpu")
    cfg, counts, loaders = _loader_cases(args)
    t = cfg.data.transforms
    notes.append(f"JPEG tree {args.data}: {counts['unique']} distinct ~500x375 q92 JPEGs, {counts['train']} train "
                 f"/ {counts['val']} val files (hard links); batch {args.batch_size}, {args.workers} paddle.io "
                 f"workers = {args.workers} DALI threads (prefetch depth {cfg.data.dali.prefetch_queue_depth}); "
                 f"train: random-resized-crop {t.crop_size} scale {list(t.scale)} + flip {t.hflip}; val: resize "
                 f"{t.resize_short} + centre crop {t.crop_size}; {cfg.model.data_format} float32")
    runs = {key: [] for key in loaders}
    load_before = os.getloadavg()[0]
    for r in range(args.repeats):
        for key, loader in loaders.items():
            runs[key].append(_measure(loader, args.steps, args.warmup, r))
    notes.append(f"load average (1 min) before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f} on "
                 f"{os.cpu_count()} CPUs")
    if args.stages and "dali" in backends_of(loaders):
        _dali_stage_profile(args, cfg, notes)
    rows = []
    names = {"dali": "dali-cpu", "paddle": "paddle.io"}
    for (split, backend), values in runs.items():
        rows.append({"case": f"{split} {names[backend]}", "pipeline": split, "backend": names[backend],
                     "images_per_s": statistics.median(values), "runs": [round(v, 1) for v in values],
                     "batch": args.batch_size, "workers": args.workers})
    for split in ("train", "val"):
        if (split, "dali") in runs and (split, "paddle") in runs:
            ratio = [d / p for d, p in zip(runs[(split, "dali")], runs[(split, "paddle")])]
            for row in rows:
                if row["case"] == f"{split} dali-cpu":
                    row["vs_paddle"] = statistics.median(ratio)
            notes.append(f"{split}: DALI CPU / paddle.io = {statistics.median(ratio):.2f}x "
                         f"(per repeat: {', '.join(f'{x:.2f}' for x in ratio)})")
    return rows


def _dali_stage_profile(args, cfg, notes):
    """ms per image of each DALI CPU stage on one thread (cumulative pipelines, differences reported)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from ppdlx.data.image_folder import scan_image_folder
    files = [path for path, _ in scan_image_folder(os.path.join(args.data, "train"))[1]][:args.unique]
    t = cfg.data.transforms

    from ppdlx.data.dali_feed import EpochFeed, read_fed_files
    batch = 32
    feed = EpochFeed(files, [0] * len(files), batch)  # the loader's reading: fed paths, fn.io.file.read

    def graph(stage):
        jpegs, _ = read_fed_files(feed)
        if stage == "read":
            return jpegs
        if stage.startswith("full_decode"):
            return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=list(t.scale), random_aspect_ratio=list(t.ratio))
        if stage == "roi_decode":
            return images
        images = fn.resize(images, resize_x=t.crop_size, resize_y=t.crop_size,
                           antialias=stage != "resize_no_antialias")
        if stage.startswith("resize"):
            return images
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=list(t.mean),
                                        std=list(t.std), mirror=fn.random.coin_flip())

    import nvidia.dali as dali
    stages = ["read", "full_decode", "roi_decode", "resize", "resize_no_antialias", "normalise"]
    ms = {k: [] for k in stages}
    for _ in range(3):
        for stage in stages:
            feed.start([i % len(files) for i in range(5 * batch)])
            pipe = dali.pipeline_def(lambda: graph(stage))(batch_size=batch, num_threads=1, device_id=None, seed=1,
                                                           prefetch_queue_depth=1, exec_pipelined=False,
                                                           exec_async=False)
            pipe.build()
            pipe.run()
            start = time.perf_counter()
            for _ in range(4):
                pipe.run()
            ms[stage].append((time.perf_counter() - start) * 1000 / (4 * batch))
            del pipe
    m = {k: min(v) for k, v in ms.items()}  # min: least disturbed by other load
    notes.append(f"DALI CPU train stages, one thread, ms/image (best of 3): read {m['read']:.2f}, full decode "
                 f"{m['full_decode']:.2f}, fused random-crop decode {m['roi_decode']:.2f}, + resize to "
                 f"{t.crop_size} {m['resize'] - m['roi_decode']:.2f} (without antialias "
                 f"{m['resize_no_antialias'] - m['roi_decode']:.2f}), + crop_mirror_normalize "
                 f"{m['normalise'] - m['resize']:.2f}; total {m['normalise']:.2f} ms -> "
                 f"{1000 / m['normalise']:.0f} img/s per core")
    return m


# ------------------------------------------------------------------ end-to-end
class _TimedLoader:
    """Wraps a trainer's loader; records when each batch is handed over."""

    def __init__(self, inner):
        self.inner = inner
        self.stamps: list = []  # one list of perf_counter stamps per epoch

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        stamps = [time.perf_counter()]
        self.stamps.append(stamps)
        for batch in self.inner:
            stamps.append(time.perf_counter())
            yield batch


def _run_e2e(args, notes):
    from ppdlx.config import load_config
    from ppdlx.tasks.preprocess import resolve_preprocessing
    from ppdlx.engine.run import build_training
    cfg = resolve_preprocessing(load_config(args.e2e_config))
    if not os.path.isdir(os.path.join(cfg.data.root, cfg.data.train_split)):
        from ppdlx.data.demo import prepare
        prepare("digits", cfg.data.root, cfg.data.transforms.crop_size)
    tmp = tempfile.mkdtemp(prefix="ppdlx_e2e_")
    trainers = {}
    steps = None
    for backend in ("dali", "paddle", "synthetic"):
        changes = {"data.backend": backend, "global.output_dir": os.path.join(tmp, backend),
                   "global.log_interval": 10 ** 6}
        if steps is not None:
            changes.update({"data.synthetic.num_images": steps * cfg.data.batch_size, "train.steps_per_epoch": steps})
        elif args.e2e_steps:
            changes["train.steps_per_epoch"] = args.e2e_steps
        trainer = build_training(cfg.replace(changes))
        trainer.train_loader = _TimedLoader(trainer.train_loader)
        trainers[backend] = trainer
        if steps is None:
            steps = trainer.optimizer_steps_per_epoch()
    logging.getLogger("ppdlx").setLevel(logging.WARNING)
    for trainer in trainers.values():  # warm-up epoch (kernels, allocator, worker start-up)
        saved, trainer.steps_per_epoch = trainer.steps_per_epoch, 3
        trainer.train_one_epoch()
        trainer.steps_per_epoch, trainer.epoch = saved, trainer.epoch + 1
    epoch_ips = {k: [] for k in trainers}
    names = list(trainers)
    for r in range(args.e2e_epochs):
        for name in names[r % 3:] + names[:r % 3]:  # rotate the order: no case always runs after another
            trainer = trainers[name]
            start = time.perf_counter()
            trainer.train_one_epoch()
            epoch_ips[name].append(steps * cfg.data.batch_size / (time.perf_counter() - start))
            trainer.epoch += 1
    # Steady-state step time: median gap between batch hand-overs, first gap of each epoch left out.
    step_ips = {}
    for name, trainer in trainers.items():
        gaps = [b - a for stamps in trainer.train_loader.stamps[1:] for a, b in zip(stamps[1:], stamps[2:])]
        step_ips[name] = cfg.data.batch_size / statistics.median(gaps)
    labels = {"dali": "dali-cpu", "paddle": "paddle.io", "synthetic": "synthetic"}
    rows = []
    for name in names:
        row = {"case": f"e2e {os.path.basename(args.e2e_config)} {labels[name]}", "pipeline": "train+model",
               "backend": labels[name], "images_per_s": statistics.median(epoch_ips[name]),
               "runs": [round(v, 1) for v in epoch_ips[name]], "steady_images_per_s": step_ips[name],
               "batch": cfg.data.batch_size,
               "workers": cfg.data.workers if name == "paddle" else cfg.data.dali.num_threads}
        if name != "synthetic":
            row["vs_synthetic"] = statistics.median([v / s for v, s in zip(epoch_ips[name], epoch_ips["synthetic"])])
            row["steady_vs_synthetic"] = step_ips[name] / step_ips["synthetic"]
        rows.append(row)
    notes.append(f"end-to-end: {args.e2e_config}, {steps} steps x batch {cfg.data.batch_size} per epoch, "
                 f"{args.e2e_epochs} whole epochs per case, interleaved in rotating order (images_per_s: whole "
                 f"epochs, loader start-up included, median; steady: median step gap); "
                 + "; ".join(f"{r['backend']}/synthetic = {r['vs_synthetic']:.2f}x epochs, "
                             f"{r['steady_vs_synthetic']:.2f}x steady" for r in rows if "vs_synthetic" in r))
    return rows


def run(args) -> dict:
    notes: list = []
    rows = _run_loaders(args, notes) if args.steps > 0 else []
    if args.e2e_config and args.e2e_epochs > 0:
        rows += _run_e2e(args, notes)
    return {"rows": rows, "notes": notes}
