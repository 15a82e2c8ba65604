# SPDX-License-Identifier: LGPL-3.0-only
"""Where ``flux dws`` commands read from: a real Flux instance, or a Stack in tests/simulate.

A source gives four things: a job's eventlog, the jobs the dws jobtap plugin holds
(``job-manager.dws.list``), the instance owner, and a KubeClient for this instance's
workflows.  Each call is bounded (RPC timeout; the KubeClient's own per-request timeout and
retry limit) and fails with one line.  FluxSource alone also submits jobs and waits for them
to end (``flux dws persistent create|destroy``).
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from flux_dws.base import untrusted
from flux_dws.base.errors import DwsError
from flux_dws.base.jobid import f58
from flux_dws.core.policy import Policy, policy_from_table
from flux_dws.flux.bindings import FluxUnavailable, import_flux, run_under_flux_hint
from flux_dws.k8s import KubeClient

#: Seconds any one Flux RPC may take before the command gives up on it.
RPC_TIMEOUT = 10.0
#: Per-request timeout and retries for the command's Kubernetes calls: a person is waiting.
KUBE_TIMEOUT = 5.0
KUBE_RETRIES = 1


class SourceError(DwsError):
    """A source could not answer; str() is the one line shown after ``flux dws CMD:``."""


class Source(Protocol):
    identity: str
    policy: Policy

    def eventlog(self, jobid: int) -> list[dict[str, Any]]:
        """The job's main eventlog, oldest first; SourceError for an unknown job."""

    def plugin_list(self) -> dict[str, Any]:
        """The plugin's whole ``list`` answer: ``jobs`` and ``service`` (doc/protocol.rst)."""

    def held_jobs(self) -> list[dict[str, Any]]:
        """The dws plugin's records of the jobs it holds (doc/protocol.rst)."""

    def saved(self, jobid: int, key: str) -> Any:
        """A JSON value flux-dws saved in the job's KVS directory, or None if there is none;
        SourceError when the caller may not read it (only the job's owner and the instance
        owner may)."""

    def owner(self) -> int:
        """The uid of the instance owner (flux-core's ``security.owner``)."""

    def kube(self) -> KubeClient:
        """A KubeClient for this instance's workflows, connected on first use."""

    def close(self) -> None: ...


def user_name(uid: int) -> str:
    """The login name of ``uid``, or the number when the system does not know it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def user_id(text: str) -> int:
    """A user given by name or number; SourceError names an unknown one."""
    if (uid := untrusted.decimal(text)) is not None:
        return uid
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise SourceError(f"unknown user {text!r}") from None


class _KubeMixin:
    identity: str
    policy: Policy
    _kubeconfig: str | None
    _kube: KubeClient | None = None

    def kube(self) -> KubeClient:
        if self._kube is None:
            self._kube = KubeClient.connect(
                namespace=self.policy.namespace,
                identity=self.identity,
                kubeconfig=self._kubeconfig,
                workflow_version=self.policy.workflow_version,
                nnf_version=self.policy.nnf_version,
                timeout=KUBE_TIMEOUT,
                retries=KUBE_RETRIES,
            )
        return self._kube

    def close(self) -> None:
        if self._kube is not None:
            self._kube.close()
            self._kube = None


# --------------------------------------------------------------------------- real Flux


def flux_drains(environ: Mapping[str, str], timeout: float = RPC_TIMEOUT) -> dict[str, str]:
    """host -> reason of every node the Flux instance in FLUX_URI has drained (its
    ``resource.status``, as the service reads it); SourceError in one line when it cannot say.

    Needs neither the dws plugin nor the instance's [dws] table: any user may read it."""
    from flux_dws.flux.resource import expand_nodelist, parse_resource_status

    problem = flux_uri_problem(environ)
    if problem:
        raise SourceError(problem)
    try:
        flux = import_flux(environ)
    except FluxUnavailable as exc:
        raise SourceError(str(exc)) from None
    try:
        handle = flux.Flux(environ["FLUX_URI"])
        response = handle.rpc("resource.status", {}).wait_for(timeout).get() or {}
    except OSError as exc:
        if exc.errno == errno.ETIMEDOUT:
            raise SourceError(f"no answer from resource.status in {timeout:g}s") from None
        raise SourceError(f"resource.status: {exc.strerror or exc}") from None
    try:
        return parse_resource_status(response, expand_nodelist).drained_hosts()
    except (ValueError, TypeError, AttributeError) as exc:
        raise SourceError(f"resource.status: unreadable answer: {exc}") from None


