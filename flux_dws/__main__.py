# SPDX-License-Identifier: LGPL-3.0-only
"""``python -m flux_dws``: the ``flux dws`` command line (see flux_dws.cli)."""

from __future__ import annotations

import sys

from flux_dws.cli import main

if __name__ == "__main__":
    sys.exit(main())
