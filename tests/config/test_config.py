import glob
import inspect
import os
import subprocess
import sys

import pytest
import yaml

from ppdlx.config import load_config, save_config
from ppdlx.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def test_base_inheritance_merges_dicts_and_replaces_lists(tmp_path):
    write(tmp_path / "base" / "a.yaml", {"train": {"epochs": 5, "accumulate": 2},
                                         "data": {"transforms": {"mean": [1.0, 2.0, 3.0], "crop_size": 64}}})
    write(tmp_path / "base" / "b.yaml", {"train": {"epochs": 7}})
    child = write(tmp_path / "child.yaml", {"_BASE_": ["base/a.yaml", "base/b.yaml"],
                                            "data": {"transforms": {"mean": [9.0]}}})
    cfg = load_config(child)
    assert cfg.train.epochs == 7          # later base wins
    assert cfg.train.accumulate == 2      # dicts merged
    assert cfg.data.transforms.mean == (9.0,)  # lists replaced, not merged (and frozen as a tuple)
    assert cfg.data.transforms.crop_size == 64


def test_overrides_parse_yaml_scalars_and_win(tmp_path):
    path = write(tmp_path / "c.yaml", {"train": {"epochs": 3}})
    cfg = load_config(path, ["train.epochs=90", "amp.enabled=true", "data.transforms.scale=[0.2, 1.0]",
                             "model.weights=output/x/best"])
    assert cfg.train.epochs == 90 and cfg.amp.enabled is True
    assert tuple(cfg.data.transforms.scale) == (0.2, 1.0)
    assert cfg.model.weights == "output/x/best"


