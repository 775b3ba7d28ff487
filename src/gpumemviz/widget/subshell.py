"""Kernel subshells for a panel's browser messages, so its clicks act while a cell runs.

ipykernel >= 7.4 routes a comm's incoming messages by its private hook ``_reply_subshell_for``;
these functions point that hook at a subshell of our own (created and deleted through our own
kernel's control channel) or at the main shell.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumemviz.snapshot.schema import JsonDict

__all__ = ["control_request", "delete_subshell", "route_to_main", "route_to_subshell"]


def control_request(msg_type: str, content: JsonDict) -> JsonDict | None:
    """One request on our own kernel's control channel (which a running cell does not block)."""
    from ipykernel.connect import get_connection_file
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient()
    client.load_connection_file(get_connection_file())
    client.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
    try:
        client.control_channel.send(client.session.msg(msg_type, content))
        reply: JsonDict | None = client.control_channel.get_msg(timeout=5)["content"]
        return reply
    finally:
        client.stop_channels()


def route_to_subshell(comm: Any) -> str | None:  # Any: the kernel's comm, by duck typing
    """Handle the panel's browser messages on a kernel subshell, so scrolling (and later the
    buttons) works while a cell runs (JupyterLab sends comms over subshells, JEP 91:
    https://jupyter.org/enhancement-proposals/kernel-subshells).

    ipykernel >= 7.4 routes an incoming comm message to the subshell the comm last published
    from (the main shell here), overriding JupyterLab's own subshell routing; its private hook
    ``_reply_subshell_for`` is pointed at a subshell of our own. Returns None, changing nothing,
    outside ipykernel, without subshell support or without the hook (7.0-7.3 route by themselves).
    """
    try:
        from ipykernel.kernelbase import Kernel

        if not Kernel.initialized() or not getattr(
            Kernel.instance(), "_supports_kernel_subshells", False
        ):
            return None
        if comm is None or not hasattr(comm, "_reply_subshell_for"):
            return None
        reply = control_request("create_subshell_request", {})
        sid: str | None = reply.get("subshell_id") if reply else None
        if not sid:
            return None
        comm._reply_subshell_for = lambda _data, _default: sid
        return sid
    except Exception:  # no kernel connection file, an old kernel: stay on the main shell
        return None


def route_to_main(comm: Any) -> None:  # Any: the kernel's comm
    """Handle the panel's browser messages on the main shell: a click then waits for the running
    cell to finish (the "queued" path; what frontends without comms over subshells do). Without
    the ipykernel 7.4 hook, JupyterLab's own routing stays in force."""
    if comm is not None and hasattr(comm, "_reply_subshell_for"):
        comm._reply_subshell_for = lambda _data, _default: None
    return None


def delete_subshell(sid: str) -> None:
    with contextlib.suppress(Exception):
        control_request("delete_subshell_request", {"subshell_id": sid})
