# SPDX-License-Identifier: LGPL-3.0-only
"""How dwssim's NNF driver reads a workflow's directives: as nnf-sos does in Proposal."""

from __future__ import annotations

import re
from collections.abc import Sequence

from flux_dws.base.errors import DirectiveError
from flux_dws.core.directives import Directive, parse_directives

#: stands in for a directive that failed, so the rest of the job is read in context.
_PLACEHOLDER = "#DW Teardown action=wait"
_DIRECTIVE_INDEX = re.compile(r"^#DW directive (\d+)")


def read_directives(lines: Sequence[str]) -> dict[int, Directive | DirectiveError]:
    """The directives by index, read with flux-dws's grammar.

    The job is read as a whole, as nnf-sos validates it in Proposal.  When a directive
    fails, it keeps its error and a placeholder takes its place, so the others are still
    read in context (a container's storage keys name the job's jobdw directives).
    """
    lines = list(lines)
    found: dict[int, Directive | DirectiveError] = {}
    for _ in range(len(lines) + 1):
        try:
            parsed = parse_directives(lines) if lines else ()
        except DirectiveError as exc:
            match = _DIRECTIVE_INDEX.match(str(exc))
            bad = int(match.group(1)) if match else -1
            if not 0 <= bad < len(lines) or bad in found:
                for index in range(len(lines)):
                    found.setdefault(index, exc)
                break
            found[bad] = exc
            lines[bad] = _PLACEHOLDER
            continue
        if len(parsed) != len(lines):
            problem = DirectiveError("a dwDirectives entry holds more than one directive")
            found.update({i: problem for i in range(len(lines)) if i not in found})
        else:
            found.update({d.index: d for d in parsed if d.index not in found})
        break
    return found
