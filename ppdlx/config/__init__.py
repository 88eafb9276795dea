"""Config: YAML + ``_BASE_`` + ``-o`` overrides, validated by a strict schema."""
from __future__ import annotations

import difflib
import os
import typing
from typing import Iterable, Optional, Tuple

import yaml
from pydantic import BaseModel, ValidationError

from ppdlx.config.loader import apply_overrides, load_yaml_with_bases, merge, parse_overrides  # noqa: F401
from ppdlx.config.migrations import check_retired
from ppdlx.config.schema import Config
from ppdlx.errors import ConfigError, quote

__all__ = ["Config", "load_config", "save_config", "save_yaml", "ConfigError"]


def _submodel(model_cls, key: str):
    """The pydantic model class a key of ``model_cls`` holds, if it holds one."""
    for name, field in model_cls.model_fields.items():
        if key in (name, field.alias):
            return _first_model(field.annotation)
    return None


def _first_model(tp):
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in typing.get_args(tp):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _known_keys(model_cls) -> list:
    return [f.alias or n for n, f in model_cls.model_fields.items()]


def _format_error(err: dict, sources: dict, default_source: str) -> str:
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc)
    value = err.get("input")
    # The nearest recorded source along the path (a whole section may come from one file).
    source = default_source
    for i in range(len(loc), 0, -1):
        if loc[:i] in sources:
            source = sources[loc[:i]]
            break
    if err["type"] == "extra_forbidden":
        parent = Config
        for part in loc[:-1]:
            parent = _submodel(parent, part) if parent is not None else None
        known = _known_keys(parent) if parent is not None else []
        close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.5)
        hint = f"did you mean '{'.'.join(loc[:-1] + (close[0],))}'?" if close else \
            f"known keys here: {', '.join(known)}"
        return f"{source}: {key}: unknown key (value {quote(value)}); {hint}"
    if err["type"] == "literal_error":
        allowed = [str(a) for a in err.get("ctx", {}).get("expected", "").replace("'", "").split(" or ")]
        allowed = [a.strip() for part in allowed for a in part.split(",") if a.strip()]
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.3)
        hint = f"did you mean '{close[0]}'?" if close else f"expected {err['ctx']['expected']}"
        return f"{source}: {key}: bad value {quote(value)}; {hint} (allowed: {err['ctx']['expected']})"
    if err["type"] in ("model_type", "dict_type"):  # a scalar or list where a section or mapping goes
        section = _submodel(Config, loc[0]) if loc else None
        for part in loc[1:]:
            section = _submodel(section, part) if section is not None else None
        hint = f"; set a key inside it, e.g. {key}.{_known_keys(section)[0]}" if section is not None else ""
        return f"{source}: {key}: expected a mapping of keys, got {quote(value)}{hint}"
    if err["type"] == "value_error":  # a schema validator's own reason, which names the fix
        return f"{source}: {key}={quote(value)}: {err['ctx']['error']}"
    return f"{source}: {key}: bad value {quote(value)}: {err['msg'].lower()}"


def build_config(raw: dict, sources: Optional[dict] = None, source: str = "<config>") -> Config:
    check_retired(raw, sources or {}, source)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(_format_error(first, sources or {}, source)) from None


def load_config(path: Optional[str] = None, overrides: Iterable[str] = ()) -> Config:
    """Load a YAML config (with ``_BASE_``), apply ``-o`` overrides, validate."""
    sources: dict = {}
    raw = load_yaml_with_bases(path, sources) if path else {}
    raw = apply_overrides(raw, list(overrides), sources)
    return build_config(raw, sources, path or "-o")


def save_yaml(data: dict, path: str) -> None:
    """Write ``data`` as YAML atomically (temporary name, then rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    os.replace(tmp, path)


def save_config(cfg: Config, path: str) -> None:
    """Write the resolved config (every default filled in) atomically."""
    save_yaml(cfg.to_dict(), path)


def flatten_overrides(groups: Optional[Iterable]) -> Tuple[str, ...]:
    """argparse ``-o a=1 b=2 -o c=3`` (append + nargs) -> ``("a=1", "b=2", "c=3")``."""
    out = []
    for group in groups or ():
        out.extend([group] if isinstance(group, str) else group)
    return tuple(out)
