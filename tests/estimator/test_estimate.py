"""gpumemviz.estimate: a step run on the meta device (real torch, CPU wheel), driven through the
allocator model; checked against a real recording of the same program on a GPU."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
import torch

import gpumemviz
from conftest import REAL_DIR
from gpt_shaped import MEDIUM, SMALL, inference_step, make_setup, training_step
from gpumemviz.estimator import estimate, max_batch
from gpumemviz.estimator.extras import workspace_size
from gpumemviz.estimator.record import ALLOC, FREE, record
from gpumemviz.estimator.run import record_step

MiB = 1 << 20
WS_A100 = 8 * MiB + 128 * 1024  # torch's default cuBLAS workspace before Hopper
WS_H100 = 32 * MiB
REAL = (
    REAL_DIR / "Wedsonlin__assignment2-systems__results-medium_128_inference_memory_snapshot.pickle"
)


# ---------------------------------------------------------------- the meta recording


def test_record_sees_allocations_frees_and_shares_views():
    def step(device):
        x = torch.empty(1000, device=device)  # 4000 bytes
        v = x[10:]  # a view: no allocation
        x.add_(1)  # in place: none
        y = v * 2  # 3960 bytes, freed when the step returns
        del y
        return x

    rec = record(None, step)
    kinds = [(e.kind, e.size) for e in rec.events]
    assert kinds == [(ALLOC, 4000), (ALLOC, 3960), (FREE, 3960), (FREE, 4000)]
    assert rec.events[0].op == "empty" and __file__ in rec.events[0].frame


def test_setup_tensors_are_live_when_the_step_starts():
    def setup(device):
        with torch.device(device):
            return {"w": torch.empty(3 * MiB // 4), "b": torch.empty(100)}

    est = estimate(lambda s: s["w"] * 2, setup=setup, capacity="1GiB")
    assert est.start_allocated == 3 * MiB + 512  # the bias rounds to 512 bytes
    assert est.peak_allocated == est.start_allocated + 3 * MiB
    assert est.step_allocs == (3 * MiB,)


def test_cublas_workspace_by_arch_and_handle():
    def step(device):
        x = torch.randn(256, 256, device=device, requires_grad=True)
        (x @ x).sum().backward()  # forward on the main thread, backward on autograd's
        return x.grad

    a100 = estimate(step, capacity="1GiB", arch="8.0")
    h100 = estimate(step, capacity="1GiB", arch="9.0")
    assert a100.workspaces == h100.workspaces == 2
    assert h100.peak_allocated - a100.peak_allocated == 2 * (WS_H100 - WS_A100)
    assert workspace_size("8.0", ":4096:8") == WS_H100
    assert workspace_size("sm_80") == WS_A100 and workspace_size("hopper") == WS_H100
    with pytest.raises(ValueError, match="CUBLAS_WORKSPACE_CONFIG '4096'"):
        workspace_size("9.0", "4096")
    with pytest.raises(ValueError, match="compute capability"):
        workspace_size("fast")


def test_foreach_optimizer_path_as_on_cuda():
    def setup(device):
        with torch.device(device):
            model = torch.nn.Sequential(*(torch.nn.Linear(512, 512) for _ in range(4)))
        opt = torch.optim.AdamW(model.parameters())
        return model, opt

    def step(state):
        model, opt = state
        model(torch.randn(8, 512, device="meta")).sum().backward()
        opt.step()

    cuda = record_step(step, setup=setup)
    meta = record_step(step, setup=setup, cuda_paths=False)
    ops_cuda = {e.op for e in cuda.events if e.kind == ALLOC}
    ops_meta = {e.op for e in meta.events if e.kind == ALLOC}
    assert any(op.startswith("_foreach") for op in ops_cuda)
    assert not any(op.startswith("_foreach") for op in ops_meta)
    # the foreach path holds temporaries for every parameter at once
    with_paths = estimate(step, setup=setup, capacity="1GiB")
    without = estimate(step, setup=setup, capacity="1GiB", cuda_paths=False)
    assert with_paths.peak_allocated > without.peak_allocated
    # the patch is undone
    from torch.optim import optimizer

    assert "meta" not in optimizer._get_foreach_kernels_supported_devices()


@pytest.mark.parametrize(
    ("dtype", "kernel"), [(torch.float32, "efficient"), (torch.bfloat16, "flash")]
)
def test_attention_takes_the_fused_kernel_cuda_picks(dtype, kernel):
    def step(device):
        q = torch.randn(2, 8, 1024, 64, device=device, dtype=dtype, requires_grad=True)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()

    scores = 2 * 8 * 1024 * 1024 * 4  # the fp32 score matrix the math path makes
    fused = record_step(step)
    math = record_step(step, cuda_paths=False)
    assert any(e.op == f"_scaled_dot_product_{kernel}_attention" for e in fused.events)
    assert max(e.size for e in fused.events) < scores <= max(e.size for e in math.events)
    assert estimate(step).peak_allocated < estimate(step, cuda_paths=False).peak_allocated / 4


def test_operator_without_meta_kernel_runs_under_fake_tensor_mode():
    lib = torch.library.Library("gpumemviz_estimate_test", "DEF")
    lib.define("thrice(Tensor x) -> Tensor")
    lib.impl("thrice", lambda x: torch.cat([x, x, x]), "CPU")
    torch.library.register_fake("gpumemviz_estimate_test::thrice", lib=lib)(
        lambda x: x.new_empty(3 * x.shape[0])
    )

    def no_meta(x):
        raise NotImplementedError("no meta kernel")

    lib.impl("thrice", no_meta, "Meta")
    est = estimate(
        lambda d: torch.ops.gpumemviz_estimate_test.thrice(torch.empty(MiB // 4, device=d)),
        capacity="1GiB",
    )
    assert est.fake_ops == {"thrice": 1}
    assert est.step_allocs == (MiB, 3 * MiB)
    assert "FakeTensorMode" in str(est) and "thrice" in str(est)


def test_what_meta_cannot_run_is_one_line():
    def step(device):
        x = torch.randn(10, device=device)
        return x[x > 0]  # the output size depends on the values

    with pytest.raises(ValueError, match=r"^aten::index at .*test_estimate.py:\d+ in step") as e:
        estimate(step)
    assert "\n" not in str(e.value)
    with pytest.raises(
        ValueError, match=r"step failed on the meta device: RuntimeError: Tensor\.item"
    ):
        estimate(lambda d: torch.ones(2, device=d).sum().item())


# ---------------------------------------------------------------- the model, OOM, settings


def test_oom_names_the_operator_the_user_frame_and_the_verdict():
    def step(device):
        keep = [torch.empty(30 * MiB // 4, device=device) for _ in range(3)]  # 90 MiB
        keep.append(torch.empty(40 * MiB // 4, device=device))  # the one that fails
        return keep

    est = estimate(step, capacity="100MiB")
    assert not est.fits and est.oom is not None
    assert est.oom.op == "empty" and est.oom.size == 40 * MiB
    assert "test_estimate.py" in est.oom.frame and "in step" in est.oom.frame
    assert est.oom.can_fit.verdict == "out_of_memory" and est.oom.can_fit.fits is False
    assert "CUDA out of memory" in est.oom.message
    assert est.peak_allocated == 90 * MiB
    assert "OUT OF MEMORY" in str(est)


def test_fragmentation_settings_and_the_snapshot_at_the_peak(tmp_path):
    def step(device):
        # 6 MiB tensors, three to a 20 MiB segment; two neighbours freed across a segment
        # boundary leave 6 + 2 and 6 MiB holes, where one expandable segment leaves 12 MiB
        xs = [torch.empty(6 * MiB // 4, device=device) for _ in range(12)]
        del xs[8:10], xs[2:4]
        return xs, torch.empty(12 * MiB // 4, device=device)

    default = estimate(step, capacity="90MiB")
    expandable = estimate(step, capacity="90MiB", config="expandable_segments:True")
    assert default.oom is not None and expandable.oom is None
    assert default.oom.can_fit.verdict == "out_of_memory"
    assert default.segments == 4 and expandable.segments == 1
    assert expandable.config == "expandable_segments:True"
    snap = expandable.snapshot
    assert snap.segments and expandable.segments == len(snap.segments)
    blocks = [b for seg in snap.to_torch()["segments"] for b in seg["blocks"]]
    frames = [f for b in blocks if b["state"] == "active_allocated" for f in b["frames"]]
    assert {f["name"] for f in frames[::2]} == {"aten::empty"}
    assert {Path(f["filename"]).name for f in frames[1::2]} == {"test_estimate.py"}
    report = gpumemviz.fragmentation(snap)
    assert report.allocated == expandable.peak_allocated
    from gpumemviz.widget import MemoryPanel

    panel = MemoryPanel.from_snapshot(snap, title="predicted")
    panel.close()
    page = gpumemviz.report(snap, tmp_path / "predicted.html", title="predicted peak")
    # the report's holders name the user's line (the operator's own frame is native)
    assert "test_estimate.py:" in page.read_text()


def test_bad_arguments_are_one_line():
    for kwargs, match in (
        ({"capacity": "lots"}, "not a size"),
        ({"capacity": 0}, "capacity must be positive"),
        ({"config": "expandable_segments:Maybe"}, "True. or .False"),
        ({"config": 3}, "config must be"),
        ({"arch": "fast"}, "compute capability"),
    ):
        with pytest.raises(ValueError, match=match) as e:
            estimate(lambda d: None, **kwargs)
        assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="step must be callable"):
        estimate(3)


def test_max_batch_bisects_each_setting_and_matches_brute_force():
    def make(batch):
        def step(device):
            xs = [torch.empty(batch, MiB // 4, device=device) for _ in range(6)]
            del xs[::2]
            return xs, torch.empty(2 * batch, MiB // 4, device=device)

        return step, None

    fit = max_batch(make, capacity="200MiB", configs=("", "expandable_segments:True"))
    for config, best in fit.items():
        assert best > 0
        assert estimate(make(best)[0], capacity="200MiB", config=config).fits
        assert not estimate(make(best + 1)[0], capacity="200MiB", config=config).fits
    # two meta runs, then one per answer: the other batches' sizes are affine in the batch
    assert fit.meta_runs <= 2 + len(fit)
    real = max_batch(make, capacity="200MiB", extrapolate=False)
    assert dict(real) == dict(fit) and real.meta_runs > fit.meta_runs

    text = str(fit)
    assert "default" in text and "expandable_segments:True" in text
    none = max_batch(make, capacity="1MiB", configs=("",))
    assert none[""] == 0 and none.estimates[""] is None
    with pytest.raises(ValueError, match="configs must be a sequence"):
        max_batch(make, capacity="1GiB", configs="expandable_segments:True")
    with pytest.raises(ValueError, match=r"make\(1\) must return \(step, setup\), got <function"):
        max_batch(lambda b: make(b)[0], capacity="1GiB")


def test_max_batch_searches_again_where_sizes_are_not_affine():
    def make(batch):
        def step(device):  # quadratic in the batch: two runs mislead the extrapolation
            return torch.empty(batch * batch, MiB // 4, device=device)

        return step, None

    fit = max_batch(make, capacity="400MiB", configs=("",))
    assert fit[""] == 20  # 20 x 20 MiB = 400 MiB; 21 x 21 would be 441
    assert fit.estimates[""].peak_allocated == 400 * MiB


# ---------------------------------------------------------------- against a real recording


def _recorded_step(path: Path) -> tuple[list[int], int, int]:
    """The recording's alloc sizes in order, allocated at its start and at its peak."""
    from gpumemviz.io import load_snapshot

    d = load_snapshot(path).to_torch()
    trace = d["device_traces"][0]
    net = peak = 0
    for e in trace:
        if e["action"] == "alloc":
            net += e["size"]
        elif e["action"] == "free_completed":
            net -= e["size"]
        peak = max(peak, net)
    start = sum(s["allocated_size"] for s in d["segments"]) - net
    return [e["size"] for e in trace if e["action"] == "alloc"], start, start + peak


