"""A Kubernetes API server for flux-dws's resources, over HTTP on 127.0.0.1 (tests only).

``Store`` holds the objects with Kubernetes semantics and can be used in-process (the DWS
simulator does); ``KubeApi`` serves a store over HTTP for the real ``kubernetes`` client and
``kubectl``, with discovery, watches, Table output and fault injection.
"""

from __future__ import annotations

from .errors import ApiError
from .faults import Faults, FaultSettings
from .server import KubeApi
from .store import Store, Watch

__all__ = ["ApiError", "FaultSettings", "Faults", "KubeApi", "Store", "Watch"]
