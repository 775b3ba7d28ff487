"""Issue 16 acceptance: every device in one panel, in a real JupyterLab: a strip per device with
its figures, binned map and OOM marker, one device's full map below, a click selects."""

from __future__ import annotations

import pytest

from conftest import real_file, standin_file  # tests/ is on sys.path
from gpumemviz.io import load_snapshot
from gpumemviz.render.timeline import annotation_marks

from .test_panel_browser import VIEW, _wait_drawn

pytestmark = pytest.mark.browser

RECORDINGS = [
    pytest.param(lambda: standin_file("expandable_oom_3dev"), id="standin-3dev"),
    pytest.param(
        lambda: real_file("Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle"),
        id="ci-constructor-sun-3dev",
    ),
]

STRIPS = f"""() => {{ const v = ({VIEW})(); if (!v) return null;
    return Array.from(v.root.querySelectorAll('.gmv-strip')).map(s => ({{
        device: Number(s.dataset.device), ooms: Number(s.dataset.ooms),
        selected: s.dataset.selected === 'true',
        bins: Number(s.querySelector('canvas').dataset.bins),
        marker: !s.querySelector('.gmv-strip-oom').hidden,
        text: s.querySelector('.gmv-strip-figs').textContent }})); }}"""
MAP_DEVICES = f"""() => Array.from(new Set((({VIEW})().model.get('map_layout').groups || [])
    .map(g => g.device)))"""


def _strips(page, n: int) -> list[dict]:
    page.wait_for_function(
        f"n => {{ const s = ({STRIPS})(); return s && s.length === n && s.every(x => x.bins); }}",
        arg=n,
        timeout=30_000,
    )
    return page.evaluate(STRIPS)


def test_four_simulated_devices_show_four_strips_and_a_click_selects_one(page, notebook, artifacts):
    nb = notebook(
        "devices.ipynb",
        ["%load_ext gpumemviz", "%gpumemviz --demo training --device all --devices 4"],
    )
    nb.run(0)
    nb.run(1)
    _wait_drawn(page)
    strips = _strips(page, 4)
    assert [s["device"] for s in strips] == [0, 1, 2, 3]
    assert [s["selected"] for s in strips] == [True, False, False, False]
    assert all(s["bins"] == 64 and "reserved" in s["text"] for s in strips)
    assert page.evaluate(MAP_DEVICES) == [0]
    page.locator(".gmv-strip[data-device='2']").first.click()
    page.wait_for_function(
        f"() => ({STRIPS})()[2].selected && ({MAP_DEVICES})().join() === '2'", timeout=20_000
    )
    totals = page.locator(".gmv-strips-totals").first.text_content()
    assert totals.startswith("4 devices · reserved")
    page.locator(".gmv-strips").first.screenshot(path=str(artifacts / "devices-4-simulated.png"))

    # a click whose press and release straddle a redraw of the strips (each sample redraws
    # them) still selects: the strips keep their elements, so press and release meet the same
    box = page.locator(".gmv-strip[data-device='1']").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.evaluate(f"() => {{ const v = ({VIEW})(); v.strips.update(v.model.get('strips')); }}")
    page.mouse.up()
    page.wait_for_function(
        f"() => ({STRIPS})()[1].selected && ({MAP_DEVICES})().join() === '1'", timeout=20_000
    )


@pytest.mark.parametrize("recording", RECORDINGS)
def test_a_three_device_recording_shows_each_device_and_the_oom_on_device_1(
    page, notebook, artifacts, recording
):
    path = recording()
    nb = notebook("replay3.ipynb", ["%load_ext gpumemviz", f"%gpumemviz --replay {path}"])
    nb.run(0)
    nb.run(1)
    _wait_drawn(page)
    strips = _strips(page, 3)
    assert [s["device"] for s in strips] == [0, 1, 2]
    assert [(s["ooms"], s["marker"]) for s in strips] == [(0, False), (1, True), (0, False)]
    assert [s["selected"] for s in strips] == [False, True, False]  # the OOM's device in full
    assert page.evaluate(MAP_DEVICES) == [1]
    totals = page.locator(".gmv-strips-totals").first.text_content()
    assert "OOMs: cuda:1 (1)" in totals
    note = page.locator(".gmv-strips-note").first.text_content()
    assert "same recorded time" in note
    page.locator(".gmv-root").first.screenshot(path=str(artifacts / f"devices-{path.stem}.png"))
    # device 0's timeline carries the recording's annotations (stack names): a click on its
    # strip shows them, each label in a lane of its own or thinned, never overprinted
    raw = load_snapshot(path).to_torch()
    marks = annotation_marks(raw.get("external_annotations"), 0)
    named = [m for m in marks if m["label"] and m["kind"] != "cell"]  # cell lines: no label
    page.locator(".gmv-strip[data-device='0']").first.click()
    page.wait_for_function(
        f"() => ({MAP_DEVICES})().join() === '0' && ({STRIPS})()[0].selected", timeout=20_000
    )
    page.wait_for_function(
        f"""n => {{ const c = ({VIEW})().root.querySelector('.gmv-timeline canvas');
            return c && Number(c.dataset.marks) >= n && c.dataset.labels !== undefined; }}""",
        arg=len(marks),
        timeout=20_000,
    )
    shown, thinned = page.evaluate(
        f"""() => {{ const c = ({VIEW})().root.querySelector('.gmv-timeline canvas');
            return [Number(c.dataset.labels), Number(c.dataset.labelsThinned)]; }}"""
    )
    assert shown + thinned == len(named) and (shown >= 1 or not named)
    page.locator(".gmv-timeline").first.screenshot(path=str(artifacts / f"labels-{path.stem}.png"))