def test_gpt2_medium_inference_matches_the_real_recording():
    """GPT-2-medium-shaped, batch 4, context 128, forward under inference_mode after warm-up,
    recorded on an A100-class GPU (its 8 MiB + 128 KiB cuBLAS workspace is in the file)."""
    sizes, start, peak = _recorded_step(REAL)
    est = estimate(inference_step, setup=make_setup(MEDIUM, 4, 128), capacity="80GiB", arch="8.0")
    matcher = difflib.SequenceMatcher(None, sizes, list(est.step_allocs), autojunk=False)
    matched = sum(b.size for b in matcher.get_matching_blocks()) / len(sizes)
    delta = (est.peak_allocated - est.start_allocated) / (peak - start) - 1
    peak_error = est.peak_allocated / peak - 1
    print(
        f"alloc sizes matched in order {matched:.1%}, step delta {delta:+.2%}, "
        f"peak {peak_error:+.2%}"
    )
    assert matched >= 0.90
    assert abs(delta) <= 0.10
    assert abs(peak_error) <= 0.02
    # measured when written: every size in order, both figures exact
    assert matched == 1.0 and est.start_allocated == start and est.peak_allocated == peak
    assert est.fits and est.workspaces == 1
    # and the allocator's side: the recording's peak reserved and its segments at that peak
    recorded = gpumemviz.replay(REAL)
    assert est.peak_reserved == recorded.recorded_peak_reserved(0)
    assert est.segments == recorded.peak_segments(0, "recording") == 98


def test_small_training_step_is_consistent():
    est = estimate(training_step, setup=make_setup(SMALL, 2, 16, train=True), capacity="1GiB")
    assert est.fits and est.workspaces == 2  # forward and backward handles
    assert est.peak_allocated > est.start_allocated
    # AdamW's state (exp_avg, exp_avg_sq) is made in the step and stays
    params = sum(
        p.numel() * 4 for p in make_setup(SMALL, 2, 16)(torch.device("cpu")).model.parameters()
    )
    assert est.peak_allocated - est.start_allocated >= 2 * params
