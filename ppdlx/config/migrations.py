"""Keys a config may still hold from an earlier ppdlx: one line naming the file, the key and what replaces it."""
from __future__ import annotations

from ppdlx.errors import ConfigError

# (section, key) -> {value it held (or None for any): its replacement}
RETIRED_KEYS = {
    ("optimizer", "decay_bn_and_bias"): {
        True: "optimizer.decay_params: all", False: "optimizer.decay_params: all_but_1d",
        None: "optimizer.decay_params (all, all_but_bn, all_but_1d or conv_kernels)"},
}
RENAMED_VALUES = {
    ("optimizer", "decay_params"): {"default": "all_but_1d"},
}


def check_retired(raw: dict, sources: dict, default_source: str) -> None:
    """``ConfigError`` for the first retired key or renamed value in the raw (merged) config."""
    for (section, key), replacements in RETIRED_KEYS.items():
        node = raw.get(section)
        if isinstance(node, dict) and key in node:
            value = node[key]
            fix = replacements.get(value if isinstance(value, bool) else None, replacements[None])
            source = sources.get((section, key), default_source)
            raise ConfigError(f"{source}: {section}.{key}={value!r} was replaced; write {fix} instead "
                              f"(all_but_bn is NVIDIA's ResNet50 set: every parameter but BatchNorm's)")
    for (section, key), renamed in RENAMED_VALUES.items():
        node = raw.get(section)
        value = node.get(key) if isinstance(node, dict) else None
        if isinstance(value, str) and value in renamed:
            source = sources.get((section, key), default_source)
            raise ConfigError(f"{source}: {section}.{key}={value!r} was renamed; write {section}.{key}: "
                              f"{renamed[value]}")
