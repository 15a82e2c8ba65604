# SPDX-License-Identifier: LGPL-3.0-only
"""flux-dws: run Flux jobs with DWS (near-node-flash) storage and user containers."""

__version__ = "0.1.0"
