"""gpumemviz.prometheus: a real endpoint on 127.0.0.1 scraped over HTTP and read with
prometheus_client's own parser; the series agree with the shared sampler's newest sample."""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpumemviz.analysis.fragmentation import fragmentation
from gpumemviz.live.sampler import Sampler
from gpumemviz.live.shared import shared
from gpumemviz.live.sources import UnavailableSource
from gpumemviz.prometheus import (
    LABELS,
    METRICS,
    PortInUseError,
    exported_names,
    serve,
    serve_rank,
)
from gpumemviz.prometheus.collector import SamplerCollector
from gpumemviz.snapshot.sample import DeviceInfo, MemoryStats, NvmlInfo, Sample

LABEL_VALUES = {"rank": "0", "local_rank": "0", "host": "h", "pid": "1"}


def scrape(url: str) -> dict[str, list]:
    """Series name -> [(labels, value)], parsed by prometheus_client's parser."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith("_created"):
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def parse(registry: CollectorRegistry) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def wait_for(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture
def exporter():
    """serve() on device 0's shared sampler (the simulated demo without CUDA), held still once
    it has a segment state, so a scrape and the sampler's newest sample can be compared."""
    exp = serve(0, devices=[0], rank=3, local_rank=1, demo=True)
    sampler = shared(0)
    assert wait_for(lambda: sampler.history.latest_segments() is not None)
    sampler.pause()
    sampler.sample_once(segments=True)
    yield exp, sampler
    exp.stop()
    sampler.resume()
    sampler.stop()


def test_scrape_agrees_with_the_shared_samplers_newest_sample(exporter):
    exp, sampler = exporter
    got = scrape(exp.url)
    sample = sampler.history.latest_stats()
    want_labels = {
        "rank": "3",
        "local_rank": "1",
        "host": socket.gethostname(),
        "device": "0",
        "gpu_uuid": "",  # the demo device has no UUID
        "pid": str(os.getpid()),
    }
    for name in ("gpumemviz_reserved_bytes", "gpumemviz_alloc_retries_total"):
        [(labels, _)] = got[name]
        assert labels == want_labels and set(labels) == set(LABELS)
    st = sample.stats
    want = {
        "gpumemviz_reserved_bytes": st.reserved,
        "gpumemviz_allocated_bytes": st.allocated,
        "gpumemviz_active_bytes": st.active,
        "gpumemviz_free_in_reserved_bytes": st.reserved - st.active,
        "gpumemviz_alloc_retries_total": st.num_alloc_retries,
        "gpumemviz_ooms_total": st.num_ooms,
        "gpumemviz_peak_allocated_bytes": sample.peaks.allocated,
        "gpumemviz_peak_reserved_bytes": sample.peaks.reserved,
        "gpumemviz_torch_peak_resets_total": 0,
        "gpumemviz_sample_timestamp_seconds": sample.time,
    }
    seg = sampler.history.latest_segments()
    figs = fragmentation(seg.segments).devices[0]
    want |= {
        "gpumemviz_largest_free_block_bytes": figs.largest_free,
        "gpumemviz_external_fragmentation_ratio": figs.external_fragmentation,
        "gpumemviz_releasable_bytes": figs.releasable,
        "gpumemviz_segment_state_timestamp_seconds": seg.time,
    }
    for name, value in want.items():
        assert got[name][0][1] == pytest.approx(value, rel=1e-12), name
    [(info, one)] = got["gpumemviz_device_info"]
    assert one == 1 and info["demo"] == "true" and info["source"] == sample.source_label
    # the demo's NVML figures are stand-ins: left out, never exported as driver figures
    assert not any(n.startswith(("gpumemviz_nvml_", "gpumemviz_non_pytorch")) for n in got)
    nvml = {
        "gpumemviz_nvml_used_bytes",
        "gpumemviz_nvml_total_bytes",
        "gpumemviz_non_pytorch_bytes",
    }
    assert sorted(got) == sorted(set(exported_names()) - nvml)


