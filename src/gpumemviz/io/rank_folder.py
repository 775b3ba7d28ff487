"""A folder of per-rank snapshot files: which file is which rank.

A distributed job leaves one file per rank in a folder (`gpumemviz.distributed` writes
``rank{r}.pickle`` on request and ``rank{r}_oom.pickle`` / ``rank{r}_at_rank{a}_oom.pickle`` at
an OOM; users name theirs ``snapshot_rank3.pickle`` and the like). The rank is read from the
name where it says so; otherwise the files are numbered in name order. The folder is not
searched recursively.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["SNAPSHOT_SUFFIXES", "rank_files"]

#: The file names read as snapshots in a folder (as `load_snapshot` reads them: by content).
SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".json")
_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def rank_files(folder: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The snapshot files directly in `folder`, each with its rank, in rank order.

    Parameters
    ----------
    folder : str or PathLike
        A folder (not searched recursively); files whose names end in `SNAPSHOT_SUFFIXES`.

    Returns
    -------
    list of (int, Path)
        The rank is the first ``rank<N>`` in the file's name when every file names a rank
        and no two name the same one; else each file's place in name order.

    Raises
    ------
    NotADirectoryError
        `folder` is not a folder.
    FileNotFoundError
        The folder holds no snapshot file.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     for name in ("rank1_oom.pickle", "rank0_at_rank1_oom.pickle", "notes.txt"):
    ...         _ = (Path(d) / name).write_bytes(b"")
    ...     [(r, p.name) for r, p in rank_files(d)]
    [(0, 'rank0_at_rank1_oom.pickle'), (1, 'rank1_oom.pickle')]
    """
    root = Path(folder)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder")
    files = sorted(
        p for p in root.iterdir() if p.suffix.lower() in SNAPSHOT_SUFFIXES and p.is_file()
    )
    if not files:
        raise FileNotFoundError(f"{root} holds no snapshot file ({', '.join(SNAPSHOT_SUFFIXES)})")
    named = [_RANK.search(p.name) for p in files]
    ranks = [int(m.group(1)) if m else -1 for m in named]
    if -1 in ranks or len(set(ranks)) != len(ranks):
        ranks = list(range(len(files)))
    return sorted(zip(ranks, files, strict=True))
