"""sources/playback.py: real recorded traces played back, scrubbing their Recording."""

from __future__ import annotations

import random
import time

import pytest

from conftest import REAL_DIR, read_real, real_file, standin_file
from gpumemviz.allocator.replay.recording import Recording
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.sources import Source, SourceCommandError
from gpumemviz.live.sources.playback import PlaybackSource
from gpumemviz.snapshot import Snapshot

# shipped real recordings (tests/data/real): a 3,840-entry trace, and a state with no history
TRACED = (
    REAL_DIR / "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
)
STATE_ONLY = REAL_DIR / "ZijianDu__Attention__memory.7e5ba324.pickle"


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(lambda: TRACED, id="Wedsonlin"),
        pytest.param(lambda: standin_file("training_10k"), id="standin:training_10k"),
        pytest.param(lambda: standin_file("streams10"), id="standin:streams10"),
        pytest.param(
            lambda: real_file("MAGMA27__assignment2-systems__memory_snapshot.pickle"),
            id="MAGMA27",
        ),
    ],
)
def test_last_entry_shows_the_recorded_final_state(path):
    """Shipped, stand-ins (training_10k starts mid-run: a non-empty start state), CI-only."""
    raw = read_real(path())
    src = PlaybackSource(raw)
    assert isinstance(src, Source)
    assert src.device == 0 and src.n == len(raw["device_traces"][0])
    src.seek(src.n - 1)
    s = src.sample()
    final = [seg for seg in raw["segments"] if seg["device"] == 0]
    assert s.stats.reserved == sum(seg["total_size"] for seg in final)
    assert s.stats.allocated == sum(seg["allocated_size"] for seg in final)
    assert s.segments.n_segments == len(final)
    assert int(s.segments.segments.total_size.sum()) == s.stats.reserved
    assert f"entry {src.n} of {src.n}" in s.notes[0]
    # the time of the entry where the trace has one (streams10 has no time_us, as older torch)
    timed = "time_us" in raw["device_traces"][0][-1]
    assert ("recorded at" in s.notes[0]) == timed, s.notes[0]
    src.seek(-1)
    start = src.sample()
    assert int(start.segments.segments.total_size.sum()) == start.stats.reserved
    assert start.stats.reserved == int(src.recording.start.totals()[0])


def test_playback_moves_forward_and_loops():
    src = PlaybackSource(read_real(TRACED), speed=2000)
    time.sleep(0.2)
    assert src.position > 50
    src.pause()
    p = src.position
    time.sleep(0.05)
    assert src.position == p
    src.seek(src.n - 1)
    src.play(speed=1000)
    time.sleep(0.05)
    assert src.position < src.n // 2  # wrapped around to the start
    with pytest.raises(ValueError, match="outside this trace"):
        src.seek(src.n)


def test_reads_files_and_refuses_what_has_no_history(tmp_path):
    src = PlaybackSource(TRACED)  # a path goes through the restricted loader
    assert src.n == len(read_real(TRACED)["device_traces"][0]) == 3840
    with pytest.raises(ValueError, match="no recorded history"):
        PlaybackSource(read_real(STATE_ONLY))
    with pytest.raises(ValueError, match="bare segment list"):
        PlaybackSource(read_real(STATE_ONLY)["segments"])
    with pytest.raises(TypeError, match="cannot replay a int"):
        PlaybackSource(3)


def test_commands_and_the_sampler():
    raw = read_real(TRACED)
    src = PlaybackSource(raw, speed=500)
    assert src.export() is raw
    with pytest.raises(SourceCommandError, match="no cache to empty"):
        src.empty_cache()
    s = Sampler(src, interval=0.05)
    one = s.sample_once(segments=True)
    assert one.state == "ok" and one.segments is not None and not one.demo
    s.close()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(lambda: TRACED, id="Wedsonlin"),
        pytest.param(lambda: standin_file("training_10k"), id="standin:training_10k"),
    ],
)
def test_seek_at_random_entries_matches_a_full_replay_to_that_entry(path):
    """The panel's seek (a checkpoint every 128 entries, then the few entries after it) gives
    the state a replay from the start of the trace to that entry gives (a Recording with no
    checkpoint but the start), frames included, in random order of entries."""
    raw = read_real(path())
    src = PlaybackSource(raw, loop=False)
    n = src.n
    full = Recording.from_snapshot(raw, every=n + 1)  # one checkpoint: the start
    assert len(full._checkpoints) == 1
    rng = random.Random(20)
    entries = [-1, 0, n - 1, *rng.sample(range(n), 12)]
    rng.shuffle(entries)
    for i in entries:
        src.seek(i)
        got = src.sample()
        assert got.state == "ok", got.error
        segs = full.layout_at(i).to_segments(0, frames=full.frames_after(i))
        want = Snapshot.from_torch(segs)
        assert got.segments.to_torch() == want.to_torch(), f"entry {i}"
        blocks = [b for s in segs for b in s["blocks"]]
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        assert got.stats.allocated == allocated, f"entry {i}"


@pytest.mark.parametrize(
    ("path", "device"),
    [
        pytest.param(lambda: TRACED, 0, id="Wedsonlin"),
        pytest.param(lambda: standin_file("streams10"), 0, id="standin:streams10-no-times"),
        pytest.param(lambda: standin_file("expandable_oom_3dev"), 1, id="standin:3dev-oom"),
    ],
)
def test_a_file_plays_from_its_columns_as_its_dict_plays(path, device, monkeypatch):
    """Opened from a file, the source reads the trace's numpy columns: no dict per entry while
    opening, seeking, sampling, or drawing the panel's timeline, entry times and recorded
    OOMs; and it shows exactly what the same recording opened as a torch dict shows."""
    from gpumemviz.analysis.findings import analyze
    from gpumemviz.snapshot import Trace
    from gpumemviz.widget.panel_state import recorded_timeline, source_times

    raw = read_real(path())
    of_dict = PlaybackSource(raw, device=device, loop=False)
    with monkeypatch.context() as m:
        m.setattr(Trace, "entries", lambda self: pytest.fail("an entry dict per trace entry"))
        src = PlaybackSource(path(), device=device, loop=False)
        assert src.columns is not None and of_dict.columns is None
        assert recorded_timeline(src) == recorded_timeline(of_dict)
        times, want_times = source_times(src), source_times(of_dict)
        assert (times is None) == (want_times is None)
        assert times is None or times.tolist() == want_times.tolist()
        oom = analyze(src.snapshot, device=device).oom
        assert oom == analyze(raw, device=device).oom
        assert (oom is not None) == (device == 1)  # the stand-in's one OOM
        rng = random.Random(20)
        for i in [-1, 0, src.n - 1, *rng.sample(range(src.n), 8)]:
            src.seek(i)
            of_dict.seek(i)
            got, want = src.sample(), of_dict.sample()
            assert got.stats == want.stats and got.notes == want.notes, f"entry {i}"
            assert got.device_info == want.device_info
            assert got.segments.to_torch() == want.segments.to_torch(), f"entry {i}"
        assert src.recording.allocated.tolist() == of_dict.recording.allocated.tolist()
    assert src.export() == raw  # the file's dict, built when asked for