def test_a_scrape_reads_the_sampler_and_never_samples(exporter):
    exp, sampler = exporter
    ticks = sampler.counters["ticks"]
    for _ in range(3):
        scrape(exp.url)
    assert sampler.counters["ticks"] == ticks
    assert exp.collector.samplers[0] is shared(0)  # the panels' sampler: no second one


def test_two_endpoints_and_the_users_metrics_do_not_clash(exporter):
    exp, _ = exporter
    mine = Counter("user_steps", "the user's own metric")  # in prometheus_client's global one
    try:
        with serve(0, devices=[0], rank=4, local_rank=2, demo=True) as other:
            assert other.port != exp.port
            a, b = scrape(exp.url), scrape(other.url)
            assert a["gpumemviz_reserved_bytes"][0][0]["rank"] == "3"
            assert b["gpumemviz_reserved_bytes"][0][0]["rank"] == "4"
            assert "user_steps_total" not in a and "user_steps_total" not in b
    finally:
        REGISTRY.unregister(mine)


def test_a_port_in_use_is_one_clear_line_and_stop_frees_it(exporter):
    exp, _ = exporter
    with pytest.raises(PortInUseError) as err:
        serve(exp.port, devices=[0])
    assert str(err.value) == (
        f"gpumemviz.prometheus: port {exp.port} on 127.0.0.1 is in use "
        "(another rank or exporter?): pick another port"
    )
    port = exp.port
    exp.stop()
    exp.stop()  # twice: nothing more
    with serve(port, devices=[0], demo=True) as again:
        assert again.port == port and scrape(again.url)["gpumemviz_device_info"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"port": -1}, "port must be an int from 0 to 65535, got -1"),
        ({"port": True}, "port must be an int from 0 to 65535, got True"),
        ({"port": 0, "devices": "some"}, 'devices must be "all" or a list of ints'),
        ({"port": 0, "devices": []}, 'devices must be "all" or a list of ints'),
        ({"port": 0, "devices": [-1]}, "device must be a non-negative int, got -1"),
        ({"port": 0, "rank": -2}, "rank must be a non-negative int, got -2"),
        ({"port": 0, "addr": ""}, "addr must be a host address string"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")) as err:
        serve(**kwargs)
    assert "\n" not in str(err.value)


def test_ranks_default_to_torchruns_environment(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with serve(0, devices=[0]) as exp:
        assert exp.labels["rank"] == "5" and exp.labels["local_rank"] == "1"
    shared(0).stop()
    monkeypatch.setenv("RANK", "five")
    with pytest.raises(ValueError, match=r"^rank: the RANK environment variable must be an int"):
        serve(0, devices=[0])


def test_stop_stops_only_the_samplers_serve_started():
    sampler = shared(0)
    sampler.stop()
    with serve(0, devices=[0]):
        assert sampler.running
    assert not sampler.running
    sampler.start()
    try:
        with serve(0, devices=[0]):
            pass
        assert sampler.running  # it ran before serve: it keeps running
    finally:
        sampler.stop()


class DriverSource:
    """Samples as a real device with NVML would give them (no driver here: NVML is the one
    part that cannot exist on this machine)."""

    label = "torch.cuda (stand-in)"
    device = 0
    capabilities = frozenset()

    def sample(self, *, segments: bool = True) -> Sample:
        stats = MemoryStats.from_torch(
            {
                "reserved_bytes.all.current": 8 << 30,
                "allocated_bytes.all.current": 5 << 30,
                "active_bytes.all.current": 6 << 30,
                "num_alloc_retries": 7,
            }
        )
        nvml = NvmlInfo(
            available=True, uuid="8a7b01", total=80 << 30, used=9 << 30, non_pytorch=1 << 30
        )
        info = DeviceInfo(0, name="H200", uuid="8a7b01")
        return Sample(time=time.time(), device=0, stats=stats, nvml=nvml, device_info=info)

    def close(self) -> None:
        pass


def test_driver_figures_and_the_uuid_label_when_nvml_answers():
    registry = CollectorRegistry()
    sampler = Sampler(DriverSource())
    sampler.sample_once()
    registry.register(SamplerCollector({0: sampler}, LABEL_VALUES))
    got = parse(registry)
    [(labels, used)] = got["gpumemviz_nvml_used_bytes"]
    assert labels["gpu_uuid"] == "GPU-8a7b01"  # as DCGM's UUID label writes it
    assert used == 9 << 30 and got["gpumemviz_nvml_total_bytes"][0][1] == 80 << 30
    assert got["gpumemviz_non_pytorch_bytes"][0][1] == 1 << 30
    assert got["gpumemviz_free_in_reserved_bytes"][0][1] == 2 << 30
    assert got["gpumemviz_alloc_retries_total"][0][1] == 7
    # no segment state read yet: the figures it gives are left out, not exported as 0
    assert "gpumemviz_largest_free_block_bytes" not in got


def test_a_device_without_stats_exports_only_its_info_and_up_0_with_the_reason():
    registry = CollectorRegistry()
    sampler = Sampler(UnavailableSource(0, "no GPU here"))
    sampler.sample_once()
    registry.register(SamplerCollector({0: sampler}, LABEL_VALUES))
    got = parse(registry)
    assert sorted(got) == ["gpumemviz_device_info", "gpumemviz_up"]
    [(labels, value)] = got["gpumemviz_up"]
    assert value == 0 and "no GPU here" in labels["reason"] and labels["device"] == "0"


def test_metric_names_follow_prometheus_conventions():
    for m in METRICS:  # a unit suffix on every gauge; counters get _total from the client
        assert m.name.startswith("gpumemviz_") and not m.name.endswith("_total")
        units = ("_bytes", "_ratio", "_seconds")
        assert (m.kind == "gauge") == m.name.endswith(units), m.name
    assert {m.sample_name for m in METRICS if m.kind == "counter"} == {
        "gpumemviz_alloc_retries_total",
        "gpumemviz_ooms_total",
        "gpumemviz_torch_peak_resets_total",
    }


DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "gpumemviz.json"


def _queries(node: object) -> list[str]:
    """Every PromQL text in a Grafana dashboard: targets' expr, variables' query/definition."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            promql = key in ("expr", "definition", "query") and node.get("type") != "datasource"
            if promql and isinstance(value, str):
                found.append(value)
            else:
                found.extend(_queries(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_queries(value))
    return found


def test_the_grafana_dashboard_queries_only_metrics_gpumemviz_exports(exporter):
    exp, _ = exporter
    dash = json.loads(DASHBOARD.read_text())
    exprs = _queries(dash)
    used = set(re.findall(r"\bgpumemviz_[a-z_]+\b", " ".join(exprs)))
    registry = CollectorRegistry()
    driver = Sampler(DriverSource())
    driver.sample_once()
    registry.register(SamplerCollector({0: driver}, LABEL_VALUES))
    scraped = set(scrape(exp.url)) | set(parse(registry))  # the demo's, and NVML's figures
    assert used and used <= scraped, used - scraped
    # the panels the issue names, per host and rank
    for figure in ("reserved", "allocated", "free_in_reserved", "largest_free_block"):
        assert f"gpumemviz_{figure}_bytes" in used
    assert {"gpumemviz_external_fragmentation_ratio", "gpumemviz_ooms_total"} <= used
    assert "gpumemviz_alloc_retries_total" in used
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "host", "rank", "device"}
    for text in exprs:  # only its own variables, Grafana's, or label_replace's $1
        assert set(re.findall(r"\$(\w+)", text)) <= variables | {"__rate_interval", "1"}, text
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    [dcgm] = [p for p in panels if "DCGM_FI_DEV_FB_USED" in json.dumps(p["targets"])]
    assert "only where the DCGM exporter runs" in dcgm["description"]
    assert all(e.count("(") == e.count(")") and e.count("{") == e.count("}") for e in exprs)


def _free_port_pair() -> int:
    """A port P with P and P + 1 free now (the system's pick, checked)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            if base < 65535:
                with socket.socket() as b:
                    try:
                        b.bind(("127.0.0.1", base + 1))
                    except OSError:
                        continue
                return base
    raise AssertionError("no two free neighbouring ports")


def test_ranks_of_one_host_serve_on_base_plus_local_rank():
    base = _free_port_pair()
    with (
        serve_rank(base, rank=4, local_rank=0, devices=[0], demo=True) as r0,
        serve_rank(base, rank=5, local_rank=1, devices=[0], demo=True) as r1,
    ):
        assert (r0.port, r1.port) == (base, base + 1)
        assert scrape(r1.url)["gpumemviz_device_info"][0][0]["rank"] == "5"
        with pytest.raises(PortInUseError, match=f"^gpumemviz.prometheus: port {base + 1} "):
            serve_rank(base, rank=6, local_rank=1, devices=[0])
    shared(0).stop()


def test_the_docs_table_lists_every_series():
    doc = (DASHBOARD.parents[1] / "docs" / "prometheus.md").read_text()
    listed = set(re.findall(r"^\| `(gpumemviz_[a-z_]+)` \|", doc, re.MULTILINE))
    assert listed == set(exported_names())


def test_without_prometheus_client_serve_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(ImportError, match=r"^gpumemviz.prometheus needs prometheus_client: pip"):
        serve(0, devices=[0])


def test_without_a_gpu_no_device_series_unless_the_demo_is_asked_for():
    """Issue 35 item 14: a node without CUDA serves no plausible memory series by default."""
    from gpumemviz.live.sources.default import cuda_device_count

    assert cuda_device_count() == 0  # this test is about a machine without a GPU
    with serve(0) as exp:  # devices="all"
        assert exp.devices == ()
        assert not any(n.startswith("gpumemviz_") for n in scrape(exp.url))
    with serve(0, devices=[0]) as exp:  # named, but it is the simulated demo
        assert wait_for(lambda: shared(0).history.latest() is not None)
        got = scrape(exp.url)
        assert sorted(n for n in got if n.startswith("gpumemviz_")) == ["gpumemviz_up"]
        [(labels, value)] = got["gpumemviz_up"]
        assert value == 0 and "simulated demo is not served" in labels["reason"]
    with serve(0, demo=True) as exp:  # asked for: device 0, marked demo
        assert exp.devices == (0,)
        assert wait_for(lambda: "gpumemviz_reserved_bytes" in scrape(exp.url))
        [(labels, _)] = scrape(exp.url)["gpumemviz_device_info"]
        assert labels["demo"] == "true"
    shared(0).stop()


def test_a_broken_sampler_says_up_0_with_its_reason():
    class Broken(UnavailableSource):
        def sample(self, *, segments: bool = False) -> Sample:  # type: ignore[override]
            raise RuntimeError("driver went away")

    registry = CollectorRegistry()
    sampler = Sampler(Broken(0, "x"))
    sampler.sample_once()
    registry.register(SamplerCollector({0: sampler}, LABEL_VALUES))
    [(labels, value)] = parse(registry)["gpumemviz_up"]
    assert value == 0 and labels["reason"]


def test_name_filter_returns_only_the_names_asked_for(exporter):
    exp, _ = exporter
    url = exp.url + "?name[]=gpumemviz_reserved_bytes&name[]=gpumemviz_up"
    got = scrape(url)
    assert set(got) == {"gpumemviz_reserved_bytes", "gpumemviz_up"}


def test_idle_connections_are_bounded_and_time_out(monkeypatch):
    import threading

    from gpumemviz.prometheus import server

    monkeypatch.setattr(server, "REQUEST_TIMEOUT_S", 0.5)
    with serve(0, devices=[0], demo=True) as exp:
        before = threading.active_count()
        idle = []
        for _ in range(60):  # half-sent requests, never finished
            s = socket.create_connection(("127.0.0.1", exp.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            idle.append(s)
        time.sleep(0.3)
        assert threading.active_count() - before <= server.MAX_CONNECTIONS
        # they time out: the threads end, and a scrape is answered again
        assert wait_for(lambda: threading.active_count() - before <= 0, timeout=5)
        assert "gpumemviz_up" in scrape(exp.url)
        for s in idle:
            s.close()
    shared(0).stop()
