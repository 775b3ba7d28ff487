"""AllocatorConfig.parse against PyTorch's own parser (CPU build, in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpumemviz.allocator.config import AllocatorConfig, ConfigError
from gpumemviz.allocator.rules import MIB, UNLIMITED

# Strings PyTorch's CPU build parses; each is run after resetting large_segment_size (the one
# setting that survives between parses in torch).
CORPUS = [
    "",
    "   ",
    "max_split_size_mb:5",
    "max_split_size_mb:19",
    "max_split_size_mb:20",
    "max_split_size_mb:128",
    "max_split_size_mb:-1",
    "max_split_size_mb:20.5",
    "max_split_size_mb:1e3",
    "max_split_size_mb:abc",
    "max_split_size_mb:99999999999999999999999",
    "max_split_size_mb",
    "max_split_size_mb:",
    "max_split_size_mb:128,",
    "max_split_size_mb:128,,",
    " max_split_size_mb : 128 ",
    "max_split_size_mb,128",
    "max_split_size_mb=128",
    "expandable_segments:true",
    "expandable_segments:True",
    "expandable_segments:False",
    "expandable_segments:1",
    "expandable_segments:[True]",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:3",
    "roundup_power2_divisions:0",
    "roundup_power2_divisions:[256:8,>:2]",
    "roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]",
    "roundup_power2_divisions:[3:8]",
    "roundup_power2_divisions:[256:3]",
    "roundup_power2_divisions:[256:0]",
    "roundup_power2_divisions:[>:2]",
    "roundup_power2_divisions:[1:4,2:8]",
    "roundup_power2_divisions:[1:4",
    "roundup_power2_divisions:[1:4,",
    "roundup_power2_divisions:[]",
    "roundup_power2_divisions:[0:4]",
    "roundup_power2_divisions:[x:4]",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:1.0",
    "garbage_collection_threshold:0",
    "garbage_collection_threshold:nan",
    "garbage_collection_threshold:.5",
    "garbage_collection_threshold:5e-1",
    "garbage_collection_threshold:0x0.8",
    "garbage_collection_threshold:abc",
    "garbage_collection_threshold:1e999",
    "large_segment_size_mb:10",
    "large_segment_size_mb:11",
    "large_segment_size_mb:40,max_split_size_mb:30",
    "max_split_size_mb:30,large_segment_size_mb:40",
    "large_segment_size_mb:40,max_split_size_mb:40",
    "max_non_split_rounding_mb:5",
    "max_non_split_rounding_mb:20",
    "large_segment_size_mb:64,max_non_split_rounding_mb:32",
    "pinned_use_background_threads:True",
    "pinned_use_background_threads:yes",
    "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.8",
    "max_split_size_mb:128:3",
]


def _torch_results(strings: list[str]) -> list[tuple[str, str | None]]:
    code = r"""
import json, sys, torch
f = torch._C._accelerator_setAllocatorSettings
out = []
for s in json.load(sys.stdin):
    f("large_segment_size_mb:20")
    try:
        f(s)
        out.append(["ok", None])
    except Exception as e:
        out.append([type(e).__name__, str(e)])
print(json.dumps(out))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(strings),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [tuple(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])]


@pytest.fixture(scope="module")
def torch_results():
    pytest.importorskip("torch")
    return dict(zip(CORPUS, _torch_results(CORPUS), strict=True))


@pytest.mark.parametrize("s", CORPUS)
def test_same_verdict_and_message_as_pytorch(s, torch_results):
    kind, message = torch_results[s]
    try:
        AllocatorConfig.parse(s, cuda_build=False)
    except ConfigError as e:
        assert kind != "ok", f"we reject {s!r} ({e}) but PyTorch accepts it"
        theirs = message.split("please report a bug to PyTorch. ")[-1]
        assert str(e).startswith(theirs), (str(e), message)
        assert "\n" not in str(e)
    else:
        assert kind == "ok", f"we accept {s!r} but PyTorch raises {kind}: {message}"


def test_values_parsed():
    c = AllocatorConfig.parse(
        "expandable_segments:True, max_split_size_mb:128, max_non_split_rounding_mb:64,"
        "garbage_collection_threshold:0.75,per_process_memory_fraction:0.5,"
        "large_segment_size_mb:32"
    )
    assert c.expandable_segments is True
    assert c.max_split_size == 128 * MIB
    assert c.max_non_split_rounding_size == 64 * MIB
    assert c.large_segment_size == 32 * MIB
    assert c.garbage_collection_threshold == 0.75
    assert c.per_process_memory_fraction == 0.5
    d = AllocatorConfig.parse("")
    assert (d.max_split_size, d.max_non_split_rounding_size, d.large_segment_size) == (
        UNLIMITED,
        20 * MIB,
        20 * MIB,
    )
    assert d.divisions is None
    # max_non_split_rounding follows large_segment_size when not given
    assert AllocatorConfig.parse("large_segment_size_mb:40").max_non_split_rounding_size == 40 * MIB


