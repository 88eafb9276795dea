"""YAML loading with ``_BASE_`` inheritance and ``-o a.b.c=value`` overrides.

Every leaf value remembers where it came from (a file path or ``-o``) so that a
validation error can name the file that holds the bad key.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, Iterable, List, Tuple

import yaml

from ppdlx.errors import ConfigError, quote

BASE_KEY = "_BASE_"
# Values a config file may expand to once its aliases are followed; a real config has a few hundred. An alias
# repeated inside aliases ("billion laughs") expands to billions from a few lines, and every later walk over it
# (validation, freezing, an error quoting it) would take minutes and gigabytes.
MAX_YAML_VALUES = 100_000
Sources = Dict[Tuple[str, ...], str]


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key, first_line: int, second_line: int):
        super().__init__(f"duplicate key {quote(key)}")
        self.key, self.first_line, self.second_line = key, first_line, second_line


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding the same key twice (PyYAML keeps the last one silently,
    so a second ``train:`` section would drop the first). Keys brought in by a ``<<`` merge may be overridden,
    as YAML intends."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_mark = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = first_mark.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base constructor reports it
                    continue
                if first is not key_node.start_mark:
                    raise _DuplicateKey(key, first.line + 1, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: str) -> dict:
    if os.path.isdir(path):
        try:  # its own files only, not a walk: -c / must answer at once
            inside = sorted(f for f in os.listdir(path) if f.endswith((".yaml", ".yml")))
        except OSError:
            inside = []
        example = f", e.g. {os.path.join(path, inside[0])}" if inside else ""
        raise ConfigError(f"{path}: is a directory, not a config file; give a YAML file{example}")
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: config file not found")
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = _load_bounded(f, path)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not a YAML config file (byte {err.start} is not UTF-8 text: a binary file such as "
                          f"an image or a checkpoint?); give the YAML config with -c") from None
    except _DuplicateKey as err:
        lines = f"lines {err.first_line} and {err.second_line}" if err.first_line != err.second_line else \
            f"line {err.first_line}"
        raise ConfigError(f"{path}: key {quote(err.key)} is given twice in the same mapping ({lines}); YAML keeps "
                          f"only the last, so the first would be ignored silently: merge the two") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} invalid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _load_bounded(stream, path: str):
    """``yaml.load(stream, UniqueKeyLoader)``, refusing before construction a document whose aliases expand it past
    ``MAX_YAML_VALUES`` values or make it contain itself."""
    loader = UniqueKeyLoader(stream)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _count_values(node, path, {}, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _count_values(node, path: str, counted: dict, open_nodes: set) -> int:
    """How many values ``node`` expands to (an aliased node is counted once per use, computed once)."""
    key = id(node)
    if key in counted:
        return counted[key]
    if key in open_nodes:
        raise ConfigError(f"{path}: line {node.start_mark.line + 1}: an alias refers to a value that contains it "
                          f"(a recursive structure); a config cannot hold one: write the value out")
    open_nodes.add(key)
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = []
    total = 1 + sum(_count_values(child, path, counted, open_nodes) for child in children)
    open_nodes.discard(key)
    if total > MAX_YAML_VALUES:
        raise ConfigError(f"{path}: line {node.start_mark.line + 1}: its aliases expand this value to {total:,} values "
                          f"(more than {MAX_YAML_VALUES:,}: aliases nested in aliases, a 'billion laughs' file); a "
                          f"config needs no such value: write it out")
    counted[key] = total
    return total


def _record(tree: Any, source: str, sources: Sources, prefix: Tuple[str, ...] = ()) -> None:
    if isinstance(tree, dict):
        for key, value in tree.items():
            sources[prefix + (str(key),)] = source
            _record(value, source, sources, prefix + (str(key),))


def merge(base: dict, update: dict) -> dict:
    """Dicts merge recursively; anything else (lists included) is replaced."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_yaml_with_bases(path: str, sources: Sources | None = None, _stack: Tuple[str, ...] = ()) -> dict:
    """Load ``path``; files in its ``_BASE_`` list (relative to it) load first, later ones win."""
    sources = {} if sources is None else sources
    path = os.path.normpath(path)
    if path in _stack:
        raise ConfigError(f"{path}: _BASE_ cycle: {' -> '.join(_stack + (path,))}")
    data = _read_yaml(path)
    bases = data.pop(BASE_KEY, [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list):
        raise ConfigError(f"{path}: {BASE_KEY} must be a list of paths, got {quote(bases)}")
    merged: dict = {}
    for base in bases:
        base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(path), base)
        merged = merge(merged, load_yaml_with_bases(base_path, sources, _stack + (path,)))
    _record(data, path, sources)
    return merge(merged, data)


def parse_overrides(items: Iterable[str]) -> List[Tuple[List[str], Any]]:
    """``["a.b=1", "c=[1, 2]"]`` -> ``[(["a","b"], 1), (["c"], [1, 2])]`` (values parsed as YAML)."""
    parsed = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"-o {item}: expected key.path=value (e.g. -o train.epochs=90)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"-o {item}: empty key path")
        try:
            value = yaml.safe_load(raw) if raw.strip() != "" else None
        except yaml.YAMLError:
            value = raw
        parsed.append((key.split("."), value))
    return parsed


def apply_overrides(cfg: dict, overrides: Iterable[str], sources: Sources | None = None) -> dict:
    cfg = copy.deepcopy(cfg)
    for path, value in parse_overrides(overrides):
        node = cfg
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(
                    f"-o {'.'.join(path)}: '{'.'.join(path[:i + 1])}' is a value ({quote(child)}), not a section")
            node = child
        node[path[-1]] = value
        if sources is not None:
            sources[tuple(path)] = "-o"
            _record(value, "-o", sources, tuple(path))
    return cfg
