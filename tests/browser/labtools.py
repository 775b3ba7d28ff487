"""Helpers for the browser tests: the Lab handle and a notebook driven through Lab's commands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Lab:
    url: str
    token: str
    root: Path

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}"


class Notebook:
    """One open notebook in the page: run its cells one at a time through Lab's commands."""

    def __init__(self, page, lab: Lab, name: str, cells: list[str]) -> None:
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
        nbformat.write(nb, lab.root / name)
        self.page = page
        self.name = name
        page.goto(lab.notebook_url(name))
        page.wait_for_function(
            """name => {
                const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                const k = w && w.context && w.context.path === name && w.sessionContext.session
                    && w.sessionContext.session.kernel;
                return k && k.status === 'idle';
            }""",
            arg=name,
            timeout=120_000,
        )

    def run(self, index: int, timeout: float = 120_000) -> None:
        """Run cell `index` and wait for it to finish; fail on an error output."""
        error = self.page.evaluate(
            """async ([i, timeout]) => {
                const nb = window.jupyterapp.shell.currentWidget;
                nb.content.activeCellIndex = i;
                const run = window.jupyterapp.commands.execute('notebook:run-cell');
                await Promise.race([run, new Promise((_, no) => setTimeout(
                    () => no(new Error('cell ' + i + ' timed out')), timeout))]);
                const outs = nb.content.widgets[i].model.outputs.toJSON();
                const bad = outs.find(o => o.output_type === 'error');
                if (!bad) return null;
                return bad.ename + ': ' + bad.evalue + '\\n' + bad.traceback.join('\\n');
            }""",
            [index, timeout],
        )
        assert error is None, error

    def start(self, index: int) -> None:
        """Start running cell `index` without waiting for it (see `wait_idle`)."""
        self.page.evaluate(
            """i => {
                const nb = window.jupyterapp.shell.currentWidget;
                nb.content.activeCellIndex = i;
                window.__gmvRunning = true;
                window.__gmvRun = window.jupyterapp.commands.execute('notebook:run-cell')
                    .finally(() => { window.__gmvRunning = false; });
            }""",
            index,
        )

    def running(self) -> bool:
        """Whether the cell started by `start` still runs. (Lab's kernel status is no guide: it
        shows "idle" once a subshell has answered, while the main shell still runs the cell.)"""
        return self.page.evaluate("() => window.__gmvRunning === true")

    def wait_idle(self, timeout: float = 120_000) -> None:
        """Wait for the cell started by `start` to finish."""
        self.page.evaluate(
            """async timeout => { await Promise.race([window.__gmvRun, new Promise((_, no) =>
                setTimeout(() => no(new Error('cell timed out')), timeout))]); }""",
            timeout,
        )

    def shutdown(self) -> None:
        self.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
