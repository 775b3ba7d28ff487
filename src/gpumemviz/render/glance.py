"""The device at a glance: one bar per device, its parts `gpumemviz.analyze`'s figures.

Twelve figures in a row say how full a device is only to someone who adds them up. The bar
shows the split in one look: what live tensors hold, what waits for its stream (pending free),
what empty_cache would return, what stays cached after it, what other processes and the CUDA
context hold (NVML), and the headroom left. Every part is a figure of `Findings.figures`
(analysis/findings.py), so the bar and ``panel.findings`` never disagree; the front end
(js/src/glance.js) only lays the parts out, to scale of the device's total, or of reserved where
the total is unknown (a snapshot file does not record it), and says which.

Two marks go under the parts: the largest free block, and the last OOM's request drawn against
it (an OOM of fragmentation asks for more than the largest block and less than all the free).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumemviz.analysis.findings import Figures, Findings
    from gpumemviz.snapshot.schema import JsonDict

__all__ = ["MEANINGS", "PARTS", "glance_bar", "glance_set"]

#: The parts in bar order: key, label, palette colour (render/palette.json).
PARTS = (
    ("allocated", "allocated", "allocated"),
    ("pending_free", "pending free", "pending"),
    ("releasable", "free, empty_cache releases it", "releasable"),
    ("stays", "free, stays after empty_cache", "trapped"),
    ("outside", "other processes and CUDA context", "outside"),
    ("headroom", "headroom", "empty"),
)
#: What each part means, for its hover.
MEANINGS = {
    "allocated": "bytes live tensors hold (torch.cuda.memory_allocated)",
    "pending_free": "freed by Python, waiting for its stream's work before it can be reused",
    "releasable": "cached free bytes in wholly free segments: torch.cuda.empty_cache() returns "
    "them to the device",
    "stays": "cached free bytes in segments that still hold a live block: empty_cache cannot "
    "return them; only allocations that fit reuse them",
    "outside": "device memory PyTorch's allocator does not hold: other processes, the CUDA "
    "context, libraries (NVML used - reserved)",
    "headroom": "device memory nobody holds: the next segment comes from here",
}


def _parts(f: Figures) -> tuple[list[tuple[str, int]], int, str]:
    """The parts' bytes, the scale's total and what the scale is ("device" or "reserved")."""
    # releasable counts a wholly free segment's pending bytes too (empty_cache syncs them
    # first); the bar draws pending bytes once, as pending, so the free part it releases is
    # at most the free bytes
    released = min(f.releasable, f.free_in_reserved)
    parts = [
        ("allocated", f.allocated),
        ("pending_free", f.pending_free),
        ("releasable", released),
        ("stays", f.free_in_reserved - released),
    ]
    total = f.device_total
    if total is None or total < f.reserved:
        return parts, f.reserved, "reserved"
    outside = min(max(0, f.non_pytorch or 0), total - f.reserved)
    parts += [("outside", outside), ("headroom", total - f.reserved - outside)]
    return parts, total, "device"


def glance_bar(
    found: Findings, oom: Mapping[str, object] | None = None, *, figures: Figures | None = None
) -> JsonDict:
    """One device's bar: its parts (bytes, label, colour key, meaning) in order, the scale's
    total and kind, the largest free block, and the last OOM's request where there is one.

    Parameters
    ----------
    found : Findings
        One device's findings (``found.device`` is its index).
    oom : mapping, optional
        The OOM to draw (the panel's ``oom`` trait: ``alloc_size``, ``sentence``; {}: none);
        default: ``found.oom``.
    figures : Figures, optional
        The figures to draw instead of ``found.figures``: a replay's at the entry shown (its
        findings judge the file as a whole, at its final state).

    Returns
    -------
    dict
        ``device``, ``parts`` [{key, label, colour, bytes}], ``total``, ``scale``
        ("device": the device's total; "reserved": the total is unknown), ``note`` (what the
        scale is, in words), ``largest_free``, ``reserved``, ``oom`` ({request, sentence} or
        None). The parts' bytes add up to ``total`` exactly.

    Examples
    --------
    >>> from gpumemviz.analysis.findings import analyze
    >>> seg = {"device": 0, "address": 0, "total_size": 4 << 20, "stream": 0,
    ...        "segment_type": "large", "blocks": [
    ...     {"size": 1 << 20, "requested_size": 1 << 20, "state": "active_allocated"},
    ...     {"size": 3 << 20, "requested_size": 0, "state": "inactive"}]}
    >>> bar = glance_bar(analyze([seg]).for_device(0))
    >>> [(p["key"], p["bytes"] >> 20) for p in bar["parts"]], bar["scale"]
    ([('allocated', 1), ('pending_free', 0), ('releasable', 0), ('stays', 3)], 'reserved')
    >>> sum(p["bytes"] for p in bar["parts"]) == bar["total"]
    True
    """
    f = found.figures if figures is None else figures
    parts, total, scale = _parts(f)
    names = {key: (label, colour) for key, label, colour in PARTS}
    if oom is None and found.oom is not None:
        oom = {
            "alloc_size": found.oom.alloc_size or found.oom.rounded or 0,
            "sentence": found.oom.sentence,
        }
    size = oom.get("alloc_size") if oom else None
    request = int(size) if isinstance(size, (int, float)) else 0
    note = (
        "to scale of the device's total"
        if scale == "device"
        else "to scale of reserved: the device's total is unknown here"
    )
    return {
        "device": found.device,
        "parts": [
            {
                "key": key,
                "label": names[key][0],
                "colour": names[key][1],
                "bytes": int(n),
            }
            for key, n in parts
        ],
        "total": int(total),
        "scale": scale,
        "note": note,
        "reserved": int(f.reserved),
        "largest_free": int(f.largest_free),
        "oom": {"request": request, "sentence": str(oom.get("sentence") or "")}
        if oom and request
        else None,
    }


def glance_set(
    findings: Mapping[int, Findings],
    shown: int | None,
    shown_oom: Mapping[str, object],
    shown_figures: Figures | None = None,
) -> JsonDict:
    """The panel's ``glance`` trait: a bar per device in device order, the shown device's OOM
    being the one the panel shows (``shown_oom``, its ``oom`` trait; {}: none yet). With
    ``shown_figures`` (a replay: the state at the entry shown), the shown device's bar alone,
    of those figures. ``meanings``: what each part means (`MEANINGS`), for the hovers.

    Examples
    --------
    >>> glance_set({}, None, {})
    {'bars': [], 'shown': None, 'meanings': {}}
    """

    def oom_of(device: int) -> Mapping[str, object] | None:
        if device != shown or shown_oom.get("device", device) != device:
            return None  # the device's own OOM, if any
        return shown_oom

    if shown_figures is not None and shown is not None and shown in findings:
        bars = [glance_bar(findings[shown], oom_of(shown), figures=shown_figures)]
    else:
        bars = [glance_bar(findings[device], oom_of(device)) for device in sorted(findings)]
    # what each part means travels once, not once per bar
    return {"bars": bars, "shown": shown, "meanings": dict(MEANINGS) if bars else {}}
