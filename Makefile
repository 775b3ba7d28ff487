# Every target sets itself up from nothing: a fresh clone needs python3, node and npm (and root,
# for Debian's chromium, which `make test`'s browser tests drive).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test lint fmt bench fuzz soak demo clean system-deps js screenshots

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@# torch first and pinned: a range in a fresh venv pulls a multi-GB CUDA build.
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

# The panel's and the report's front end: esbuild bundles js/ into src/gpumemviz/static/ (git-ignored)
# when a js/ source (or the palette, src/gpumemviz/render/palette.json) is newer than the bundle. Nothing rebuilds it at import (gpumemviz.reporting.bundles only
# warns); wheels get it from the package build. npm installs js/'s dev tools (esbuild, and tsc
# for the type check `make test` runs) the first time, or when one is missing.
BUNDLE := src/gpumemviz/static/widget.js
JS_SOURCES := $(wildcard js/src/*.js) $(wildcard js/*.css) js/package.json src/gpumemviz/render/palette.json
JS_TOOLS := test -x js/node_modules/.bin/esbuild && test -x js/node_modules/.bin/tsc \
  || npm --prefix js ci --no-audit --no-fund

js: $(BUNDLE)

$(BUNDLE): $(JS_SOURCES)
	@$(JS_TOOLS)
	npm --prefix js run --silent build
	@touch src/gpumemviz/static/*

# Debian's Chromium for the browser tests (test tools cannot download browsers here).
system-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium (needs root)"; \
	  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }

# The docs' pictures (docs/panel.png, the README's, and every other tools/screenshots.py SHOTS),
# taken from the real panel in JupyterLab and Debian's Chromium; the kernel imports this checkout.
screenshots: $(STAMP) system-deps js
	PYTHONPATH=$(CURDIR)/src $(PY) tools/screenshots.py

# mypy: strict over src/gpumemviz ([tool.mypy] in pyproject.toml), cached in .mypy_cache
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(VENV)/bin/ruff format --check src tests benchmarks tools
	$(VENV)/bin/mypy

fmt: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks tools
	$(VENV)/bin/ruff check --fix src tests benchmarks tools

test: lint system-deps js
	@$(JS_TOOLS)
	cd js && npm run --silent typecheck && node --test test/
	$(PY) -m pytest -q -p no:cacheprovider -n auto --dist loadgroup --durations=15

# JupyterLab on the quickstart notebook, bound to 127.0.0.1; it prints the URL (with its token) to
# open. No browser is started where there is no display.
demo: $(STAMP) js
	$(VENV)/bin/gpumemviz demo

# Every benchmarks/*.py, each one's tables written into benchmarks/README.md (below its marker
# line, with the machine it ran on); BENCH_ARGS=--quick for a short run.
BENCH_ARGS ?=
bench: $(STAMP) js
	$(PY) benchmarks/_readme.py $(BENCH_ARGS)

# Fuzz every reader of untrusted input (pickle, JSON, torch dicts, the CLI) for FUZZ_SECONDS
# (default 600): half coverage-guided under atheris (installed into build/atheris, not the venv;
# skipped where it cannot install), half guarded structure-aware mutation. Reproducers of findings
# go to build/fuzz/. Exit 1 on a finding not yet reported.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	@test -d build/atheris/atheris || $(PY) -m pip install -q --disable-pip-version-check \
	  --target build/atheris atheris || echo "atheris did not install: mutation fuzzing only"
	PYTHONPATH=src:build/atheris $(PY) tools/fuzz.py --seconds $(FUZZ_SECONDS)

# Samplers on the simulated and a replayed real trace with the panel's per-frame work for
# SOAK_SECONDS (default 600): RSS, history bytes, threads, drift and errors checked; exit 1 on
# a violation.
SOAK_SECONDS ?= 600
soak: $(STAMP)
	PYTHONPATH=src $(PY) tools/soak.py --seconds $(SOAK_SECONDS)

clean:
	rm -rf $(VENV) build dist src/gpumemviz/static .pytest_cache .ruff_cache .mypy_cache