def test_unknown_key_names_file_path_value_and_suggestion(tmp_path):
    path = write(tmp_path / "bad.yaml", {"optimizer": {"momentun": 0.9}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: optimizer.momentun: unknown key (value 0.9); "
                              f"did you mean 'optimizer.momentum'?")


def test_unknown_key_from_base_names_the_base_file(tmp_path):
    base = write(tmp_path / "base.yaml", {"train": {"epocs": 3}})
    child = write(tmp_path / "child.yaml", {"_BASE_": ["base.yaml"], "train": {"accumulate": 2}})
    with pytest.raises(ConfigError, match=r"base\.yaml: train\.epocs: unknown key .*did you mean 'train\.epochs'"):
        load_config(child)
    assert os.path.isfile(base)


def test_unknown_override_key_is_rejected_with_suggestion(tmp_path):
    path = write(tmp_path / "c.yaml", {})
    with pytest.raises(ConfigError) as err:
        load_config(path, ["lr.base_lrr=0.1"])
    assert str(err.value) == "-o: lr.base_lrr: unknown key (value 0.1); did you mean 'lr.base_lr'?"


def test_wrong_type_and_bad_choice(tmp_path):
    path = write(tmp_path / "c.yaml", {"train": {"epochs": "ten"}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: train.epochs: bad value 'ten': input should be a valid integer")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["amp.dtype=bfloat61"])
    assert str(err.value).startswith("-o: amp.dtype: bad value 'bfloat61'; did you mean 'bfloat16'?")


def test_unknown_top_level_section(tmp_path):
    path = write(tmp_path / "c.yaml", {"optimiser": {"name": "momentum"}})
    with pytest.raises(ConfigError, match="did you mean 'optimizer'"):
        load_config(path)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), ["train.epochs=2"])
    out = tmp_path / "resolved.yaml"
    save_config(cfg, str(out))
    again = load_config(str(out))
    assert again.to_dict() == cfg.to_dict()
    assert again.train.epochs == 2 and again.model.num_classes == 10


CONFIGS = os.path.join(ROOT, "configs")
# every YAML under configs/ -> (model.name, data.dataset, model.num_classes) after _BASE_ resolution;
# base/gpunet_imagenet.yaml is a recipe fragment without a model, so it resolves to the schema default
SHIPPED = {
    "base/gpunet_imagenet.yaml": ("resnet50", "image_folder", 1000),
    "base/rn50_imagenet.yaml": ("resnet50", "image_folder", 1000),
    "demo/efficientdet_demo.yaml": ("efficientdet_d0", "coco", 3),
    "demo/efficientdet_fruit_overfit.yaml": ("efficientdet_d0", "coco", 2),
    "demo/efficientdet_qat_demo.yaml": ("efficientdet_d0", "coco", 3),
    "demo/gpunet_demo.yaml": ("gpunet_0", "image_folder", 10),
    "demo/gpunet_distill_demo.yaml": ("gpunet_0", "image_folder", 10),
    "demo/gpunet_qat_demo.yaml": ("gpunet_0", "image_folder", 10),
    "demo/rn50_asp_demo.yaml": ("resnet50", "image_folder", 10),
    "demo/rn50_demo.yaml": ("resnet50", "image_folder", 10),
    "demo/rn50_qat_demo.yaml": ("resnet50", "image_folder", 10),
    "efficientdet_d0.yaml": ("efficientdet_d0", "coco", 80),
    "efficientnet_lite0.yaml": ("efficientnet_lite0", "image_folder", 1000),
    "gpunet/gpunet_0.yaml": ("gpunet_0", "image_folder", 1000),
    "gpunet/gpunet_1.yaml": ("gpunet_1", "image_folder", 1000),
    "gpunet/gpunet_2.yaml": ("gpunet_2", "image_folder", 1000),
    "gpunet/gpunet_d1.yaml": ("gpunet_d1", "image_folder", 1000),
    "gpunet/gpunet_d2.yaml": ("gpunet_d2", "image_folder", 1000),
    "gpunet/gpunet_p0.yaml": ("gpunet_p0", "image_folder", 1000),
    "gpunet/gpunet_p1.yaml": ("gpunet_p1", "image_folder", 1000),
    "rn50_amp.yaml": ("resnet50", "image_folder", 1000),
    "rn50_asp.yaml": ("resnet50", "image_folder", 1000),
    "rn50_qat.yaml": ("resnet50", "image_folder", 1000),
    "rn50_tf32.yaml": ("resnet50", "image_folder", 1000),
}


def shipped_config_names():
    paths = glob.glob(os.path.join(CONFIGS, "**", "*.yaml"), recursive=True)
    return sorted(os.path.relpath(p, CONFIGS).replace(os.sep, "/") for p in paths)


def test_every_shipped_config_is_listed():
    # a new YAML in configs/ must get a row in SHIPPED, so the test below covers it
    assert shipped_config_names() == sorted(SHIPPED)


@pytest.mark.parametrize("name", shipped_config_names())
def test_shipped_config_loads_builds_and_round_trips(name, tmp_path):
    import ppdlx.data.coco  # noqa: F401  (registers "coco")
    import ppdlx.data.image_folder  # noqa: F401  (registers "image_folder")
    import ppdlx.models  # noqa: F401  (registers every model family)
    from ppdlx.models.from_config import check_builder_args
    from ppdlx.tasks import task_of
    from ppdlx.models import gpunet
    from ppdlx.registry import DATASETS, MODELS

    cfg = load_config(os.path.join(CONFIGS, name))
    assert (cfg.model.name, cfg.data.dataset, cfg.model.num_classes) == SHIPPED[name]
    assert cfg.model.name in MODELS and cfg.data.dataset in DATASETS
    check_builder_args(cfg.model.name, cfg.model.args)  # a misspelt model.args key raises ConfigError
    is_detector = "image_size" in inspect.signature(MODELS.get(cfg.model.name)).parameters
    assert is_detector == (task_of(cfg).name == "detection")
    if name.startswith("gpunet/"):
        # the ImageNet recipes train at the architecture's own resolution
        arch = gpunet.load_config(gpunet.arch_path(cfg.model.name))
        assert cfg.data.transforms.crop_size == arch[0]["img_resolution"]
    if cfg.distill.teacher_config:
        teacher = load_config(os.path.join(ROOT, cfg.distill.teacher_config))
        assert teacher.model.num_classes == cfg.model.num_classes and teacher.model.name in MODELS
    resolved = tmp_path / "resolved.yaml"
    save_config(cfg, str(resolved))
    assert load_config(str(resolved)).to_dict() == cfg.to_dict()


def test_cli_bad_key_exits_nonzero_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c",
                           os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), "-o", "train.epoch=3",
                           "global.seed=1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert lines[-1] == "error: -o: train.epoch: unknown key (value 3); did you mean 'train.epochs'?"
    assert "Traceback" not in proc.stderr


def test_unknown_dataset_is_refused_with_a_suggestion():
    # Before: any string but "coco" silently trained an image-folder classifier.
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.dataset=cocoo"])
    assert str(err.value) == ("-o: data.dataset: bad value 'cocoo'; did you mean 'coco'? "
                              "(allowed: 'image_folder' or 'coco')")


