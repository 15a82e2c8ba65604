# SPDX-License-Identifier: LGPL-3.0-only
"""The README and doc/architecture.rst stand alone and tell the truth about the code: no link
leaves the repository, every file they name exists, and the figures they quote are the code's."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

from flux_dws.core import actions, failing, lifecycle
from flux_dws.core.policy import Policy
from flux_dws.k8s.watch import ResourceWatch, WorkflowWatch
from flux_dws.service import dispatch

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "doc" / "architecture.rst"
JOBTAP = ROOT / "jobtap" / "dws-jobtap.h"  # the plugin's constants


def named_paths(text: str) -> set[str]:
    """Repository paths a document names: ``flux_dws/x.py``, `doc/y.rst`, [z](t/lib.sh)."""
    words = re.findall(r"`+([^`\s]+)`+", text) + re.findall(r"\]\(([^)\s]+)\)", text)
    top = {p.name for p in ROOT.iterdir()}
    return {w.rstrip("/") for w in words if "/" in w and w.split("/")[0] in top | {".", ".."}}


def test_the_readme_links_nothing_outside_the_repository():
    text = README.read_text(encoding="utf-8")
    assert not re.search(r"https?://", text)
    for path in named_paths(text):
        assert not path.startswith(".."), path
        assert (ROOT / path).exists(), path
    assert "doc/architecture.rst" in text


def test_the_readme_setup_is_two_commands_with_their_times():
    text = README.read_text(encoding="utf-8")
    setup = text[text.index("## Set-up") :]
    block = re.search(r"```sh\n(.*?)```", setup, re.DOTALL).group(1)
    assert len(block.strip().splitlines()) == 2
    prose = setup[setup.index("```", setup.index("```sh") + 3) :].split("\n## ")[0]
    assert len(re.findall(r"\b\d+(?:\.\d+)? (?:s|seconds|minutes?)\b", prose)) >= 2
    assert "/opt/flux" in prose and "sharness" in prose


def test_architecture_names_files_that_exist_and_every_action():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    paths = named_paths(text)
    assert len(paths) >= 20
    for path in paths:
        assert (ROOT / path).exists(), path
    for action in typing.get_args(actions.Action):
        assert f"``{action.__name__}``" in text, action.__name__
    assert "def decide(" in inspect.getsource(lifecycle)
    assert set(dispatch.HANDLERS) | dispatch.LOOP_ACTIONS == set(typing.get_args(actions.Action))


def test_architecture_names_every_module_and_package():
    paths = named_paths(ARCHITECTURE.read_text(encoding="utf-8"))
    package = ROOT / "flux_dws"
    parts = [p for p in package.glob("*.py") if not p.name.startswith("__")]
    parts += [p for p in package.iterdir() if (p / "__init__.py").exists()]
    for part in parts:
        name = str(part.relative_to(ROOT))
        assert name in paths, f"doc/architecture.rst does not name {name}"


def test_architecture_quotes_the_codes_figures():
    text = " ".join(ARCHITECTURE.read_text(encoding="utf-8").split())
    watch = inspect.signature(WorkflowWatch.__init__).parameters
    low = watch["watch_timeout"].default
    assert f"between {low} and {2 * low} seconds" in text
    assert "int(self._watch_timeout * (1 + random.random()))" in inspect.getsource(ResourceWatch)
    assert f"{watch['read_margin'].default:g} seconds longer" in text
    assert f"from {failing.RETRY_MIN:g} s doubling up to {failing.RETRY_MAX:g} s" in text
    assert f"every ``[dws] heartbeat`` ({Policy.heartbeat:g} s by default)" in text
    missed = re.search(r"#define MISSED_HEARTBEATS (\d+)", JOBTAP.read_text()).group(1)
    assert {"3": "three"}[missed] + " heartbeats" in text
