"""Where writers write (issue 15, points 5 and 8): every writer (`atomic_write` and all that
use it: `save_snapshot`, `gpumemviz.export`, the report, the panel's export, the CLI) takes
"-" for standard output, writes through a symlink, refuses a read-only file unless forced and a
directory, device, fifo or socket always, and keeps the old file on any failure; the panel's
exports never share a name nor land on a file already there.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import sys
import time
import types
from pathlib import Path

import pytest

import gpumemviz
from gpumemviz.cli import main
from gpumemviz.io import atomic_write, load_snapshot, save_snapshot
from gpumemviz.reporting.html_report import report
from gpumemviz.widget import MemoryPanel, commands
from test_snapshot import minimal


def _bytes(f):
    f.write(b"new data")


def _panel_export(path, **kw):
    panel = MemoryPanel.from_snapshot(minimal())
    try:
        assert panel.flush()
        return panel.export(path, **kw)
    finally:
        panel.close()


# name -> write(path, **kw); each writes a snapshot of `minimal()` (or bytes) to `path`
WRITERS = {
    "atomic_write": lambda path, **kw: atomic_write(path, _bytes, **kw),
    "save_snapshot": lambda path, **kw: save_snapshot(minimal(), path, **kw),
    "export_pickle": lambda path, **kw: gpumemviz.export(minimal(), path, **kw),
    "export_json": lambda path, **kw: gpumemviz.export(minimal(), path, format="json", **kw),
    "export_csv": lambda path, **kw: gpumemviz.export(minimal(), path, format="csv", **kw),
    "report": lambda path, **kw: report(minimal(), path, replay_advice=False, **kw),
    "panel_export": _panel_export,
}


@pytest.fixture(params=sorted(WRITERS))
def writer(request):
    return WRITERS[request.param]


def test_dash_is_standard_output_for_every_writer(writer, tmp_path, monkeypatch, capsysbinary):
    monkeypatch.chdir(tmp_path)
    writer("-")
    out = capsysbinary.readouterr().out
    assert out and list(tmp_path.iterdir()) == []  # no file named "-"
    assert out == b"new data" or out.startswith((b"\x80\x04", b"{", b"device,", b"<!doctype"))


def test_stdout_gets_all_or_nothing(tmp_path, monkeypatch, capsysbinary):
    monkeypatch.chdir(tmp_path)

    def half(f):
        f.write(b"half of it")
        raise ValueError("writer bug")

    with pytest.raises(ValueError, match="writer bug"):
        atomic_write("-", half)
    assert capsysbinary.readouterr().out == b"" and list(tmp_path.iterdir()) == []


def test_a_symlink_is_written_through_and_kept(writer, tmp_path):
    target = tmp_path / "data" / "real.bin"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    writer(link)
    assert link.is_symlink() and link.readlink() == target
    assert target.read_bytes() not in (b"", b"old")
    assert sorted(p.name for p in target.parent.iterdir()) == ["real.bin"]  # no temp left


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.pickle"
    link.symlink_to("made.pickle")
    save_snapshot(minimal(), link)
    assert link.is_symlink() and load_snapshot(tmp_path / "made.pickle").n_segments == 2


def test_a_symlink_loop_is_a_one_line_error(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError, match=r"^cannot write .*/a: Too many levels of symbolic links$"):
        save_snapshot(minimal(), tmp_path / "a")


def test_a_read_only_file_is_refused_unless_forced(writer, tmp_path):
    path = tmp_path / "kept.bin"
    path.write_bytes(b"old")
    path.chmod(0o444)
    with pytest.raises(PermissionError, match=r"^cannot write .*kept\.bin: the file is read-only"):
        writer(path)
    assert path.read_bytes() == b"old"
    writer(path, force=True)
    assert path.read_bytes() != b"old"
    assert stat.S_IMODE(path.stat().st_mode) == 0o444  # its permission bits stay
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.bin"]


def test_a_read_only_link_target_is_refused_too(tmp_path):
    target = tmp_path / "t.pickle"
    target.write_bytes(b"old")
    target.chmod(0o400)
    link = tmp_path / "l.pickle"
    link.symlink_to(target)
    with pytest.raises(PermissionError, match="read-only"):
        save_snapshot(minimal(), link)
    assert target.read_bytes() == b"old" and link.is_symlink()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


def _device(path: Path) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("mknod needs root")


@pytest.mark.parametrize(
    ("make", "kind"),
    [(_fifo, "a fifo"), (_socket, "a socket"), (_device, "a character device")],
)
def test_devices_fifos_and_sockets_are_never_replaced(writer, tmp_path, make, kind):
    node = tmp_path / "node"
    keep = make(node)
    mode = node.lstat().st_mode
    for force in (False, True):
        with pytest.raises(OSError, match=rf"^cannot write .*node: it is {kind}, not a regular"):
            writer(node, force=force)
        assert node.lstat().st_mode == mode  # still the same kind of node
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node"]
    if keep is not None:
        keep.close()


def test_the_old_file_stays_when_anything_fails(tmp_path):
    target = tmp_path / "t.bin"
    target.write_bytes(b"old")
    link = tmp_path / "l.bin"
    link.symlink_to(target)
    for exc in (ValueError("bug"), KeyboardInterrupt(), SystemExit(3), OSError(errno.ENOSPC, "x")):

        def fail(f, exc=exc):
            f.write(b"partial")
            raise exc

        with pytest.raises(type(exc)):
            atomic_write(link, fail)
        assert target.read_bytes() == b"old" and link.is_symlink()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["l.bin", "t.bin"]


# --- the CLI --------------------------------------------------------------------------------


@pytest.fixture
def snapshot_file(tmp_path):
    return save_snapshot(minimal(), tmp_path / "in.pickle")


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["export", "IN", "-o", "-", "--format", "json"], b"{"),
        (["export", "IN", "-o", "-", "--format", "csv"], b"device,"),
        (["export", "IN", "-o", "-"], b"\x80\x04"),  # to a pipe: fine
        (["report", "IN", "-o", "-", "--no-replay"], b"<!doctype html>"),
    ],
)
def test_cli_dash_output_is_standard_output(snapshot_file, argv, start, capsysbinary, monkeypatch):
    monkeypatch.chdir(snapshot_file.parent)  # where a file named "-" would land
    argv = [str(snapshot_file) if a == "IN" else a for a in argv]
    assert main(argv) == 0
    out, err = capsysbinary.readouterr()
    assert out.startswith(start) and b"wrote" not in out and err == b""
    assert sorted(p.name for p in snapshot_file.parent.iterdir()) == ["in.pickle"]


def test_cli_will_not_write_a_pickle_to_a_terminal(snapshot_file, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["export", str(snapshot_file), "-o", "-"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumemviz export: error: will not write a binary pickle to a terminal")


@pytest.mark.parametrize("command", ["export", "report"])
def test_cli_refuses_a_read_only_output_unless_force(snapshot_file, command, capsys):
    out = snapshot_file.parent / "out.bin"
    out.write_bytes(b"old")
    out.chmod(0o444)
    extra = ["--no-replay"] if command == "report" else []
    assert main([command, str(snapshot_file), "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "the file is read-only (--force" in err[0]
    assert out.read_bytes() == b"old"
    assert main([command, str(snapshot_file), "-o", str(out), "--force", *extra]) == 0
    assert out.read_bytes() != b"old" and capsys.readouterr().out.startswith(f"wrote {out}")


@pytest.mark.parametrize("command", ["export", "report"])
def test_cli_refuses_a_fifo_before_reading_its_input(tmp_path, command, capsys):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    missing = tmp_path / "not-read.pickle"  # refused first: the input is never opened
    assert main([command, str(missing), "-o", str(fifo)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "it is a fifo, not a regular file" in err[0]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


# --- point 8: exports never collide ---------------------------------------------------------


def test_claim_new_file_never_takes_a_name_already_there(tmp_path):
    from gpumemviz.io import claim_new_file

    first = claim_new_file(tmp_path, "snap", ".pickle", when=1_700_000_000.25)
    first.write_bytes(b"mine")
    names = {first.name}
    for _ in range(5):
        p = claim_new_file(tmp_path, "snap", ".pickle", when=1_700_000_000.25)
        assert p.exists() and p.stat().st_size == 0 and p.name not in names
        names.add(p.name)
    assert first.read_bytes() == b"mine"
    assert "-250" in first.name  # milliseconds in the stamp
    with pytest.raises(FileNotFoundError, match=r"^cannot write .*missing"):
        claim_new_file(tmp_path / "missing", "snap", ".pickle")


def test_two_panels_exporting_in_the_same_instant_write_two_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    frozen = 1_700_000_000.5
    fake = types.SimpleNamespace(  # both panels see the same clock reading
        time=lambda: frozen,
        strftime=lambda fmt, t=None: time.strftime(fmt, time.localtime(frozen)),
        localtime=lambda t=None: time.localtime(frozen),
    )
    monkeypatch.setattr(commands, "time", fake)
    panels = [MemoryPanel.from_snapshot(minimal()) for _ in range(3)]
    try:
        assert all(p.flush() for p in panels)
        replies = [p.command("export") for p in panels]
    finally:
        for p in panels:
            p.close()
    assert all(r["ok"] for r in replies), replies
    paths = [Path(r["path"]) for r in replies]
    assert len(set(paths)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
    for p in paths:
        assert load_snapshot(p).n_segments == 2


def test_a_failed_panel_export_leaves_no_empty_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    panel = MemoryPanel.from_snapshot(minimal())
    try:
        assert panel.flush()

        def broken(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(panel, "export", broken)
        reply = panel.command("export")
    finally:
        panel.close()
    assert not reply["ok"] and "No space left" in reply["text"]
    assert list(tmp_path.iterdir()) == []