def test_a_loaded_config_is_frozen_and_replace_makes_a_validated_copy():
    # Before: assignment changed the config in place (cpu_fast_kernels: auto rewrote model.data_format
    # while the run executed); there was no way to make a changed copy but deepcopy + assignment.
    cfg = load_config(os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"))
    with pytest.raises(ConfigError) as err:
        cfg.model.data_format = "NHWC"
    assert str(err.value) == ("the config is frozen after loading (cannot set model.data_format = 'NHWC'); make a "
                              "changed copy with cfg.replace({'model.data_format': ...})")
    with pytest.raises(ConfigError, match=r"cannot set global\.seed = 1"):
        cfg.global_.seed = 1
    changed = cfg.replace({"model.data_format": "NHWC", "global.seed": 7, "data.transforms.crop_pct": 0.5})
    assert (changed.model.data_format, changed.global_.seed) == ("NHWC", 7)
    assert changed.data.transforms.resize_short == 2 * changed.data.transforms.crop_size  # validators re-run
    assert (cfg.model.data_format, cfg.global_.seed, cfg.data.transforms.crop_pct) == ("NCHW", 42, None)
    with pytest.raises(ValueError, match="data_format"):
        cfg.replace({"model.data_format": "NWHC"})


def test_the_containers_of_a_loaded_config_are_frozen_too():
    # Before: only assignment raised; cfg.model.args["depth"] = 1 or cfg.asp.exclude.append(...)
    # changed the loaded config in place.
    import copy
    import pickle
    cfg = load_config(os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
                      ["model.args={stem: {width: [32, 64]}}", "asp.exclude=[stem.*]", "data.transforms.mean=[1,2,3]"])
    with pytest.raises(ConfigError, match=r"^the config is frozen after loading \(cannot change a mapping"):
        cfg.model.args["depth"] = 1
    with pytest.raises(ConfigError, match="cfg.replace"):
        cfg.model.args["stem"].update(width=[1])
    for container in (cfg.model.args["stem"]["width"], cfg.asp.exclude, cfg.asp.layer_types, cfg.data.transforms.mean):
        assert isinstance(container, tuple)
    # what is written out and copied stays plain YAML, and equal
    saved = cfg.to_dict()
    assert saved["model"]["args"] == {"stem": {"width": [32, 64]}} and type(saved["model"]["args"]["stem"]) is dict
    assert saved["asp"]["exclude"] == ["stem.*"] and saved["data"]["transforms"]["mean"] == [1.0, 2.0, 3.0]
    for twin in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg)), load_config(None, [])
                 .replace({k: v for k, v in [("model", saved["model"]), ("asp", saved["asp"]), ("data", saved["data"])]})):
        assert twin.to_dict()["model"] == saved["model"] and twin.asp.exclude == ("stem.*",)
    assert dict(cfg.replace({"model.args": {**cfg.model.args, "depth": 1}}).model.args) == {
        "stem": {"width": (32, 64)}, "depth": 1}


def test_validating_every_shipped_yaml_imports_neither_pil_nor_paddle():
    # Before: the schema imported ppdlx.data.augment (PIL) to check data.transforms.randaugment.
    code = ("import glob, sys; from ppdlx.config import load_config\n"
            "paths = sorted(glob.glob('configs/**/*.yaml', recursive=True))\n"
            "cfgs = [load_config(p) for p in paths]\n"
            "assert any(c.data.transforms.randaugment for c in cfgs)\n"
            "print(len(paths), sorted(m for m in ('PIL', 'paddle') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(len(SHIPPED)), "[]"]


DUPLICATE_SECTION = """\
model:
  weights: output/pretrained/best
train:
  epochs: 3
data:
  batch_size: 8
model:
  name: resnet50
"""


def test_duplicate_key_names_the_file_key_and_both_lines(tmp_path):
    # Before: yaml.safe_load kept the second 'model:' section and dropped model.weights without a word.
    path = write(tmp_path / "dup.yaml", DUPLICATE_SECTION)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: key 'model' is given twice in the same mapping (lines 1 and 7); YAML keeps "
                              f"only the last, so the first would be ignored silently: merge the two")
    nested = write(tmp_path / "nested.yaml", "train:\n  epochs: 3\n  accumulate: 2\n  epochs: 5\n")
    with pytest.raises(ConfigError, match=r"nested\.yaml: key 'epochs' is given twice in the same mapping "
                                          r"\(lines 2 and 4\)"):
        load_config(nested)
    flow = write(tmp_path / "flow.yaml", "data:\n  transforms: {crop_size: 32, crop_size: 64}\n")
    with pytest.raises(ConfigError, match=r"flow\.yaml: key 'crop_size' is given twice in the same mapping "
                                          r"\(line 2\)"):
        load_config(flow)
    # a base file is checked the same way when a child names it
    child = write(tmp_path / "child.yaml", {"_BASE_": ["dup.yaml"]})
    with pytest.raises(ConfigError, match=r"dup\.yaml: key 'model' is given twice"):
        load_config(child)


