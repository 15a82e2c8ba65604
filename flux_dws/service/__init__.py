# SPDX-License-Identifier: LGPL-3.0-only
"""The service shell: the event loop and the parts it is composed of."""