def test_roundup_table_semantics():
    t = AllocatorConfig.parse(
        "roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]"
    ).roundup_power2_divisions
    # first key fills the lower intervals; unlisted gaps stay 0; '>' fills after the last key
    assert t[:7] == (8,) * 7 and t[7] == 8 and t[8] == 16 and t[9] == 1
    assert t[10] == 0  # 1024 MiB -> 0
    assert t[11] == 8 and t[12:] == (2,) * 4  # 4096 MiB -> 2
    assert AllocatorConfig.parse("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16
    # '>' first leaves interval 0 alone (fills from last_index + 1)
    assert AllocatorConfig.parse("roundup_power2_divisions:[>:2]").roundup_power2_divisions == (
        0,
        *([2] * 15),
    )


@pytest.mark.parametrize(
    ("s", "start"),
    [
        ("foo:1", "Unrecognized key 'foo' in Accelerator allocator config."),
        ("per_process_memory_fraction:1.5", "per_process_memory_fraction is invalid"),
        ("backend:fancy", "Unknown allocator backend, options are native and cudaMallocAsync"),
        ("pinned_num_register_threads:3", "Number of register threads has to be power of 2, got 3"),
        ("pinned_num_register_threads:256", "Number of register threads should be less than"),
        ("release_lock_on_cudamalloc:yes", "Expected 'True' or 'False' at index 2"),
    ],
)
def test_cuda_build_keys(s, start):
    with pytest.raises(ConfigError) as e:
        AllocatorConfig.parse(s)
    assert str(e.value).startswith(start)
    AllocatorConfig.parse(s, cuda_build=False)  # the CPU wheel skips them


def test_cuda_keys_parsed():
    c = AllocatorConfig.parse(
        "backend:native,throw_on_cudamalloc_oom:True,per_process_memory_fraction:0"
    )
    assert (
        c.backend == "native" and c.throw_on_cudamalloc_oom and c.per_process_memory_fraction == 0
    )


def test_settings_round_trip():
    c = AllocatorConfig.parse(
        "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4"
    )
    d = c.to_settings()
    assert d["max_split_size"] == 128 * MIB and d["expandable_segments"] is True
    assert d["roundup_power2_divisions"]["1"] == 4 and len(d["roundup_power2_divisions"]) == 16
    back = AllocatorConfig.from_settings(d)
    assert back == c
    assert AllocatorConfig.parse("").to_settings()["max_split_size"] == -1
    assert AllocatorConfig.from_settings(None) == AllocatorConfig()


def test_from_settings_of_real_files(recorded_dict):
    settings = recorded_dict.get("allocator_settings") if isinstance(recorded_dict, dict) else None
    c = AllocatorConfig.from_settings(settings)
    if settings:
        assert c.expandable_segments == settings["expandable_segments"]
        mss = settings["max_split_size"]
        assert c.max_split_size == (UNLIMITED if mss == -1 else mss)


def test_bad_types():
    with pytest.raises(ConfigError, match="must be a str"):
        AllocatorConfig.parse(5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a dict"):
        AllocatorConfig.from_settings([1])  # type: ignore[arg-type]


def test_from_settings_keeps_cuda_keys_and_skips_unknown_ones():
    s = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8"
    back = AllocatorConfig.from_settings(AllocatorConfig.parse(s).to_settings())
    assert back.per_process_memory_fraction == 0.8 and back.garbage_collection_threshold == 0.6
    newer = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,some_future_key:7"}
    assert AllocatorConfig.from_settings(newer).expandable_segments is True


def test_max_split_size_is_reported_as_torchs_int64():
    c = AllocatorConfig.parse("max_split_size_mb:-1")  # stoull wraps: SIZE_MAX // 1 MiB MiB
    assert c.max_split_size == UNLIMITED - (MIB - 1)
    assert c.to_settings()["max_split_size"] == -MIB
    assert AllocatorConfig.from_settings(c.to_settings()).max_split_size == c.max_split_size
    assert AllocatorConfig.from_settings({"max_split_size": -1}).max_split_size == UNLIMITED


@pytest.mark.parametrize(
    ("divisions", "message"),
    [
        ({"1": {}}, r"roundup_power2_divisions\['1'\] is \{\}, not 0 or a power of 2"),
        ({"512": float("-inf")}, r"roundup_power2_divisions\['512'\] is -inf"),
        ({"64": 3}, r"roundup_power2_divisions\['64'\] is 3, not 0 or a power of 2"),
        ({"64": True}, r"is True, not 0 or a power of 2"),
        ({"x": 4}, r"key 'x' is not an interval"),
    ],
)
def test_from_settings_refuses_bad_recorded_divisions(divisions, message):
    # fuzz-found (tests/data/fuzz/roundup_divisions_*): these crashed fragmentation() with
    # TypeError / OverflowError; load_snapshot's validate refuses the same shapes
    with pytest.raises(ConfigError, match=message):
        AllocatorConfig.from_settings({"roundup_power2_divisions": divisions})


def test_from_settings_reads_recorded_divisions():
    conf = AllocatorConfig.from_settings({"roundup_power2_divisions": {"1": 4, 64: 0}})
    assert conf.roundup_power2_divisions[0] == 4 and conf.roundup_power2_divisions[6] == 0
