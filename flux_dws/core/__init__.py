# SPDX-License-Identifier: LGPL-3.0-only
"""The pure core: every decision flux-dws makes, and the data it decides on.  No I/O."""
