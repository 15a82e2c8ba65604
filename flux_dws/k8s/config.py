# SPDX-License-Identifier: LGPL-3.0-only
"""Where flux-dws's Kubernetes credentials come from, and how often their token is re-read."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from flux_dws.k8s.errors import KubeSetupError


def load_configuration(kubeconfig: str | None) -> k8s.Configuration:
    """Credentials from the policy's kubeconfig, else in-cluster, else the default kubeconfig."""
    cfg = k8s.Configuration()
    if kubeconfig:
        source = f"kubeconfig {kubeconfig}"
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        source = "the in-cluster service account"
    else:
        source = "the default kubeconfig"
    try:
        if kubeconfig:
            k8s_config.load_kube_config(
                config_file=kubeconfig, client_configuration=cfg, persist_config=False
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            k8s_config.load_kube_config(client_configuration=cfg, persist_config=False)
    except Exception as exc:  # the loaders raise many types; all mean "no usable credentials"
        raise KubeSetupError(f"cannot load Kubernetes credentials from {source}: {exc}") from exc
    cfg.retries = False  # we retry ourselves, so that every attempt is counted and logged
    cfg.connection_pool_maxsize = 32
    if cfg.refresh_api_key_hook is not None:
        cfg.refresh_api_key_hook = _AtMostEvery(TOKEN_CHECK_INTERVAL, cfg.refresh_api_key_hook)
    return cfg


#: How often the loaders' token hook runs (it re-reads an expiring token).  The client calls
#: it before every request, and each call re-applies the whole configuration, host and proxy
#: environment included: a quarter of a patch's CPU time for a token that rarely changes.
TOKEN_CHECK_INTERVAL = 1.0


class _AtMostEvery:
    """Call ``hook(configuration)`` at most once per ``interval`` seconds (thread-safe).

    The loaders' hook installs a fresh copy of itself each time it runs: take that one as the
    hook to call next time, and stay in its place.
    """

    def __init__(self, interval: float, hook: Callable[[Any], None]) -> None:
        self.interval, self.hook = interval, hook
        self._last = float("-inf")
        self._lock = threading.Lock()

    def __call__(self, configuration: Any) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.interval:
                return
            self._last = now
            self.hook(configuration)
            installed = configuration.refresh_api_key_hook
            if installed is not self and installed is not None:
                self.hook = installed
            configuration.refresh_api_key_hook = self
