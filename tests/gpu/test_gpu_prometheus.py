"""gpumemviz.prometheus and gpumemviz's own peaks on a real GPU (skipped without one).

Run on a GPU machine: ``PYTHONPATH=src python -m pytest -q -p no:cacheprovider tests/gpu``.
Each check runs in a fresh interpreter, so the shared sampler reads torch.cuda (not the demo).
"""

from __future__ import annotations

from .test_gpu_sources import run_py


def test_a_scrape_on_a_real_gpu_carries_the_uuid_and_the_driver_figures():
    out = run_py(
        """
        import json, time, urllib.request, torch
        from prometheus_client.parser import text_string_to_metric_families
        from gpumemviz.live.shared import shared
        from gpumemviz.prometheus import serve
        keep = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 25)]
        exp = serve(0, devices=[0])
        sampler = shared(0)
        end = time.monotonic() + 20
        while sampler.history.latest_segments() is None and time.monotonic() < end:
            time.sleep(0.05)
        sampler.pause()
        last = sampler.sample_once(segments=True)
        text = urllib.request.urlopen(exp.url).read().decode()
        got = {s.name: (s.labels, s.value) for f in text_string_to_metric_families(text)
               for s in f.samples}
        exp.stop()
        print(json.dumps({"got": got, "reserved": last.stats.reserved,
                          "uuid": last.device_info.uuid,
                          "nvml": last.nvml.available if last.nvml else False}))
        """
    )
    got = out["got"]
    labels, reserved = got["gpumemviz_reserved_bytes"]
    assert reserved == out["reserved"] and labels["gpu_uuid"] == f"GPU-{out['uuid']}"
    assert got["gpumemviz_largest_free_block_bytes"][1] > 0
    assert got["gpumemviz_device_info"][0]["demo"] == "false"
    if out["nvml"]:
        assert got["gpumemviz_nvml_used_bytes"][1] >= reserved


def test_a_reset_of_torchs_peaks_by_someone_else_is_counted_and_the_peaks_stay():
    out = run_py(
        """
        import json, torch
        from gpumemviz.live.sampler import Sampler
        from gpumemviz.live.sources.torch_cuda import TorchCudaSource
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        s = Sampler(TorchCudaSource(0, nvml=False))
        high = s.sample_once(segments=False).peaks.allocated
        del x
        s.sample_once(segments=False)
        torch.cuda.reset_peak_memory_stats(0)  # what a framework monitor does
        after = s.sample_once(segments=False)
        torch_peak = torch.cuda.max_memory_allocated(0)
        s.reset_peaks()  # the panel's button
        button = s.sample_once(segments=False)
        print(json.dumps({"high": high, "own": after.peaks.allocated,
                          "resets": after.peaks.torch_resets, "torch_peak": torch_peak,
                          "button_resets": button.peaks.torch_resets,
                          "button_own": button.peaks.allocated,
                          "allocated": button.stats.allocated}))
        """
    )
    assert out["own"] == out["high"] >= 64 << 20  # gpumemviz kept its own peak
    assert out["torch_peak"] < out["high"] and out["resets"] == 1
    assert out["button_resets"] == 1  # the button's own reset is not counted
    assert out["button_own"] == out["allocated"]