def flux_uri_problem(environ: Mapping[str, str]) -> str | None:
    """Why the commands cannot reach a Flux instance, or None if they may try."""
    if not environ.get("FLUX_URI"):
        return "not running under a Flux instance (FLUX_URI is not set)"
    return None


class FluxSource(_KubeMixin):
    """The Flux instance in FLUX_URI: flux-core's Python bindings, imported only here."""

    def __init__(
        self,
        timeout: float = RPC_TIMEOUT,
        command: str = "flux dws ...",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        environ = os.environ if environ is None else environ
        try:
            flux = import_flux(environ)
        except FluxUnavailable as exc:
            raise SourceError(f"{exc}{run_under_flux_hint(command, environ)}") from None
        import flux.job  # noqa: F401 (its job API, for submit and wait_inactive)

        from flux_dws.service.daemon import instance_identity

        self.timeout = timeout
        self._flux = flux
        uri = environ.get("FLUX_URI")  # the instance this environment names
        try:
            self.handle = flux.Flux(uri) if uri else flux.Flux()
        except OSError as exc:
            raise SourceError(
                f"cannot connect to the Flux instance: {exc.strerror or exc}"
            ) from None
        try:
            self.policy = policy_from_table(self.handle.conf_get("dws") or {})
            self.identity = instance_identity(self.handle, self.policy)
        except OSError as exc:
            raise SourceError(f"cannot read the instance's [dws] config: {exc.strerror}") from None
        except ValueError as exc:  # PolicyError, invalid identity
            raise SourceError(str(exc)) from None
        self._kubeconfig = self.policy.kubeconfig

    def _rpc(self, topic: str, payload: Mapping[str, Any], what: str) -> dict[str, Any]:
        try:
            return self.handle.rpc(topic, dict(payload)).wait_for(self.timeout).get() or {}
        except OSError as exc:
            if exc.errno == errno.ETIMEDOUT:
                raise SourceError(f"{what}: no answer from {topic} in {self.timeout:g}s") from None
            if exc.errno == errno.EPERM:
                raise SourceError(f"{what}: permission denied (instance owner only)") from None
            if exc.errno == errno.ENOSYS:
                raise SourceError(
                    f"{what}: {topic} is not served (is the plugin loaded?)"
                ) from None
            raise SourceError(f"{what}: {exc.strerror or exc}") from None

    def eventlog(self, jobid: int) -> list[dict[str, Any]]:
        payload = {"id": jobid, "keys": ["eventlog"], "flags": 0}
        try:
            response = self.handle.rpc("job-info.lookup", payload).wait_for(self.timeout).get()
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise SourceError(f"job {f58(jobid)} not found") from None
            if exc.errno == errno.EPERM:
                raise SourceError(f"job {f58(jobid)}: not your job") from None
            raise SourceError(f"job {f58(jobid)}: {exc.strerror or exc}") from None
        text = (response or {}).get("eventlog") or ""
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise SourceError(f"job {f58(jobid)}: unreadable eventlog: {exc}") from None

    def held_jobs(self) -> list[dict[str, Any]]:
        return list(self.plugin_list().get("jobs") or [])

    def plugin_list(self) -> dict[str, Any]:
        return self._rpc("job-manager.dws.list", {}, "dws plugin")

    def owner(self) -> int:
        try:
            return int(self.handle.attr_get("security.owner"))
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise SourceError(f"cannot read the instance owner: {reason}") from None

    def submit(self, command: list[str], attributes: Mapping[str, Any]) -> int:
        """A one-node job running ``command`` with these ``system`` attributes, submitted as
        the person running this (bounded by the RPC timeout); SourceError says why Flux (the
        validator, a jobtap plugin) would not take it."""
        spec = self._flux.job.JobspecV1.from_command(command, num_nodes=1, num_tasks=1)
        for key, value in attributes.items():
            spec.setattr(f"system.{key}", value)
        try:
            future = self._flux.job.submit_async(self.handle, spec)
            return int(future.wait_for(self.timeout).get_id())
        except OSError as exc:
            if exc.errno == errno.ETIMEDOUT:
                raise SourceError(f"no answer to the job submission in {self.timeout:g}s") from None
            raise SourceError(f"the job was refused: {exc.strerror or exc}") from None

    def wait_inactive(self, jobid: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the job's ``clean`` event (it is inactive):
        False if it has not come by then.  A job's exceptions do not end the wait (its
        eventlog says how it ended)."""
        deadline = time.monotonic() + timeout
        watch = self._flux.job.event_watch_async(self.handle, jobid)
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    event = watch.wait_for(remaining).get_event()
                except OSError as exc:
                    if exc.errno == errno.ETIMEDOUT:
                        return False
                    raise SourceError(f"job {f58(jobid)}: {exc.strerror or exc}") from None
                if event is None or event.name == "clean":  # None: the eventlog ended
                    return True
            return False
        finally:
            if watch.needs_cancel:
                watch.cancel()

    def saved(self, jobid: int, key: str) -> Any:
        payload = {"id": jobid, "keys": [key], "flags": 0}
        try:
            response = self.handle.rpc("job-info.lookup", payload).wait_for(self.timeout).get()
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            if exc.errno == errno.EPERM:
                raise SourceError(f"job {f58(jobid)}: not your job") from None
            raise SourceError(f"job {f58(jobid)}: {key}: {exc.strerror or exc}") from None
        return _json((response or {}).get(key), jobid, key)


# --------------------------------------------------------------------------- Stack


class StackSource(_KubeMixin):
    """A running flux_dws.testing.stack.Stack, read as the commands read a real instance."""

    def __init__(self, stack: Any, timeout: float = RPC_TIMEOUT) -> None:
        self.stack = stack
        self.policy = stack.policy
        self.identity = stack.identity
        self.timeout = timeout
        self._kubeconfig = stack.kubeconfig

    def eventlog(self, jobid: int) -> list[dict[str, Any]]:
        try:
            return list(self.stack.flux.info(jobid).eventlog)
        except OSError:
            raise SourceError(f"job {f58(jobid)} not found") from None

    def saved(self, jobid: int, key: str) -> Any:
        try:
            return _json(self.stack.saved(jobid, key, userid=os.getuid()), jobid, key)
        except FileNotFoundError:
            return None
        except PermissionError:
            raise SourceError(f"job {f58(jobid)}: not your job") from None

    def held_jobs(self) -> list[dict[str, Any]]:
        return list(self.plugin_list().get("jobs") or [])

    def owner(self) -> int:
        return int(self.stack.owner_uid)

    def plugin_list(self) -> dict[str, Any]:
        """The plugin's ``list`` answer, on a connection of our own."""
        from flux_dws.base.loop import Loop

        connect = getattr(self.stack.flux, "connect", None)
        if connect is None:
            raise SourceError("this stack's job-manager takes no client connections")
        loop = Loop(name="flux-dws-cli").start_thread()
        done = threading.Event()
        box: dict[str, Any] = {}

        def answered(response: Any, error: Any) -> None:
            box.update(response=response, error=error)
            done.set()

        connection = connect(loop)
        try:
            connection.rpc("list", {}, answered)
            if not done.wait(self.timeout):
                raise SourceError(f"dws plugin: no answer to list in {self.timeout:g}s")
        finally:
            connection.close()
            loop.stop()
            loop.join(5)
        if box["error"] is not None:
            raise SourceError(f"dws plugin: {box['error']}")
        return dict(box["response"] or {})


def _json(text: Any, jobid: int, key: str) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise SourceError(f"job {f58(jobid)}: {key} is not readable JSON") from None
