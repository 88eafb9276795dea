"""The read-only containers a loaded config holds: its mappings as :class:`FrozenDict`, its lists as tuples."""
from __future__ import annotations

from typing import Mapping

from ppdlx.errors import ConfigError


class FrozenDict(dict):
    """A dict whose contents cannot change (a ``MappingProxyType`` would be, but cannot be pickled
    or deep-copied, which passing a config to worker processes needs)."""
    __slots__ = ()

    def _frozen(self, *args, **kwargs):
        raise ConfigError("the config is frozen after loading (cannot change a mapping in it in place); make a "
                          "changed copy with cfg.replace({'key.path': ...})")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _frozen

    def __reduce__(self):
        return type(self), (dict(self),)


def deep_freeze(value):
    """Mappings as :class:`FrozenDict` and lists as tuples, all the way down: a frozen section's
    containers must not be changeable in place either."""
    if isinstance(value, Mapping):
        return FrozenDict({k: deep_freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(deep_freeze(v) for v in value)
    return value
