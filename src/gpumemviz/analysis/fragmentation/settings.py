"""The allocator settings a snapshot recorded, read leniently and remembered.

Files from strangers must still be analysed: settings that do not parse fall back piece by
piece to torch's defaults (the raw settings stay in the report). A `Snapshot` parsed its
settings once already (`Snapshot.config`): `snapshot_settings` reads that value and falls back
only where it did not parse. A torch dict has no such value, and a sampler analyses the same
settings twice a second, so configs parsed from dicts are remembered, keyed by the settings'
plain values and never by their repr, which a value shared with itself (a list of the same
list 30 levels deep) would make walk 2^30 paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumemviz.allocator.config import AllocatorConfig, ConfigError
from gpumemviz.snapshot import Snapshot

__all__ = ["parse_settings", "snapshot_settings"]


def parse_settings(settings: Any) -> tuple[AllocatorConfig, bool]:
    """The recorded allocator settings, read leniently: a malformed settings string falls back
    to the dict, and a malformed roundup_power2_divisions in it to torch's default rounding
    (files from strangers must still be analysed; the raw settings stay in the report).

    Parsed configs are remembered by the settings' values (a sampler analyses the same settings
    twice a second, and parsing costs more than analysing a small snapshot).
    """
    if not isinstance(settings, Mapping):
        return _DEFAULT_CONFIG, False
    config = _remembered(settings, _DROPPED)
    return config, config.expandable_segments


def snapshot_settings(snap: Snapshot) -> tuple[AllocatorConfig, bool]:
    """`parse_settings(snap.allocator_settings)`, read from the snapshot's own parse of them
    (`Snapshot.config`); only settings that do not parse are read again, leniently."""
    settings = snap.allocator_settings
    if not isinstance(settings, Mapping):
        return _DEFAULT_CONFIG, False
    try:
        config = snap.config
    except ConfigError:
        config = _remembered(settings, _DROPPED[1:])  # the whole of them did not parse
    return config, config.expandable_segments


def _remembered(
    settings: Mapping[str, Any], dropped: tuple[tuple[str, ...], ...]
) -> AllocatorConfig:
    """`_parse_leniently`, remembered by the settings' values."""
    key = _settings_key(settings)
    config = _CONFIGS.get(key) if key is not None else None
    if config is None:
        config = _parse_leniently(settings, dropped)
        if key is not None:
            if len(_CONFIGS) >= 64:
                _CONFIGS.clear()
            _CONFIGS[key] = config
    return config


_KEY_SCALARS = (str, int, float, bool, type(None))


def _settings_key(settings: Mapping[str, Any]) -> tuple[object, ...] | None:
    """What parsing the settings depends on, as a dict key: their items, each value with its
    type (True and 1 parse differently), nested dicts one level deep; None (parse without
    remembering) for anything deeper or larger than torch writes. Never a repr: a value from a
    file may share subtrees (a list of the same list 30 deep) that a repr walks 2^30 times."""
    if len(settings) > _MAX_KEY_ITEMS:
        return None
    out = []
    for k, v in settings.items():
        if type(v) in _KEY_SCALARS:
            out.append((k, type(v), v))
        elif type(v) is dict and len(v) <= _MAX_KEY_ITEMS:
            inner = tuple((a, type(b), b) for a, b in v.items())
            if not all(type(b) in _KEY_SCALARS for _, _, b in inner):
                return None
            out.append((k, dict, inner))
        else:
            return None
    return tuple(out)


_MAX_KEY_ITEMS = 64


def _parse_leniently(
    settings: Mapping[str, Any], dropped_in_turn: tuple[tuple[str, ...], ...]
) -> AllocatorConfig:
    """The settings; where they do not parse, without the string, then also without the
    divisions (the one dict value AllocatorConfig checks), then torch's defaults
    (`dropped_in_turn`: the keys left out at each try, `_DROPPED` or a tail of it)."""
    for dropped in dropped_in_turn:
        try:
            return AllocatorConfig.from_settings(
                {k: v for k, v in settings.items() if k not in dropped}
            )
        except ConfigError:
            continue
    return _DEFAULT_CONFIG


_STRING_AND_DIVISIONS = ("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions")
_DROPPED = ((), ("PYTORCH_CUDA_ALLOC_CONF",), _STRING_AND_DIVISIONS)


_DEFAULT_CONFIG = AllocatorConfig()
_CONFIGS: dict[tuple[object, ...], AllocatorConfig] = {}
