"""The README's "Use with transformers" and "Use with diffusers" scripts run as written, on tiny
sharded folders put in place of the path on their ``folder = ...`` line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import trash_panda
from hf_folders import make_llama, make_sd

pytest.importorskip("transformers")
pytest.importorskip("diffusers")

README = Path(__file__).resolve().parent.parent / "README.md"


def _script(section: str, folder: Path) -> str:
    text = README.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", body, re.S)
    assert code is not None, section
    script, n = re.subn(r'^folder = "[^"]*"', f"folder = {str(folder)!r}", code.group(1), flags=re.M)
    assert n == 1, script
    return script


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(trash_panda.__file__).parent.parent)}
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_use_with_transformers(tmp_path: Path) -> None:
    folder = make_llama(tmp_path / "llama", 4)
    r = _run(_script("Use with transformers", folder), tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all("The raccoon" in line for line in lines), r.stdout


def test_use_with_diffusers(tmp_path: Path) -> None:
    folder = make_sd(tmp_path / "sd")
    r = _run(_script("Use with diffusers", folder), tmp_path)
    assert r.returncode == 0, r.stderr
    from PIL import Image

    assert Image.open(tmp_path / "raccoon.png").size == (16, 16)
