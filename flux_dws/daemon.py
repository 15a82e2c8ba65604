# SPDX-License-Identifier: LGPL-3.0-only
"""``python -m flux_dws.daemon``: the flux-dws service, exactly as ``flux dws service`` runs it.

An entry point only (the service lives in flux_dws.service): test harnesses and sites start
the service in a process of its own with it.
"""

import sys

from flux_dws.service.daemon import main

if __name__ == "__main__":
    sys.exit(main())
