"""A torch 2.13-shaped snapshot dict to edit one field at a time (tests/snapshot/
test_new_fields.py, tests/cli/test_cli.py): written as torch's `_snapshot()` writes it."""

from __future__ import annotations

SEG1, SEG2 = 0x7F0000000000, 0x7F0001400000
MiB = 1 << 20
USER = {"filename": "/w/train.py", "line": 88, "name": "step"}
TORCH = {"filename": "/x/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}


def _entry(action: str, addr: int, size: int, t: int, **more: object) -> dict:
    e = {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": 1_700_000_000_000_000 + t,
        "compile_context": "N/A",
        "user_metadata": "",
        "frames": [TORCH, USER],
    }
    e.update(more)
    return e


def torch_file(**change: object) -> dict:
    """A torch 2.13-shaped snapshot: a 20 MiB segment holding A (4 MiB) and B (2 MiB), a
    private pool's 2 MiB segment holding C (512 bytes), and the trace that made them.
    `change` edits it: `entries={i: {key: value}}`, `extra_entries=[...]` (appended),
    `settings={...}`, `frames=[...]` (every stack), `top`, `segment`, `block` (unknown keys)."""
    frames = change.get("frames", [TORCH, USER])
    blocks1 = [
        {"address": SEG1, "size": 4 * MiB, "requested_size": 4 * MiB,
         "state": "active_allocated", "frames": frames},
        {"address": SEG1 + 4 * MiB, "size": 2 * MiB, "requested_size": 2 * MiB,
         "state": "active_allocated", "frames": frames},
        {"address": SEG1 + 6 * MiB, "size": 14 * MiB, "requested_size": 0,
         "state": "inactive", "frames": []},
    ]  # fmt: skip
    blocks2 = [
        {"address": SEG2, "size": 512, "requested_size": 512, "state": "active_allocated",
         "frames": frames},
        {"address": SEG2 + 512, "size": 2 * MiB - 512, "requested_size": 0,
         "state": "inactive", "frames": []},
    ]  # fmt: skip
    segs = [
        {"device": 0, "address": SEG1, "total_size": 20 * MiB, "allocated_size": 6 * MiB,
         "active_size": 6 * MiB, "requested_size": 6 * MiB, "stream": 0,
         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": frames, "blocks": blocks1},
        {"device": 0, "address": SEG2, "total_size": 2 * MiB, "allocated_size": 512,
         "active_size": 512, "requested_size": 512, "stream": 0, "segment_type": "small",
         "segment_pool_id": (1, 0), "is_expandable": False, "frames": frames,
         "blocks": blocks2},
    ]  # fmt: skip
    trace = [
        _entry("segment_alloc", SEG1, 20 * MiB, 0),
        _entry("alloc", SEG1, 4 * MiB, 1),
        _entry("alloc", SEG1 + 4 * MiB, 2 * MiB, 2),
        _entry("alloc", SEG1 + 6 * MiB, 1 * MiB, 3),
        _entry("free_requested", SEG1 + 6 * MiB, 1 * MiB, 4),
        _entry("free_completed", SEG1 + 6 * MiB, 1 * MiB, 5),
        _entry("segment_alloc", SEG2, 2 * MiB, 6),
        _entry("alloc", SEG2, 512, 7),
    ]
    for i, more in change.get("entries", {}).items():  # type: ignore[attr-defined]
        trace[i].update(more)
    for e in trace:
        e["frames"] = frames
    trace += change.get("extra_entries", [])  # type: ignore[operator]
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "expandable_segments": False}
    settings.update(change.get("settings", {}))  # type: ignore[arg-type]
    out = {
        "segments": segs,
        "device_traces": [trace],
        "allocator_settings": settings,
        "external_annotations": [],
    }
    out.update(change.get("top", {}))  # type: ignore[arg-type]
    segs[0].update(change.get("segment", {}))  # type: ignore[arg-type]
    blocks1[0].update(change.get("block", {}))  # type: ignore[arg-type]
    return out
