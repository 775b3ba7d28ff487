"""%load_ext gpumemviz and %gpumemviz in a real IPython shell (terminal and widget paths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from conftest import real_file
from gpumemviz.io import load_snapshot
from gpumemviz.widget.magics import _MAGICS

# shipped real recordings (tests/data/real)
TRACED = "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
STATE_ONLY = "ZijianDu__Attention__memory.7e5ba324.pickle"  # 370 segments, no history


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "gpumemviz")
    yield sh
    sh.run_line_magic("unload_ext", "gpumemviz")
    InteractiveShell.clear_instance()


def _magics(sh):
    return _MAGICS[id(sh)]


def test_terminal_prints_a_summary_of_the_demo(shell, capsys):
    shell.run_line_magic("gpumemviz", "--demo training_expandable")
    out = capsys.readouterr().out
    assert "cuda:0 · simulated caching allocator (demo) · demo data" in out
    assert "reserved " in out and "alloc retries 0 · OOMs 0" in out
    assert _magics(shell).feeds[0].panel is None  # no widget front end: no panel made


def test_status_and_export_act_on_the_shown_feed(shell, capsys, tmp_path):
    shell.run_line_magic("gpumemviz", "--demo training")
    shell.run_line_magic("gpumemviz", "status")
    out = capsys.readouterr().out
    assert "device 0: simulated: training (demo data)" in out and "reads" in out
    path = tmp_path / "run.pickle"
    shell.run_line_magic("gpumemviz", f"export {path}")
    out = capsys.readouterr().out
    assert f"wrote {path}" in out
    snap = load_snapshot(path)
    assert f"({snap.n_segments} segments" in out
    assert path.read_bytes()[:2] == b"\x80\x04"  # pickle protocol 4 (MemoryViz reads it)


def test_export_refuses_a_read_only_file_unless_force(shell, capsys, tmp_path):
    shell.run_line_magic("gpumemviz", "--demo training")
    path = tmp_path / "kept.pickle"
    path.write_bytes(b"old")
    path.chmod(0o444)
    with pytest.raises(UsageError, match=r"^%gpumemviz export: cannot write .*: the file is read-"):
        shell.run_line_magic("gpumemviz", f"export {path}")
    assert path.read_bytes() == b"old"
    shell.run_line_magic("gpumemviz", f"export --force {path}")
    assert f"wrote {path}" in capsys.readouterr().out
    assert load_snapshot(path).n_segments > 0


def test_replay_opens_on_the_recorded_state(shell, capsys):
    path = real_file(TRACED)
    shell.run_line_magic("gpumemviz", f"--replay {path}")
    out = capsys.readouterr().out
    n = load_snapshot(path).n_segments
    assert f"· {n} segments" in out and "recorded trace" in out


def test_replay_reads_its_file_once(shell, capsys, monkeypatch):
    import gpumemviz.io

    path = real_file(TRACED)
    reads = []
    real = gpumemviz.io.load_snapshot
    monkeypatch.setattr(gpumemviz.io, "load_snapshot", lambda p: reads.append(p) or real(p))
    shell.run_line_magic("gpumemviz", f"--replay {path}")
    assert "recorded trace" in capsys.readouterr().out
    assert len(reads) == 1  # the history check and the replay sampler share one read


def test_widget_path_reuses_the_sampler_and_replaces_the_panel(shell):
    from gpumemviz.widget import MemoryPanel

    _magics(shell).widgets = True
    first = shell.run_line_magic("gpumemviz", "--demo training --interval 0.1")
    second = shell.run_line_magic("gpumemviz", "--demo training")
    assert isinstance(first, MemoryPanel) and isinstance(second, MemoryPanel)
    sampler = second.sampler
    assert first.sampler is None and sampler.running  # the old panel let go, same sampler
    assert sampler.interval == 0.1
    assert second.flush()
    shell.run_line_magic("gpumemviz", "stop")
    assert not sampler.running
    shell.run_line_magic("gpumemviz", "")  # a bare re-run shows the live/default feed
    assert _magics(shell).feeds[0].key == ("live", 0)
    assert second.sampler is None  # replaced: the demo feed and its panel are gone


def test_unload_stops_what_the_extension_started(shell):
    from gpumemviz.live.shared import shared

    _magics(shell).widgets = True
    live = shared(0)
    was_running = live.running
    panel = shell.run_line_magic("gpumemviz", "--interval 0.5")
    assert panel.sampler is live and live.running
    shell.run_line_magic("unload_ext", "gpumemviz")
    assert live.running == was_running
    with pytest.raises(UsageError, match="not found"):
        shell.run_line_magic("gpumemviz", "")
    shell.run_line_magic("load_ext", "gpumemviz")  # the fixture unloads once more


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--device -1", "--device must be >= 0"),
        ("--interval 0", r"--interval must be a positive number of seconds from 0\.01 to 86400"),
        ("--interval inf", r"--interval must be .* \(one day\), got inf$"),
        ("--interval 2.4e9", r"--interval must be .* \(one day\), got 2400000000\.0$"),
        ("--interval nan", r"--interval must be .*, got nan$"),
        ("--interval 0.001", r"--interval must be .*, got 0\.001$"),
        ("--force status", "--force is for export"),
        ("--demo nope", "unknown workload 'nope'"),
        ("--demo training --replay x.pickle", "exclude each other"),
        ("--replay /nonexistent.pickle", "no such file"),
        ("export", "export needs a PATH"),
        ("frobnicate", "invalid choice: 'frobnicate'"),
        ("status extra", "unexpected 'extra'"),
    ],
)
def test_bad_input_gets_one_line(shell, line, message):
    with pytest.raises(UsageError, match=message) as err:
        shell.run_line_magic("gpumemviz", line)
    assert "\n" not in str(err.value)


def test_a_file_without_history_shows_its_one_state(shell, capsys):
    path = real_file(STATE_ONLY)
    n = load_snapshot(path).n_segments
    shell.run_line_magic("gpumemviz", f"--replay {path}")
    out = capsys.readouterr().out
    assert f"· {n} segments" in out and "(no recorded history)" in out
    _magics(shell).widgets = True
    panel = shell.run_line_magic("gpumemviz", f"--replay {path}")
    try:
        assert panel.flush() and panel.map_layout["n_rows"] == n
        assert panel.title == path.name and panel.sampler is None
    finally:
        panel.close()


def test_extension_entry_points_are_lazy_attributes_of_the_package():
    import gpumemviz

    assert callable(gpumemviz.load_ipython_extension)
    assert gpumemviz.monitor.__module__ == "gpumemviz.widget.monitor"
    assert gpumemviz.MemoryPanel.__module__ == "gpumemviz.widget.panel"
    assert gpumemviz.__all__ == sorted(gpumemviz.__all__)


def test_summary_says_waiting_for_cuda():
    from gpumemviz.snapshot.sample import Sample
    from gpumemviz.widget.magics import summary

    text = summary(Sample(time=0.0, device=1, stats=None, state="waiting"))
    assert text.splitlines()[1].startswith("waiting for CUDA")


def test_each_cell_leaves_a_marker_with_its_deltas(shell):
    _magics(shell).widgets = True
    panel = shell.run_line_magic("gpumemviz", "--demo training")
    src = panel.sampler.source
    panel.sampler.stop()  # the cell below drives the state by hand
    src.close()
    shell.user_ns["src"] = src
    before = src.sample().stats
    shell.run_cell("src._closed = False\nsrc.step(800)")
    after = src.sample().stats
    marks = [m for m in panel.timeline.marks() if m["kind"] == "cell"]
    assert marks, panel.timeline.marks()
    from gpumemviz.snapshot.units import format_size

    delta = after.allocated - before.allocated
    sign = "+" if delta >= 0 else "-"
    assert f"allocated {sign}{format_size(abs(delta))}" in marks[-1]["label"]
    assert marks[-1]["label"].startswith("cell [")


def test_export_with_nothing_shown_and_no_cuda_refuses_and_writes_nothing(shell, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the shared source has real memory to export")
    from gpumemviz.live.shared import shared

    # a device no other test has shown: its shared (simulated, no CUDA) source has run nothing
    assert shared(6).history.latest() is None
    path = tmp_path / "run.pickle"
    with pytest.raises(UsageError, match="nothing to export on device 6: no segments"):
        shell.run_line_magic("gpumemviz", f"--device 6 export {path}")
    assert not path.exists()
    # once the default source has run (no CUDA: the demo), its state is what export writes
    shell.run_line_magic("gpumemviz", "--device 6")
    shell.run_line_magic("gpumemviz", f"--device 6 export {path}")
    assert load_snapshot(path).n_segments > 0


def test_help_prints_the_options_instead_of_an_error(shell, capsys):
    assert shell.run_line_magic("gpumemviz", "--help") is None
    out = capsys.readouterr().out
    assert out.startswith("usage: %gpumemviz [--device N|all] [--devices N] [--interval S]")
    for option in ("--device N|all", "--devices N", "--interval S", "--demo WORKLOAD", "export"):
        assert option in out
    assert not _magics(shell).feeds  # help shows nothing and starts nothing
    shell.run_line_magic("gpumemviz", "-h")
    assert "usage: %gpumemviz" in capsys.readouterr().out


def test_the_magics_own_help_shows_every_option_and_the_workloads(shell, capsys):
    """`%gpumemviz?` (the magic's docstring) names every option the parser takes, and
    `--help` lists the names --demo accepts."""
    import re

    from gpumemviz.allocator.workloads import WORKLOADS

    shell.run_line_magic("pinfo", "%gpumemviz")
    doc = re.sub(r"\s+", " ", capsys.readouterr().out)
    for option in (
        "--device N|all",
        "--devices N",
        "--job HOST:PORT",
        "--demo WORKLOAD",
        "--replay FILE|DIR",
    ):
        assert option in doc, doc
    shell.run_line_magic("gpumemviz", "--help")
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert all(name in out for name in WORKLOADS), out


def test_a_cell_peak_stays_the_sampled_high_when_someone_resets_torchs_counter(shell):
    """Reset mid-cell, torch's counter rises again but not to the high gpumemviz sampled: the
    marker keeps the sampled high (torch's lower figure does not replace it)."""
    _magics(shell).widgets = True
    panel = shell.run_line_magic("gpumemviz", "--demo training")
    src, sampler = panel.sampler.source, panel.sampler
    sampler.stop()  # the cell below drives the state by hand
    src.close()
    shell.user_ns.update(src=src, sampler=sampler, panel=panel)
    cell = (
        "src._closed = False\n"
        "src.step(3000)\n"
        "high = sampler.sample_once(segments=False).stats.allocated\n"
        "assert panel.flush()\n"
        "while src.sample().stats.allocated >= high: src.step(10)\n"
        "src.reset_peaks()  # another monitor's reset_peak_memory_stats\n"
    )
    before = src.sample().stats.peak_allocated
    shell.run_cell(cell)
    high, st = shell.user_ns["high"], src.sample().stats
    assert before < st.peak_allocated < high  # torch's counter rose, yet misses the high
    from gpumemviz.snapshot.units import format_size

    label = [m for m in panel.timeline.marks() if m["kind"] == "cell"][-1]["label"]
    assert label.endswith(f"peak {format_size(high)}"), label


@pytest.mark.parametrize(
    "call",
    [
        "gpumemviz.monitor",
        "ip.run_line_magic('load_ext', 'gpumemviz'); ip.run_line_magic('gpumemviz', '--demo')",
    ],
    ids=["monitor", "magic"],
)
def test_without_the_widget_extra_the_error_says_how_to_install_it(call):
    """`pip install gpumemviz` without `[widget]`: the panel's first use names the command."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['anywidget'] = None  # as if it were not installed\n"
        "import gpumemviz\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "try:\n"
        f"    {call}\n"
        "except ModuleNotFoundError as e:\n"
        "    print('ERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (
        "ERROR gpumemviz's panel needs anywidget, which is not installed: "
        "pip install 'gpumemviz[widget]'" in out.stdout
    ), out.stdout + out.stderr[-2000:]


RANKS = Path(__file__).resolve().parents[1] / "data" / "ranks_oom"


def test_replay_of_a_folder_prints_the_ranks_and_shows_a_panel_per_rank_worst_first(shell, capsys):
    """`%gpumemviz --replay DIR` on 4 per-rank files, rank 1 with an OOM: the summary worst
    first (in a terminal), then with widgets a panel per rank in that order, the OOM's first."""
    from gpumemviz.analysis.ranks import analyze_ranks

    want = [r.rank for r in analyze_ranks(RANKS, check=False).ranks]
    assert want[0] == 1
    assert shell.run_line_magic("gpumemviz", f"--replay {RANKS}") is None
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ranks_oom: 4 rank file(s), worst first:"
    assert [line.split()[1] for line in out[1:5]] == [str(r) for r in want]
    assert "OOM on cuda:0" in out[1] and "only rank 1 ran out of memory" in "\n".join(out)
    assert _magics(shell).rank_panels == []  # a terminal: the summary only
    _magics(shell).widgets = True
    shell.run_line_magic("gpumemviz", f"--replay {RANKS}")
    panels = _magics(shell).rank_panels
    assert [p.title.split(" · ")[0] for p in panels] == [f"rank {r}" for r in want]
    assert panels[0].title == "rank 1 · rank1_oom.pickle · ran out of memory"
    for panel, rank in zip(panels, want, strict=True):
        assert panel.flush() and panel.wait_checked()
        snap = load_snapshot(RANKS / panel.title.split(" · ")[1])
        assert panel.shown is not None and panel.shown.n_segments == snap.n_segments
        assert bool(panel.oom) == (rank == 1)
    shell.run_line_magic("gpumemviz", f"--replay {RANKS}")  # a re-run replaces the panels
    assert all(p.comm is None for p in panels)  # closed
    again = _magics(shell).rank_panels
    assert len(again) == 4 and not set(map(id, again)) & set(map(id, panels))


@pytest.mark.parametrize("files", [(), ("notes.txt", "readme.md")], ids=["empty", "no snapshot"])
def test_replay_of_a_folder_without_snapshot_files_says_so_in_one_line(shell, tmp_path, files):
    for name in files:
        (tmp_path / name).write_text("not a snapshot")
    with pytest.raises(UsageError) as err:
        shell.run_line_magic("gpumemviz", f"--replay {tmp_path}")
    message = str(err.value)
    assert message.startswith(f"%gpumemviz --replay: {tmp_path} holds no snapshot file (")
    assert "\n" not in message
    assert _magics(shell).rank_panels == []
