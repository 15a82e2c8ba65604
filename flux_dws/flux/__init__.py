# SPDX-License-Identifier: LGPL-3.0-only
"""The only code that talks to Flux: the protocol with the dws jobtap plugin."""
