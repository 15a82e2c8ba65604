# SPDX-License-Identifier: LGPL-3.0-only
"""ruff is part of the tests: the tree is lint-clean and formatted."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff")
    cmd = [exe] if exe else [sys.executable, "-m", "ruff"]
    return subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args", [("check", "."), ("format", "--check", ".")], ids=["check", "format"]
)
def test_ruff(args):
    result = ruff(*args)
    assert result.returncode == 0, result.stdout + result.stderr


#: What counts as a source file: code, build files and the scripts the tests and CI run.
SOURCE_SUFFIXES = (".py", ".c", ".h", ".sh", ".t")
SOURCE_NAMES = ("Makefile", "run")


def source_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the file list comes from git")
    paths = [ROOT / line for line in listed.stdout.splitlines()]
    return [
        p for p in paths if p.is_file() and (p.suffix in SOURCE_SUFFIXES or p.name in SOURCE_NAMES)
    ]


def test_every_source_file_carries_an_spdx_license_identifier():
    files = source_files()
    assert len(files) > 100
    missing = [
        str(p.relative_to(ROOT))
        for p in files
        if "SPDX-License-Identifier: LGPL-3.0-only" not in p.read_text(encoding="utf-8")[:1000]
    ]
    assert not missing
