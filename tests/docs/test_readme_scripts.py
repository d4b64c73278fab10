"""The README's example runs as written, on a tiny sharded Llama put in place of the demo's
folder; the site's pages are run by test_docs_examples.py the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.doc_examples import ROOT, page_blocks, run_blocks
from support.hf_folders import make_llama

pytest.importorskip("transformers")

README = ROOT / "README.md"


def test_readme_example(tmp_path: Path) -> None:
    blocks = page_blocks(README)
    assert len(blocks) == 1 and blocks[0].skip is None, blocks
    assert '"target/demo-llama-6gb"' in blocks[0].code
    folder = make_llama(tmp_path / "llama", 4)
    work = tmp_path / "work"
    work.mkdir()
    r = run_blocks(blocks, work, {'"target/demo-llama-6gb"': folder})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # One line from generate() and one from the transformers pipeline, both continuing the prompt.
    assert len(lines) == 2 and all("The raccoon" in line for line in lines), r.stdout
