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
    assert cfg.data.transforms.mean == [9.0]  # lists replaced, not merged
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


@pytest.mark.parametrize("name", ["rn50_amp.yaml", "rn50_tf32.yaml", "demo/rn50_demo.yaml"])
def test_shipped_configs_validate(name):
    cfg = load_config(os.path.join(ROOT, "configs", name))
    assert cfg.model.name == "resnet50"


def test_cli_bad_key_exits_nonzero_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c",
                           os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), "-o", "train.epoch=3",
                           "global.seed=1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert lines[-1] == "error: -o: train.epoch: unknown key (value 3); did you mean 'train.epochs'?"
    assert "Traceback" not in proc.stderr
