# SPDX-License-Identifier: LGPL-3.0-only
"""One-line usage errors for every ``flux dws`` command, in flux-core's ``flux-CMD`` form.

A usage error reads ``flux-dws COMMAND: what was wrong (see `flux dws COMMAND --help`)``,
on one line, with no usage dump; the caller prints it and exits 2.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

#: The program name errors start with (flux-core's commands say ``flux-jobs: ...``).
PROG = "flux-dws"


class UsageError(Exception):
    """Bad command-line usage; str() is the one line to print."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the command (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.replace(PROG, "flux dws", 1)
        raise UsageError(f"{self.prog}: {message} (see `{command} --help`)")