def test_keys_brought_in_by_a_yaml_merge_may_be_overridden(tmp_path):
    path = write(tmp_path / "merged.yaml", "train:\n  <<: {epochs: 4, accumulate: 2}\n  epochs: 7\n")
    cfg = load_config(path)
    assert (cfg.train.epochs, cfg.train.accumulate) == (7, 2)


def test_cli_duplicate_key_exits_2_with_one_line(tmp_path):
    path = write(tmp_path / "dup.yaml", "_BASE_: [" + os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml") + "]\n"
                                        + DUPLICATE_SECTION)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", path,
                           "-o", f"global.output_dir={tmp_path}/out"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert lines[-1] == (f"error: {path}: key 'model' is given twice in the same mapping (lines 2 and 8); YAML keeps "
                         f"only the last, so the first would be ignored silently: merge the two")
    assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "out")


MEAN_STD_CASES = [
    ("data.transforms.mean=[0,0]", "data.transforms.mean=[0, 0]: needs 1 number (every channel) or 3 (R, G, B), got 2; "
     "give e.g. [123.675, 116.28, 103.53], or null for the model's default_cfg"),
    ("data.transforms.std=[1,2,3,4]", "data.transforms.std=[1, 2, 3, 4]: needs 1 number (every channel) or 3 (R, G, "
     "B), got 4; give e.g. [58.395, 57.12, 57.375], or null for the model's default_cfg"),
    ("data.transforms.std=[58.4,0,57.4]", "data.transforms.std=[58.4, 0, 57.4]: every std must be above 0 (images are "
     "divided by it); give e.g. [58.395, 57.12, 57.375], or null for the model's default_cfg"),
    ("data.transforms.std=[-1]", "data.transforms.std=[-1]: every std must be above 0 (images are divided by it); give "
     "e.g. [58.395, 57.12, 57.375], or null for the model's default_cfg"),
]


@pytest.mark.parametrize("override, message", MEAN_STD_CASES)
def test_mean_and_std_of_a_wrong_length_or_not_positive_are_refused_at_load(override, message):
    # Before: accepted; training then reported every image as undecodable (one "skipping unreadable image" line
    # per file) or stopped on a DALI assert, and tools/check_data.py said ok.
    for config in ("rn50_demo.yaml", "efficientdet_demo.yaml"):  # classification and COCO read the same keys
        with pytest.raises(ConfigError) as err:
            load_config(os.path.join(ROOT, "configs", "demo", config), [override])
        assert str(err.value) == "-o: " + message


