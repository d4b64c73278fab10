"""scripts/gpu-check.sh, read on a machine without a GPU: each defect it puts back is one of
tests/support/faults.py and its check a `cuda` test that exists (a renamed test would otherwise show only
on a GPU, as a check that did not run); every fault is used by the script or by a CPU test; its
limits add up to less than the 8 minutes it promises; and its dry run says what would run."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from support import faults

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
PROMISED_S = 8 * 60


def _entries(array: str) -> list[tuple[str, str]]:
    text = SCRIPT.read_text(encoding="utf-8")
    body = re.search(rf"^{array}=\((.*?)^\)", text, re.S | re.M)
    assert body is not None, f"{array} is not in the script"
    pairs = re.findall(r'"([\w-]+) \$C::([\w\[\]-]+)"', body.group(1))
    assert pairs, f"{array} is empty"
    return pairs


def _cuda_tests() -> set[str]:
    tree = ast.parse((ROOT / "tests" / "device" / "test_cuda.py").read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_each_defect_put_back_names_a_fault_and_a_cuda_test() -> None:
    tests = _cuda_tests()
    for fault, test in _entries("FAULTS") + _entries("SANITIZER_FAULTS"):
        assert fault in faults.FAULTS, f"gpu-check puts back {fault}, which tests/support/faults.py does not have"
        assert test.split("[")[0] in tests, f"gpu-check runs {test}, which tests/device/test_cuda.py does not have"


def test_every_fault_is_checked_somewhere() -> None:
    used = {f for f, _t in _entries("FAULTS") + _entries("SANITIZER_FAULTS")}
    cpu = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("test_*.py"))
    for name in faults.FAULTS:
        assert name in used or f'"{name}"' in cpu, f"no check puts back {name}"


def test_the_limits_fit_in_the_time_promised() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    limits = {k: int(v) for k, v in re.findall(r"^(LIMIT_\w+)=\$\{\w+:-(\d+)\}", text, re.M)}
    total = sum(v for k, v in limits.items() if not k.endswith("FAULT"))
    total += limits["LIMIT_FAULT"] * len(_entries("FAULTS"))
    total += limits["LIMIT_SANITIZER_FAULT"] * len(_entries("SANITIZER_FAULTS"))
    assert total <= PROMISED_S - 5, f"the checks' limits add up to {total} s"


def test_a_dry_run_without_a_gpu_says_what_would_run() -> None:
    got = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        timeout=120,
    )
    lines = got.stdout.splitlines()
    assert got.returncode == 0, got.stdout + got.stderr
    assert any("defects put back: 7 runs" in line for line in lines), got.stdout
    assert lines[-1].endswith("nothing would run"), got.stdout
