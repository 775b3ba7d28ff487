"""ranks.py and `inspect DIR` / `report DIR`: a folder of per-rank files (the committed fixture
the torchrun test's publisher wrote, rank 1 out of memory) opens worst rank first, with what
differs between the ranks."""

from __future__ import annotations

import json
import pickle
import re

import pytest

from conftest import DATA_DIR
from gpumemviz.analysis.ranks import analyze_ranks
from gpumemviz.cli import main
from gpumemviz.io import load_snapshot, rank_files

#: Written by ``python -m torch.distributed.run --nproc-per-node 4 tests/torchrun_rank.py oom
#: tests/data/ranks_oom`` (`gpumemviz.distributed.publish` with oom_dir): rank 1 ran out of
#: memory, the others wrote their state at that moment.
RANKS_OOM = DATA_DIR / "ranks_oom"


def test_the_fixture_is_the_publishers_four_files():
    assert [(r, p.name) for r, p in rank_files(RANKS_OOM)] == [
        (0, "rank0_at_rank1_oom.pickle"),
        (1, "rank1_oom.pickle"),
        (2, "rank2_at_rank1_oom.pickle"),
        (3, "rank3_at_rank1_oom.pickle"),
    ]


def test_the_worst_rank_comes_first_with_what_differs():
    ranks = analyze_ranks(RANKS_OOM, check=False)
    assert ranks.ranks[0].rank == 1
    assert ranks.ranks[0].findings.oom is not None
    assert all(r.findings.oom is None for r in ranks.ranks[1:])
    assert "only rank 1 ran out of memory" in ranks.differences
    d = ranks.to_dict()
    assert [row["rank"] for row in d["grid"]] == [r.rank for r in ranks.ranks]
    for row, r in zip(d["ranks"], ranks.ranks, strict=True):
        snap = load_snapshot(RANKS_OOM / r.file)
        assert row["findings"]["figures"]["reserved"] == int(snap.segments.total_size.sum())
    json.dumps(d)  # plain JSON


def test_inspect_a_folder(capsys):
    assert main(["inspect", str(RANKS_OOM), "--no-replay"]) == 0
    out = capsys.readouterr().out
    assert "4 rank file(s), worst first:" in out
    first = re.search(r"^  rank (\d+) \(", out, re.M)
    assert first is not None and first.group(1) == "1"
    assert "OOM on cuda:0" in out and "- only rank 1 ran out of memory" in out
    assert main(["inspect", str(RANKS_OOM), "--json", "--no-replay"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["grid"][0]["rank"] == 1 and got["grid"][0]["oom"].startswith("OOM on cuda:0")


def test_report_of_a_folder_carries_the_rank_grid(tmp_path, capsys):
    out = tmp_path / "job.html"
    assert main(["report", str(RANKS_OOM), "-o", str(out), "--no-replay"]) == 0
    assert "wrote" in capsys.readouterr().out
    html = out.read_text()
    assert '"ranks"' in html and "only rank 1 ran out of memory" in html


def test_folders_without_rank_names_count_in_name_order(tmp_path):
    one = pickle.dumps({"segments": [], "device_traces": []}, protocol=4)
    for name in ("b.pickle", "a.json.pickle", "c.pkl"):
        (tmp_path / name).write_bytes(one)
    (tmp_path / "notes.txt").write_text("not a snapshot")
    (tmp_path / "sub").mkdir()
    assert [(r, p.name) for r, p in rank_files(tmp_path)] == [
        (0, "a.json.pickle"),
        (1, "b.pickle"),
        (2, "c.pkl"),
    ]
    (tmp_path / "rank7.pickle").write_bytes(one)  # one name with a rank: still by order
    assert [r for r, _ in rank_files(tmp_path)] == [0, 1, 2, 3]


def test_an_empty_folder_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(FileNotFoundError):
        rank_files(tmp_path)
    assert main(["inspect", str(tmp_path)]) == 2
    assert "holds no snapshot file" in capsys.readouterr().err
