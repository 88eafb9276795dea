"""Name -> builder registries: one way to build each thing.

A registry maps a lower-case name (what configs write, e.g. ``model.name:
resnet50``) to a class or factory function. Unknown names fail with one line
that lists the close matches.
"""
from __future__ import annotations

import contextlib
import difflib
from typing import Callable, Dict, Iterable, Iterator

from ppdlx.errors import ConfigError


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._builders: Dict[str, Callable] = {}

    def register(self, name: str | None = None, *aliases: str):
        """Decorator: ``@MODELS.register("resnet50")``."""

        def deco(builder: Callable) -> Callable:
            for key in (name or builder.__name__.lower(), *aliases):
                if key in self._builders:
                    raise ValueError(f"{self.kind} '{key}' registered twice")
                self._builders[key] = builder
            return builder

        return deco

    def get(self, name: str) -> Callable:
        if name not in self._builders:
            close = difflib.get_close_matches(name, list(self._builders), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(
                f"unknown {self.kind} '{name}'{hint} (known: {', '.join(sorted(self._builders))})"
            )
        return self._builders[name]

    def build(self, name: str, **kwargs):
        return self.get(name)(**kwargs)

    def names(self) -> Iterable[str]:
        return sorted(self._builders)

    @contextlib.contextmanager
    def registered(self, name: str, builder: Callable) -> Iterator[Callable]:
        """``name`` is built by ``builder`` inside the block only (a plug-in tried out, a test's own model), so
        that it never shows in another caller's :meth:`names`."""
        self.register(name)(builder)
        try:
            yield builder
        finally:
            del self._builders[name]

    def __contains__(self, name: str) -> bool:
        return name in self._builders


MODELS = Registry("model")
DATASETS = Registry("dataset")
LOSSES = Registry("loss")
OPTIMIZERS = Registry("optimizer")
LR_SCHEDULES = Registry("lr schedule")
TASKS = Registry("task")  # ppdlx.tasks: classification, detection
