# SPDX-License-Identifier: LGPL-3.0-only
"""Small bases that import nothing else of flux-dws: durations, sizes, hostlists,
untrusted text, one-line usage errors and the event loop."""
