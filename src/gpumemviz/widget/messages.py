"""The panel's browser messages (docs/internals.md, the wire: Browser -> Python): a command runs
on the thread the kernel hands the message to; views, block requests, timeline syncs and closes
are queued for the panel's writer thread. A strip click is the "select" command."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumemviz.widget.panel_state import plain

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict
    from gpumemviz.widget.panel import MemoryPanel

__all__ = ["handle_browser_msg"]


def handle_browser_msg(panel: MemoryPanel, content: JsonDict) -> None:
    """Act on one message from the panel's front end (unknown kinds are ignored; no example:
    it needs a browser)."""
    kind = content.get("kind") if isinstance(content, dict) else None
    if kind == "command":
        # done here, on the thread the kernel gave this message (a subshell while a cell
        # runs); only the reply and the traits go through the writer thread
        cid = str(content.get("id", ""))
        given = content.get("args")
        args = given if isinstance(given, dict) else {}
        entry = panel.command(str(content.get("name", "")), **args)
        reply = {"kind": "reply", "id": cid, **plain(entry)}

        panel._writer.submit(lambda: panel.send(reply))
        return
    if kind == "view":
        view = str(content.get("view", ""))
        span = (int(content.get("first", 0)), int(content.get("count", 1)))
        cells = int(content.get("cells", 1024))
        panel._writer.submit(lambda: panel._send_frames(panel._wire.set_view(view, *span, cells)))
    elif kind == "blocks":  # the zoom wants one row's exact blocks (its frame had cells)
        view, row = str(content.get("view", "")), int(content.get("row", -1))
        lo, hi = content.get("lo"), content.get("hi")
        win = (
            (int(lo), int(hi))
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float))
            else (None, None)
        )
        panel._writer.submit(lambda: panel._send_frames(panel._wire.exact_blocks(view, row, *win)))
    elif kind == "timeline_sync":
        since = int(content.get("since", 0))

        def sync() -> None:
            first, points = panel.timeline.since(since)
            panel.send(
                {
                    "kind": "timeline",
                    "first": first,
                    "points": points,
                    "reset": True,
                    "marks": panel.timeline.marks(),
                }
            )

        panel._writer.submit(sync)
    elif kind == "close":
        view = str(content.get("view", ""))
        panel._writer.submit(lambda: panel._wire.drop_view(view))
