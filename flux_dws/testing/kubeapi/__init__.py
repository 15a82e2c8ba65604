# SPDX-License-Identifier: LGPL-3.0-only
"""A Kubernetes API server for flux-dws's resources, over HTTP on 127.0.0.1 (tests only).

``Store`` holds the objects with Kubernetes semantics and can be used in-process (the DWS
simulator does); ``KubeApi`` serves a store over HTTP for the real ``kubernetes`` client and
``kubectl``, with discovery, watches, Table output and fault injection.

Over HTTP it behaves as kube-apiserver does wherever kubectl and the client can tell:
``dryRun=All`` stores nothing; /openapi/v3 (and JSON /openapi/v2) describe every served kind,
so kubectl validates (fieldValidation), explains and edits; server-side apply
(application/apply-patch+yaml) with field managers, managedFields and conflicts, and
managedFields for every other write; namespaces must exist (and deleting one deletes its
contents); lists page with ``limit``/``continue`` (410 once a token's version is compacted);
field selectors are limited to each kind's field labels; Tables carry each CRD's printer
columns (built-in printers for pods, secrets, events, namespaces); 422s carry their causes;
booleans and integers in queries are parsed as Go parses them; kinds whose CRD declares a
status subresource keep spec and status apart (``subresources`` routes others, e.g. logs).
In-process writes (the simulator's) neither record managedFields nor separate status.
"""

from __future__ import annotations

from .errors import ApiError
from .faults import Faults, FaultSettings
from .server import KubeApi
from .store import Store, Watch

__all__ = ["ApiError", "FaultSettings", "Faults", "KubeApi", "Store", "Watch"]
