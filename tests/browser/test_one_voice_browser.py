"""One voice, seen in the browser: on three real recordings the panel of `%gpumemviz --replay`
shows the advice, the rejected advice and the OOM story that `gpumemviz.analyze` finds (and so
`inspect` and the report, which render the same Findings)."""

from __future__ import annotations

import pytest

from conftest import real_file  # tests/ is on sys.path
from gpumemviz.analysis.findings import analyze

pytestmark = pytest.mark.browser

FILES = [
    # GPT-2 medium, context 512, bf16 autocast: both setting advices checked and rejected
    "Wedsonlin__assignment2-systems__results-medium_512_training_memory_snapshot.pickle",
    # three devices, a real OOM on cuda:1 (CI-only: skipped in a clone without ../shared)
    "Constructor-Sun__code_location__memory_snapshot_expandable_oom.pickle",
    # taken at an OOM, torch 2.0 format: 11.03 of 11.03 GiB allocated
    "Yiyi-philosophy__LLM-inference__oom_snapshot.pickle",
]
VIEW = "() => window.__gpumemviz && Object.values(window.__gpumemviz.views)[0]"


@pytest.mark.parametrize("name", FILES, ids=lambda n: n.split("__")[0])
def test_the_panel_says_what_analyze_finds(page, notebook, name):
    path = real_file(name)
    found = analyze(path)
    oom = found.oom
    device = oom.device if oom is not None else None
    shown = found.devices.get(device, found) if device is not None else found
    args = f"--replay {path}" + (f" --device {device}" if device is not None else "")
    nb = notebook(f"voice-{name[:12]}.ipynb", [f"%load_ext gpumemviz\n%gpumemviz {args}"])
    nb.run(0)
    page.wait_for_function(
        """(view) => { const v = eval(view)(); if (!v || !v.root.dataset.seq) return false;
            const items = [...v.root.querySelectorAll(".gmv-advice li")];
            return !items.some((li) => li.textContent.startsWith("checking advice")); }""",
        arg=VIEW,
        timeout=180_000,
    )
    items = page.eval_on_selector_all(
        ".gmv-advice li", "(els) => els.map((e) => [e.dataset.kind, e.textContent])"
    )
    texts = [text for _, text in items]
    for a in shown.advice:
        assert a.message in texts, (a.message, texts)
    for a in shown.rejected:
        assert any(t.startswith(f"checked and rejected: {a.message}") for t in texts), texts
    verdict = page.locator(".gmv-oom").first
    if oom is None:
        assert verdict.is_hidden()
    else:
        text = verdict.text_content() or ""
        assert text.startswith(oom.sentence), (text, oom.sentence)
        assert verdict.get_attribute("data-cause") == oom.cause
        assert oom.actions and f"1. {oom.actions[0].sentence}" in text
        assert "nothing worth changing" not in " ".join(texts)
