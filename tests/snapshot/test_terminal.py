"""Terminal safety: everything the command prints that comes from a file or a file name passes
one escaping function, so ESC sequences, BEL, CR and bidi overrides reach the terminal only as
visible escapes."""

from __future__ import annotations

import pickle

import pytest

from gpumemviz.cli import main
from gpumemviz.snapshot.escaping import one_line
from hostile import TERMINAL_ATTACK, frame, not_terminal_safe, snapshot_dict

ATTACK = TERMINAL_ATTACK


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("model.py", "model.py"),
        ("caf\xe9 \u6a21\u578b.py", "caf\xe9 \u6a21\u578b.py"),  # printable text of any script
        ("\x1b]0;t\x07", "\\x1b]0;t\\x07"),
        ("a\rb\nc\td", "a\\rb\\nc\\td"),
        ("\u202eevil\u2066\u200f", "\\u202eevil\\u2066\\u200f"),
        ("\udcff.py", "\\udcff.py"),  # a non-UTF-8 file name's byte
        ("\x9b2J", "\\x9b2J"),  # the 8-bit CSI
        ("caf\xe9\x1b", "caf\xe9\\x1b"),  # escapes only what needs it
    ],
)
def test_one_line_shows_what_a_terminal_would_act_on_as_escapes(text, shown):
    assert one_line(text) == shown
    assert not_terminal_safe(one_line(text)) == []


@pytest.fixture
def hostile_file(tmp_path):
    """A snapshot with terminal codes in its file name, settings string and frames."""
    fr = [frame(filename=f"/x/{ATTACK}.py", name=ATTACK)]
    d = snapshot_dict(frames=fr, allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": ATTACK})
    path = tmp_path / f"run{ATTACK}.pickle"
    path.write_bytes(pickle.dumps(d, protocol=4))
    clean = tmp_path / "clean.pickle"
    clean.write_bytes(pickle.dumps(snapshot_dict(frames=[frame()]), protocol=4))
    return path, clean


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_printed_output_escapes_file_text(hostile_file, tmp_path, capsys):
    path, clean = hostile_file
    out_path = tmp_path / f"out{ATTACK}"
    named = tmp_path / f"named{ATTACK}.pickle"
    named.write_bytes(clean.read_bytes())
    for argv, status in (
        (["inspect", "--no-replay", str(path)], 0),
        (["inspect", "--json", "--no-replay", str(path)], 0),
        (["diff", str(path), str(clean)], 0),
        (["diff", "--json", str(path), str(clean)], 0),
        (["whatif", str(named)], 0),
        (["whatif", str(path)], 2),  # the settings string does not parse: one line says so
        (["export", str(path), "-o", f"{out_path}.pickle"], 0),
        (["report", "--no-replay", str(path), "-o", f"{out_path}.html"], 0),
    ):
        code, out, err = _run(argv, capsys)
        assert code == status, err
        assert not_terminal_safe(out + err) == [], argv
    code, out, _ = _run(["inspect", "--no-replay", str(path)], capsys)
    assert "\\x1b]0;pwned\\x07" in out.splitlines()[0]  # the name and settings, escaped
    _, out, _ = _run(["diff", str(path), str(clean)], capsys)
    assert "\\x1b[2J\\r\\u202eevil" in out  # the frame's site label


def test_error_lines_escape_file_names(tmp_path, capsys):
    missing = tmp_path / f"gone{ATTACK}.pickle"
    for argv in (
        ["inspect", str(missing)],
        ["inspect", str(missing), str(missing)],  # argparse's own message quotes the extra
        ["export", str(missing), "-o", str(tmp_path / f"o{ATTACK}" / "x.json")],
    ):
        code, out, err = _run(argv, capsys)
        assert code == 2
        assert not_terminal_safe(out + err) == [], argv
        assert "\\x1b" in err and "evil" in err  # named in full, not cut at the CR