def test_mean_and_std_of_one_or_three_numbers_or_null_load_and_null_resolves_from_the_model(tmp_path):
    from ppdlx.tasks.preprocess import resolve_preprocessing
    one = load_config(None, ["data.transforms.mean=[127]", "data.transforms.std=[128]"]).data.transforms
    assert (one.mean, one.std) == ((127.0,), (128.0,))
    resolved = resolve_preprocessing(load_config(None, ["model.name=resnet50"])).data.transforms
    assert (resolved.mean, resolved.std) == ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))
    path = write(tmp_path / "bad.yaml", {"_BASE_": [os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml")],
                                         "data": {"transforms": {"mean": [1.0, 2.0]}}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: data.transforms.mean=[1.0, 2.0]: needs 1 number (every channel) or 3 (R, G, "
                              f"B), got 2; give e.g. [123.675, 116.28, 103.53], or null for the model's default_cfg")


def test_cli_wrong_length_mean_exits_2_with_one_line_before_reading_data(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_data.py"), "-c",
                           os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml"), "-o",
                           "data.transforms.mean=[0,0]", "data.root=/nonexistent/never_read",
                           f"global.output_dir={tmp_path}/out"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: -o: data.transforms.mean=[0, 0]: needs 1 number (every channel) or 3 (R, G, B), got 2; give e.g. "
        "[123.675, 116.28, 103.53], or null for the model's default_cfg")
    assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "out")


def test_a_section_given_as_a_value_names_the_section_not_a_schema_class(tmp_path):
    # Before: "-o: train: bad value 5: input should be a valid dictionary or instance of trainconfig".
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train=5"])
    assert str(err.value) == "-o: train: expected a mapping of keys, got 5; set a key inside it, e.g. train.epochs"
    path = write(tmp_path / "scalar.yaml", "data:\n  transforms: [1, 2]\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: data.transforms: expected a mapping of keys, got [1, 2]; set a key inside it, "
                              f"e.g. data.transforms.crop_size")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.args=5"])
    assert str(err.value) == "-o: model.args: expected a mapping of keys, got 5"


def test_a_directory_as_config_says_so_and_names_a_yaml_file_in_it(tmp_path):
    # Before: "configs/: config file not found" for a folder that exists.
    write(tmp_path / "b.yaml", {"train": {"epochs": 1}})
    write(tmp_path / "a.yml", {"train": {"epochs": 2}})
    with pytest.raises(ConfigError) as err:
        load_config(str(tmp_path) + os.sep)
    assert str(err.value) == (f"{tmp_path}: is a directory, not a config file; give a YAML file, e.g. "
                              f"{tmp_path / 'a.yml'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as err:
        load_config(str(tmp_path / "empty"))
    assert str(err.value) == f"{tmp_path / 'empty'}: is a directory, not a config file; give a YAML file"


def test_cli_config_directory_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", "configs/demo/"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: configs/demo: is a directory, not a config file; give a YAML file, e.g. configs/demo/"
        "efficientdet_demo.yaml")


def _laughs(levels=8, width=9, tail="train:\n  epochs: *l{last}\n"):
    """A 'billion laughs' YAML: each level repeats the alias of the one before ``width`` times."""
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n" + tail.format(last=levels - 1)


def test_a_yaml_alias_bomb_is_refused_before_anything_walks_it(tmp_path):
    # Before: refused only by validation, whose error line quoted the expanded value (522 MB, 1.5 GB of memory);
    # in model.args (any mapping) freezing the config walked all 43 million values for minutes.
    for name, tail in (("epochs.yaml", "train:\n  epochs: *l{last}\n"),
                       ("args.yaml", "model:\n  args:\n    width: *l{last}\n")):
        path = write(tmp_path / name, _laughs(tail=tail))
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert str(err.value) == (f"{path}: line 6: its aliases expand this value to 597,871 values (more than "
                                  f"100,000: aliases nested in aliases, a 'billion laughs' file); a config needs no "
                                  f"such value: write it out")
    # aliases that expand modestly still load
    cfg = load_config(write(tmp_path / "ok.yaml", "data:\n  transforms:\n    mean: &m [0.5, 0.5, 0.5]\n"
                                                  "    std: *m\n"))
    assert list(cfg.data.transforms.std) == [0.5, 0.5, 0.5]


def test_a_recursive_yaml_alias_is_refused(tmp_path):
    path = write(tmp_path / "rec.yaml", "model:\n  args: &a\n    inner: *a\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: line 2: an alias refers to a value that contains it (a recursive "
                              f"structure); a config cannot hold one: write the value out")


def test_an_error_line_quotes_a_large_value_cut_short(tmp_path):
    path = write(tmp_path / "big.yaml", {"train": {"epochs": [list(range(50))] * 50}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: train.epochs: bad value [[0, 1, 2, 3, 4, 5, ...], [0, 1, 2, 3, 4, 5, ...]")
    assert message.endswith(": input should be a valid integer") and len(message) < len(path) + 200


def test_cli_config_that_is_a_jpeg_exits_2_with_one_line(tmp_path):
    from PIL import Image
    jpeg = tmp_path / "photo.jpg"
    Image.new("RGB", (16, 16), (200, 10, 10)).save(jpeg)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", str(jpeg)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: {jpeg}: not a YAML config file (byte 0 is not UTF-8 text: a binary file such as an image or a "
        f"checkpoint?); give the YAML config with -c"]
