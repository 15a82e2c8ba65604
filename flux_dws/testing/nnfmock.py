# SPDX-License-Identifier: LGPL-3.0-only
"""Where nnf-sos's kind mode differs from a real system in a way the tests must not inherit.

nnf-sos runs here as its kind deployment does (flux_dws.testing.nnfsos.NnfSos), and kind mode
gives every rabbit the same LNet address, ``1.2.3.4@tcp`` (nnf_node_controller.go; a real
rabbit's comes from ``lctl list_nids``).  nnf-sos finds a Lustre file system's MGT by its
rabbit's address (nnf_storage_controller.go, getLustreMgt), so with one address for all, any
two Lustre jobs alive at once fail ("multiple MGTs found for address 1.2.3.4@tcp") whatever
rabbits hold their MGTs.  The stack gives each rabbit an address of its own instead, as a
site's rabbits have, by rewriting the one nnf-sos writes into its NnfNode (the only place it
is read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The LNet address nnf-sos gives every rabbit in kind mode.
KIND_NID = "1.2.3.4@tcp"


def rabbit_nids(rabbits: Sequence[str]) -> dict[str, str]:
    """An LNet address for each rabbit, as its own ``lctl list_nids`` would say."""
    return {rabbit: f"10.0.{i // 250}.{i % 250 + 1}@tcp" for i, rabbit in enumerate(rabbits)}


def own_nids(store: Any, rabbits: Sequence[str]) -> dict[str, str]:
    """Have kubeapi's ``store`` keep each rabbit's NnfNode (``nnf-nlc`` in the rabbit's
    namespace) at the rabbit's own address; returns them.  Writing kind's address again is
    then a write that changes nothing, so nnf-sos's node controller is not woken by it."""
    nids = rabbit_nids(rabbits)

    def own(operation: str, old: dict | None, new: dict) -> dict:
        rabbit = (new.get("metadata") or {}).get("namespace")
        status = new.get("status")
        if isinstance(status, dict) and status.get("lnetNid") == KIND_NID and rabbit in nids:
            status["lnetNid"] = nids[rabbit]
        return new

    store.add_admission("nnfnodes", own)
    return nids
