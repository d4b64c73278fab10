# The two commands of the README:
#   make demo   set up (.venv, build) and run the main job
#   make test   set up, then every check: Rust tests, lints, Python tests, stub check, the site
# .venv links to an environment cached under ~/.cache/trash-panda, keyed by the pinned
# requirements, so a fresh clone does not download torch again.

VENV := .venv
PY := $(VENV)/bin/python
CARGO ?= cargo
export PYTHONDONTWRITEBYTECODE := 1
# The package is used in place from python/, with the extension built next to it, so several
# checkouts can share the cached environment without installing into it.
export PYTHONPATH := $(CURDIR)/python
EXT := python/trash_panda/_core.abi3.so

.PHONY: demo test venv docs-venv ext build docs rust-test lint py-test stubs cross fmt bench-read bench-convert bench-dequant bench-neon-model bench-avx2-model bench-stage bench-fill bench-stream bench-peers bench-pipeline clean

venv:
	@bash scripts/venv.sh

# The extension is built in release mode: the kernels and readers are what tests exercise.
# (`pip install .` builds the same crate through maturin, for users.)
ext:
	$(CARGO) build --release -p trash-panda-python
	@# A new file, not one written over: a process that has the old one loaded keeps it intact.
	cp target/release/lib_core.so $(EXT).tmp && mv -f $(EXT).tmp $(EXT)

build: venv ext
	@$(PY) -c "import trash_panda; print('trash_panda', trash_panda.__version__, 'from', trash_panda.__file__)"

# The main job on an embedded 6 GB model (made once under target/), or ARGS="--model FOLDER ...".
demo: build
	$(PY) examples/demo.py $(ARGS)

rust-test:
	$(CARGO) test --workspace --exclude trash-panda-python

PYFILES := python tests bench examples scripts

lint: venv
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(PY) -m ruff check $(PYFILES)
	$(PY) -m ruff format --check $(PYFILES)

# Formats the Rust and the Python code in place.
fmt: venv
	$(CARGO) fmt --all
	$(PY) -m ruff check --fix $(PYFILES)
	$(PY) -m ruff format $(PYFILES)

py-test: build
	$(PY) -m pytest -q tests

stubs: build
	$(PY) -m mypy.stubtest trash_panda._core
	$(PY) -m mypy
	$(PY) -m mypy --config-file bench/mypy.ini

# Windows, macOS and Arm: clippy for both, the core's and the CLI's tests under Wine, the Windows
# exe against the Linux binary, the Windows wheel, the core's dtype tests for aarch64 Linux under
# QEMU (scripts/cross.sh says what it skips and why).
cross: venv
	@bash scripts/cross.sh

# The site's generator has an environment of its own (requirements-docs.txt, no torch).
docs-venv:
	@bash scripts/venv.sh docs

# The documentation site, to target/site/ (mkdocs.yml). Strict: a broken link or anchor, a page
# left out of the nav or an API name mkdocstrings cannot find fails it. The settings page is
# made from the core's table through the extension, so the extension is built first.
# Then the core's Rust API reference (a few seconds once the crate has been checked), copied into
# the site under rust/; as strict: a broken intra-doc link or bad HTML in a doc comment fails it.
docs: docs-venv ext
	NO_MKDOCS_2_WARNING=1 PYTHONPATH= .venv-docs/bin/python -m mkdocs build --strict
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -p trash-panda --no-deps
	rm -rf target/site/rust && cp -r target/doc target/site/rust

test: rust-test lint docs py-test stubs cross

bench-read:
	$(CARGO) run --release -p trash-panda-bench --bin bench-read

bench-convert:
	$(CARGO) run --release -p trash-panda-bench --bin bench-convert

bench-dequant:
	$(CARGO) run --release -p trash-panda-bench --bin bench-dequant

# The NEON and AVX2 kernels' inner loops through llvm-mca's models of Arm cores and of x86
# cores without AVX-512, for want of those machines (bench/loop_model.py; ARGS="--against REV"
# models a commit beside this tree).
LLVM_MCA := command -v llvm-mca-19 >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q llvm-19 >/dev/null; }

bench-neon-model: venv
	@$(LLVM_MCA)
	@rustup target add aarch64-unknown-linux-gnu >/dev/null
	$(PY) bench/loop_model.py neon $(ARGS)

bench-avx2-model: venv
	@$(LLVM_MCA)
	@rustup target add x86_64-unknown-linux-gnu >/dev/null
	$(PY) bench/loop_model.py avx2 $(ARGS)

bench-fill:
	$(CARGO) run --release -p trash-panda-bench --bin bench-fill

bench-stage:
	$(CARGO) run --release -p trash-panda-bench --bin bench-stage

# The streaming benchmarks write checkpoints of 6 to 8 GB under target/bench-data.
bench-stream: build
	$(PY) bench/stream_load_rss.py
	$(PY) bench/forward_disk.py
	$(PY) bench/peers_disk.py

# trash-panda against transformers, accelerate and diffusers on the demo's 6 GB model (about 10 min).
bench-peers: build
	$(PY) bench/peers/run.py
	$(PY) bench/peers/report.py

# The pipeline runner against stage(), plain torch and diffusers' offloading: four models of 4 GB
# in all under a 2.4 GB RAM budget, written once under target/bench-data (about 8 min).
bench-pipeline: build
	$(PY) bench/pipeline.py $(ARGS)

clean:
	$(CARGO) clean
	rm -f $(VENV) .venv-docs
