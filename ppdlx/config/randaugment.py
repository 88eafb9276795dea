"""The RandAugment policy string (``data.transforms.randaugment``, timm's ``rand_augment_transform``
syntax), parsed without the image code: validating a config must not need PIL."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ppdlx.errors import ConfigError

LEVEL_DENOM = 10.0  # timm's _LEVEL_DENOM: magnitudes are tenths of the strongest setting


@dataclass(frozen=True)
class RandAugmentSpec:
    magnitude: float = 10.0
    num_layers: int = 2
    magnitude_std: float = 0.0
    magnitude_max: float = LEVEL_DENOM
    prob: float = 0.5
    increasing: bool = False


def parse_rand_augment(spec: str, key: str = "data.transforms.randaugment") -> RandAugmentSpec:
    """``"rand-m9-mstd0.5"`` -> RandAugmentSpec; sections ``m`` magnitude, ``n`` ops per image, ``mstd``
    magnitude std (> 100: uniform in [0, m]), ``mmax`` magnitude cap, ``inc`` increasing ops, ``p`` prob."""
    parts = str(spec).split("-")
    if parts[0] != "rand":
        raise ConfigError(f"{key}={spec!r}: must start with 'rand' (e.g. 'rand-m9-mstd0.5')")
    values = {}
    for part in parts[1:]:
        pieces = re.split(r"(\d.*)", part)
        if len(pieces) < 2 or pieces[0] not in ("m", "n", "mstd", "mmax", "inc", "p"):
            raise ConfigError(f"{key}={spec!r}: unknown section {part!r}; sections are m<magnitude>, n<ops>, "
                              f"mstd<std>, mmax<cap>, inc<0|1>, p<prob> (e.g. 'rand-m9-mstd0.5')")
        name, raw = pieces[0], pieces[1]
        try:
            values[name] = float(raw)
        except ValueError:
            raise ConfigError(f"{key}={spec!r}: section {part!r} is not a number") from None
    mstd = values.get("mstd", 0.0)
    if mstd > 100:
        mstd = float("inf")
    out = RandAugmentSpec(magnitude=values.get("m", 10.0), num_layers=int(values.get("n", 2)), magnitude_std=mstd,
                          magnitude_max=values.get("mmax", LEVEL_DENOM), prob=values.get("p", 0.5),
                          increasing=bool(values.get("inc", 0)))
    if out.num_layers < 0 or not 0.0 <= out.prob <= 1.0 or out.magnitude < 0:
        raise ConfigError(f"{key}={spec!r}: need n >= 0, m >= 0 and 0 <= p <= 1")
    return out
