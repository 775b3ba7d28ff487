"""The report's page: the HTML around the report's data, made and written in parts.

`report_html` computes what the page shows; this module wraps it in the page (the built
renderer and its CSS inlined, the data as one JSON document in a ``<script>`` element made
inert) and writes it. The data's binary columns travel as `Blob`s: raw bytes until the page is
written, when each becomes its base64 text on its own, so a page's data is never held at once as
bytes, base64 text, JSON text and the encoded page (four copies of the biggest part of the
report's memory). The parts are written one after the other, never joined.
"""

from __future__ import annotations

import base64
import html
import json
import secrets
from collections.abc import Iterable
from typing import Any, BinaryIO

from gpumemviz.io.json_text import json_ready
from gpumemviz.reporting.bundles import bundle_path
from gpumemviz.snapshot.plain import rewrite_leaves

__all__ = [
    "Blob",
    "Part",
    "blobs_as_text",
    "join_parts",
    "json_len",
    "page_parts",
    "renderer_size",
    "script_json",
    "write_parts",
]


class Blob:
    """A binary column bound for the page as base64 text, encoded only when written.

    >>> Blob(b"\\x00\\x01").text()
    'AAE='
    """

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def text(self) -> str:
        """The base64 text the page holds."""
        return base64.b64encode(self.raw).decode("ascii")

    def ascii(self) -> bytes:
        """The base64 text as the page's bytes (base64 needs no JSON or script escape)."""
        return base64.b64encode(self.raw)


Part = bytes | Blob
"""A piece of the page: its bytes, or a base64 column written between double quotes."""


def blobs_as_text(data: Any) -> Any:  # Any: JSON data of the report's shape
    """`data` with every `Blob` as its base64 text (what `report_html.report_data` returns).

    >>> blobs_as_text({"a": [Blob(b"hi"), 1]})
    {'a': ['aGk=', 1]}
    """
    return rewrite_leaves(data, lambda v: v.text() if type(v) is Blob else v)


def json_len(data: Any) -> int:  # Any: JSON data of the report's shape
    """``len(json.dumps(blobs_as_text(data)))``, the room a part of the data takes, without
    the copy.

    >>> json_len({"x": Blob(b"hi")}) == len(json.dumps({"x": "aGk="}))
    True
    """
    return len(json.dumps(data, default=_blob_text))


def _blob_text(v: object) -> str:
    if type(v) is Blob:
        return v.text()
    raise TypeError(f"{type(v).__name__} is not JSON data")


def script_json(data: Any) -> list[Part]:  # Any: JSON data of the report's shape
    """JSON that is inert inside a <script> element (UTF-8): no `<`, `>`, `&` or line
    separators, with each `Blob` left as a part of its own.

    Each of those characters becomes its \\u escape, which JSON.parse reads back as the same
    character, so a frame named ``</script><script>alert(1)</script>`` stays a string. The
    caller hands over its only reference to `data`, which goes once its text is made.

    >>> parts = script_json({"b": Blob(b"hi"), "s": "</script>"})
    >>> [type(p).__name__ for p in parts], join_parts(parts)
    (['bytes', 'Blob', 'bytes'], '{"b":"aGk=","s":"\\\\u003c/script\\\\u003e"}')
    """
    blobs: list[Blob] = []
    # stands for a blob in the text: a file cannot hold it, it is drawn anew for each page
    mark = f"gmv-blob-{secrets.token_hex(16)}"

    def hold(v: object) -> str:
        if type(v) is Blob:
            blobs.append(v)
            return mark
        raise TypeError(f"{type(v).__name__} is not JSON data")

    data = json_ready(data)  # no NaN or infinity: JSON.parse refuses them
    text = json.dumps(
        data, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=hold
    )
    del data
    for ch, esc in _SCRIPT_ESCAPES:
        text = text.replace(ch, esc)
    pieces = text.split(mark)
    if len(pieces) != len(blobs) + 1:  # pragma: no cover - the mark is 128 random bits
        raise RuntimeError("a report blob's mark occurs in the report's data")
    out: list[Part] = []
    for i, piece in enumerate(pieces):
        # lone surrogates (a non-UTF-8 file name's bytes) cannot be UTF-8: as \u escapes,
        # JSON.parse reads them back as the same code units
        out.append(piece.encode("utf-8", "backslashreplace"))
        if i < len(blobs):
            out.append(blobs[i])
    return out


_SCRIPT_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def page_parts(title: str, data: Any) -> list[Part]:  # Any: JSON data of the report's shape
    """The whole page: the head (title and CSS), the data's parts (`script_json`; the
    caller hands over its only reference to `data`), the renderer."""
    parts = script_json(data)
    js, css = _renderer()
    head, tail = _PAGE.split("{data}")
    return [
        head.format(title=html.escape(title, quote=True), css=_inert_css(css)).encode(),
        *parts,
        tail.format(js=_inert_js(js)).encode(),
    ]


def write_parts(f: BinaryIO, parts: Iterable[Part]) -> None:
    """Write the page's parts in order, each blob's base64 made as it is written."""
    for part in parts:
        f.write(_bytes(part))


def join_parts(parts: Iterable[Part]) -> str:
    """The page as one string (what `report_html.render_html` returns)."""
    return b"".join(_bytes(p) for p in parts).decode("utf-8")


def _bytes(part: Part) -> bytes:
    return part.ascii() if isinstance(part, Blob) else part


def renderer_size() -> int:
    """Bytes of the page without any snapshot data: the renderer the size budget excludes."""
    js, css = _renderer()
    head, tail = _PAGE.split("{data}")
    page = head.format(title="", css=_inert_css(css)) + tail.format(js=_inert_js(js))
    return len(page.encode("utf-8"))


def _inert_js(js: str) -> str:
    # the bundle is ours; this keeps a literal "</script" in it from closing the element
    return js.replace("</script", "<\\/script").replace("<!--", "<\\!--")


def _inert_css(css: str) -> str:
    return css.replace("</style", "<\\/style")


def _renderer() -> tuple[str, str]:
    """The page's script and style: the built bundles (gpumemviz.reporting.bundles), read as they
    are."""
    js = bundle_path("report.js").read_text(encoding="utf-8")
    css = "\n".join(
        bundle_path(name).read_text(encoding="utf-8") for name in ("widget.css", "report.css")
    )
    return js, css


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; \
script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>{title} · gpumemviz report</title>
<style>
{css}
</style>
</head>
<body class="gmv-page">
<main id="gmv-report" class="gmv-report"><noscript>This report draws with JavaScript.</noscript>\
</main>
<script type="application/json" id="gmv-data">{data}</script>
<script type="module">
{js}
</script>
</body>
</html>
"""
