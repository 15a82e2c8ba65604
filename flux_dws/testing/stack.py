# SPDX-License-Identifier: LGPL-3.0-only
"""A whole flux-dws world: kubeapi + dwssim + fakeflux (or real Flux) + the real service.

Scenario tests, benchmarks and ``flux dws simulate`` all use this, so there is one way to put
the pieces together.  The service talks HTTP to kubeapi with the real ``kubernetes`` client
and speaks doc/protocol.rst to fakeflux; only the job-manager and the DWS controllers are
stand-ins.  By default everything runs in this process; ``api_process`` puts kubeapi + dwssim
in a process of their own, and ``service_process`` the service (over a Unix socket to
fakeflux, flux_dws.testing.fakeflux.remote), as under real Flux.  ``kill_service()`` drops
the service the way SIGKILL would (no goodbyes), and ``start_service()`` starts a fresh one
that must pick up where the last stopped.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flux_dws.base.loop import Loop
from flux_dws.core.identity import instance_selector, workflow_name
from flux_dws.core.policy import Policy, policy_from_table
from flux_dws.core.request import validate_attributes
from flux_dws.core.states import State
from flux_dws.flux.jobmanager import JobManager
from flux_dws.k8s import KubeClient
from flux_dws.service.service import Service
from flux_dws.testing.dwssim import DwsSim, compute_names, seed
from flux_dws.testing.dwssim.computemounts import ComputeMounts
from flux_dws.testing.dwssim.faults import set_rabbit_status
from flux_dws.testing.fakeflux import FakeFlux, JobInfo
from flux_dws.testing.kubeapi import ApiError, KubeApi, Store
from flux_dws.testing.kubeapi.admission import deny

log = logging.getLogger("flux-dws.testing.stack")


class Stack:
    """Start with ``start()`` (or ``with Stack() as stack``); see the module docstring."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        hosts: int = 16,
        delays: float | Mapping[State | str, float] = 0.0,
        time_scale: float = 0.01,
        identity: str = "test",
        seed: int = 0,
        api_process: bool = False,
        service_process: bool = False,
        backend: str = "fake",
        realflux: Mapping[str, Any] | None = None,
        rabbits: Mapping[str, Sequence[str]] | None = None,
        capacity: int | None = None,
        system_storage: Mapping[str, int] | None = None,
        dws: str = "sim",
        nnf: str = "sim",
        webhook: str = "port",
        external: Sequence[str] = (),
    ) -> None:
        table = {"instance": identity, **(config or {})}
        self.policy: Policy = policy_from_table(table)
        self.table = table
        if backend not in ("fake", "flux"):
            raise ValueError(f"backend must be 'fake' or 'flux', not {backend!r}")
        self.backend = backend
        if dws not in ("sim", "real"):
            raise ValueError(f"dws must be 'sim' or 'real', not {dws!r}")
        # "real": HPE's DWS manager and DWS's test driver (flux_dws.testing.realdws) run the
        # workflows, and dwssim plays only nnf-sos's driver beside them.
        self.dws = dws
        self.real_dws: Any = None
        if nnf not in ("sim", "sos") or (nnf == "sos" and dws != "real"):
            raise ValueError(f"nnf must be 'sim', or 'sos' with dws='real', not {nnf!r}")
        # "sos": nnf-sos (nnfsos.NnfSos, mock hardware) is the NNF driver beside the real DWS,
        # on a kubeapi serving DWS's and nnf-sos's own CRDs; dwssim does not run.
        self.nnf = nnf
        self.nnf_sos: Any = None
        self.compute_mounts: Any = None  # dwssim's clientmountd on the computes (nnf="sos")
        self.data_mover: Any = None  # dwssim's nnf-dm (nnf="sos")
        self.workloads: Any = None  # dwssim's Job controller, MPI operator, kubelets (nnf="sos")
        self._serving: Any = None  # the CRD kinds served while this stack runs (nnf="sos")
        if webhook not in ("port", "real"):
            raise ValueError(f"webhook must be 'port' or 'real', not {webhook!r}")
        # "real": DWS's own admission webhooks (realdws.RealWebhook, over HTTPS) decide what
        # kubeapi admits, in place of kubeapi's Python port of them.
        self.webhook = webhook
        self.real_webhook: Any = None
        self.realflux_options = dict(realflux or {})  # RealFlux keywords (persist, broker_env)
        self.identity = identity
        self.hosts = compute_names(hosts)
        # Which compute nodes each rabbit serves (None: 16 to a rabbit, seed's default), and
        # each rabbit's Storage capacity in bytes.  With real Flux and Fluxion installed, the
        # instance's R holds these rabbits (flux_dws.core.rabbits.resource_graph).
        self.rabbits = None if rabbits is None else {r: list(c) for r, c in rabbits.items()}
        # Hosts no rabbit serves: the SystemConfiguration's externalComputeNodes.
        self.external = list(external)
        self.capacity = capacity
        # rabbit -> bytes of system storage made before the instance's graph (outside the WLM)
        self.system_storage = dict(system_storage or {})
        self.api_process = api_process
        self.service_process = service_process and backend == "fake"
        self._process: subprocess.Popen[str] | None = None
        self._service_process: subprocess.Popen[str] | None = None
        self._server: Any = None  # FakeFluxServer, with service_process
        self.delays = delays
        self.time_scale = time_scale
        self.seed = seed
        self.owner_uid = os.getuid()
        self._tmp = tempfile.TemporaryDirectory(prefix="flux-dws-")
        self.kubeconfig = os.path.join(self._tmp.name, "kubeconfig")
        self.api: KubeApi | None = None
        self.sim: DwsSim | None = None
        self.flux: Any = None  # FakeFlux, or RealFlux (flux_dws.testing.realflux)
        self.service: Service | None = None
        self.loop: Loop | None = None
        self._connection: Any = None
        self.restarts = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Stack:
        """Start every piece; if one fails (or Ctrl-C), those already started are stopped."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> Stack:
        if self.api_process:
            self._start_api_process()
        else:
            if self.nnf == "sos":
                self._serve_crds()
            store = Store(webhooks=self.webhook == "port")
            self.api = KubeApi(store=store, seed=self.seed).start()
            self.api.write_kubeconfig(self.kubeconfig)
            if self.webhook == "real":
                self._start_real_webhook()
            extra = {} if self.capacity is None else {"capacity": self.capacity}
            attached = [h for h in self.hosts if h not in self.external]
            self.rabbits = seed(
                self.api.store,
                computes=attached,
                rabbits=self.rabbits,
                external=self.external,
                storages=self.nnf == "sim",
                **extra,
            )
            if self.dws == "real":
                from flux_dws.testing.realdws import RealDws

                self.real_dws = RealDws(self.kubeconfig, self._tmp.name)
                self.real_dws.start()
            if self.nnf == "sos":
                self._start_nnf_sos()
        if self.nnf == "sim" and self.api is not None:
            # Beside the real DWS, dwssim plays only nnf-sos's driver (its NNF entries).
            self.sim = DwsSim(
                self.api.store,
                delays=self.delays,
                time_scale=self.time_scale,
                seed=self.seed,
                workflow_controller=self.dws != "real",
            ).start()
            for rabbit, size in sorted(self.system_storage.items()):
                self.sim.add_outside_storage(f"system-{rabbit}", rabbit, size)
        if self.backend == "flux":
            from flux_dws.testing.realflux import RealFlux

            table = {**self.table, "kubeconfig": self.kubeconfig}
            self.flux = RealFlux(self.hosts, table, R=self._rabbit_R(), **self.realflux_options)
            self.flux.start()  # assigned first: a start that fails is still stopped
        else:
            self.flux = FakeFlux(
                self.hosts, owner_uid=self.owner_uid, validator=self.validate
            ).start()
            if self.service_process:
                from flux_dws.testing.fakeflux.remote import FakeFluxServer

                path = os.path.join(self._tmp.name, "fakeflux.sock")
                self._server = FakeFluxServer(self.flux, path).start()
        self.start_service()
        return self

    def _serve_crds(self) -> None:
        """Serve DWS's and nnf-sos's kinds from their CRD manifests until stop()."""
        import contextlib

        from flux_dws.testing.kubeapi import crds, resources
        from flux_dws.testing.realdws import crd_dirs

        self._serving = contextlib.ExitStack()
        self._serving.enter_context(resources.serving(crds.load(crd_dirs())))

    def _start_nnf_sos(self) -> None:
        """nnf-sos beside the real DWS: what a deployment has before it (the rabbits' k8s
        Nodes, Ready; its profiles), then its storage controller and a node controller per
        rabbit, on mock hardware."""
        from flux_dws.testing.dwssim.datamovement import DataMover
        from flux_dws.testing.dwssim.workloads import Workloads
        from flux_dws.testing.nnfsos import (
            NnfSos,
            data_movement_manager,
            prepare_deployment,
            wait_for_storage,
        )

        assert self.api is not None and self.rabbits is not None
        prepare_deployment(self.api.store, list(self.rabbits))
        self.nnf_sos = NnfSos(self.kubeconfig, self._tmp.name, list(self.rabbits))
        self.nnf_sos.start()
        # the service starts on a system whose rabbits are up, as a site's would
        wait_for_storage(self.api.store, list(self.rabbits), self.nnf_sos.running)
        # nnf-sos's clientmountd runs on each compute node (not here): dwssim plays it.
        self.compute_mounts = ComputeMounts(self.api.store, self.hosts).start()
        # nnf-dm (not built) moves the data of the NnfDataMovements nnf-sos makes: dwssim
        # plays it, beside the manager object its deployment makes.
        self.api.store.create("nnfdatamovementmanagers", "nnf-dm-system", data_movement_manager())
        self.data_mover = DataMover(self.api.store).start()
        # No kubelet or Job controller runs here: dwssim runs the container Jobs and MPIJobs
        # nnf-sos makes, their pods and the containers' logs.
        self.workloads = Workloads(self.api.store, self.time_scale).start()

    def _start_real_webhook(self) -> None:
        from flux_dws.testing.kubeapi.admission import register_remote_webhooks
        from flux_dws.testing.realdws import RealWebhook, install_rulesets

        assert self.api is not None
        install_rulesets(self.api.store, self.policy.namespace)
        self.real_webhook = RealWebhook(self.kubeconfig, self._tmp.name, self.policy.namespace)
        self.real_webhook.start()
        register_remote_webhooks(self.api.store, self.real_webhook.webhooks())

    def _rabbit_R(self) -> dict[str, Any] | None:
        """The instance's R with the rabbits, for Fluxion; None without rabbits or Fluxion."""
        from flux_dws.testing.fluxsetup import fluxion_installed, plain_R

        if self.rabbits is None or self.api is None or not fluxion_installed():
            return None
        from flux_dws.core.rabbits import rabbit_inventory, resource_graph

        config = self.api.store.get("systemconfigurations", "default", "default")
        storages, _ = self.api.store.list("storages", "default")
        servers, _ = self.api.store.list("servers", None)
        return resource_graph(plain_R(self.hosts), rabbit_inventory(config, storages, servers))

    def _start_api_process(self) -> None:
        """kubeapi + dwssim in a process of their own, as a real API server would be."""
        cmd = [sys.executable, "-m", "flux_dws.testing.dwssim", "--kubeconfig", self.kubeconfig]
        cmd += ["--computes", str(len(self.hosts)), "--time-scale", str(self.time_scale)]
        if isinstance(self.delays, Mapping):
            for state, seconds in self.delays.items():
                cmd += [
                    "--delay",
                    f"{State.parse(str(getattr(state, 'value', state))).value}={seconds}",
                ]
        elif self.delays:
            cmd += [f"--delay={s.value}={self.delays}" for s in State]
        else:
            cmd.append("--no-delays")
        self._process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self._process.stdout is not None
        for _ in range(2):  # the URL, then the kubeconfig path
            if not self._process.stdout.readline():
                raise RuntimeError(f"{' '.join(cmd)} exited with {self._process.wait()}")

    def start_service(self) -> Service | None:
        """Start a fresh service (nothing carried over in memory).

        With the real Flux backend the service is a process of its own (None is returned).
        """
        assert self.flux is not None
        if self.backend == "flux":
            self.flux.start_service()
            return None
        if self.service_process:
            self._start_service_process()
            return None
        loop = Loop(name="flux-dws")
        kube = KubeClient.connect(
            namespace=self.policy.namespace,
            identity=self.identity,
            kubeconfig=self.kubeconfig,
            timeout=5.0,
        )
        self._connection = self.flux.connect(loop)
        service = Service(
            policy=self.policy,
            loop=loop,
            jobmanager=JobManager(self._connection),
            kube=kube,
            owner_uid=self.owner_uid,
            nodes=self.flux.nodes(loop),
        )
        loop.call_soon(service.start)
        loop.start_thread()
        self.loop, self.service = loop, service
        return service

    def _start_service_process(self) -> None:
        """``python -m flux_dws.testing.fakeflux.remote``: the service alone in its process."""
        if self._service_process is not None:
            raise RuntimeError("a service process is running: kill_service() first")
        cmd = [sys.executable, "-m", "flux_dws.testing.fakeflux.remote"]
        cmd += ["--socket", self._server.path, "--kubeconfig", self.kubeconfig]
        cmd += ["--table", json.dumps(self.table), "--metrics", self.metrics_path]
        self._service_process = subprocess.Popen(cmd, text=True)

    @property
    def metrics_path(self) -> str:
        return os.path.join(self._tmp.name, "service-metrics.json")

    def stop_service(self, timeout: float = 30.0) -> dict[str, Any]:
        """Stop a service process with SIGTERM; the figures it wrote as it stopped."""
        process = self._service_process
        if process is None:
            raise RuntimeError("stop_service: no service process (service_process=True)")
        process.terminate()
        process.wait(timeout)
        self._service_process = None
        with open(self.metrics_path) as figures:
            return json.load(figures)

    def kill_service(self) -> None:
        """Drop the service as SIGKILL would: its connection and loop just stop."""
        if self.backend == "flux" and self.flux is not None:
            self.flux.kill_service()
            self.restarts += 1
            return
        if self._service_process is not None:
            self._service_process.kill()
            self._service_process.wait(10)
            self._service_process = None
            self.restarts += 1
            return
        if self.service is None or self.loop is None:
            return
        self._connection.close()
        self.loop.stop()
        self.loop.join(5)
        self.service.stop()
        self.service.kube.close()
        self.service, self.loop = None, None
        self.restarts += 1

    def service_running(self) -> bool:
        if self.backend == "flux":
            return self.flux is not None and self.flux.service_running()
        if self.service_process:
            return self._service_process is not None and self._service_process.poll() is None
        return self.service is not None

    def restart_service(self) -> Service | None:
        self.kill_service()
        return self.start_service()

    def stop(self) -> None:
        """Stop whatever was started; each piece even when stopping another one failed."""
        failures: list[BaseException] = []
        for step in (
            self.kill_service,
            self._server and self._server.stop,
            self.flux and self.flux.stop,
            self.sim and self.sim.stop,
            self.compute_mounts and self.compute_mounts.stop,
            self.data_mover and self.data_mover.stop,
            self.workloads and self.workloads.stop,
            self.nnf_sos and self.nnf_sos.stop,
            self.real_dws and self.real_dws.stop,
            self.real_webhook and self.real_webhook.stop,
            self.api and self.api.stop,
            self._process and self._stop_api_process,
            self._serving and self._serving.close,
        ):
            if step:
                try:
                    step()
                except Exception as exc:  # the others must still stop
                    failures.append(exc)
        self._tmp.cleanup()
        if failures:
            raise failures[0]

    def _stop_api_process(self) -> None:
        assert self._process is not None
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._process = None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ the user's side

    def validate(self, attributes: Mapping[str, Any], userid: int, resources: Any) -> str | None:
        """Submit-time validation, as the job-ingest validator does under real Flux."""
        return validate_attributes(attributes, self.policy, userid, self.owner_uid, resources)

    def submit(
        self,
        dw: str | Sequence[str],
        *,
        timeouts: Mapping[str, str] | None = None,
        runtime: float | None = 0.0,
        nnodes: int = 1,
        exit_status: int = 0,
        userid: int | None = None,
        tolerance: int | None = None,
        release: str | None = None,
        resources: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """Submit a #DW job, as `flux run -S dw=... -S dw_timeout.KEY=...
        -S dw_failure_tolerance=N -S dw_release=WHEN` would; ``resources``, when given, are
        the jobspec's (a slot labelled ``task`` holds the tasks) in place of ``-N nnodes``'s."""
        assert self.flux is not None
        attributes: dict[str, Any] = {"dw": dw if isinstance(dw, str) else list(dw)}
        if timeouts:
            attributes["dw_timeout"] = dict(timeouts)
        if tolerance is not None:
            attributes["dw_failure_tolerance"] = tolerance
        if release is not None:
            attributes["dw_release"] = release
        extra = {} if resources is None else {"resources": resources}
        return self.flux.submit(
            attributes,
            userid=userid,
            nnodes=nnodes,
            runtime=runtime,
            exit_status=exit_status,
            **extra,
        )

    def wait(self, jobid: int, state: str = "INACTIVE", timeout: float = 60.0) -> JobInfo:
        assert self.flux is not None
        return self.flux.wait(jobid, state, timeout=timeout)

    def saved(self, jobid: int, key: str, *, userid: int | None = None) -> str:
        """A key of the job's KVS directory read as ``userid`` would (job-info.lookup):
        PermissionError for anyone but the job's owner and the instance owner."""
        assert self.flux is not None
        return self.flux.kvs_lookup(jobid, key, userid=userid)

    def cancel(self, jobid: int) -> None:
        assert self.flux is not None
        self.flux.cancel(jobid)

    def wait_event(self, jobid: int, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """The job's first ``name`` event, once it is posted."""
        assert self.flux is not None
        return self.flux.wait_event(jobid, name, timeout=timeout)

    def wait_workflow(self, jobid: int, state: State, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until the job's workflow has entered ``state`` (status.state)."""
        assert self.api is not None
        name = workflow_name(self.identity, jobid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                obj = self.api.store.get("workflows", self.policy.namespace, name)
            except ApiError:
                obj = None
            if obj is not None and (obj.get("status") or {}).get("state") == state.value:
                return obj
            time.sleep(0.02)
        raise TimeoutError(f"workflow {name} did not reach {state.value} within {timeout}s")

    def left_behind(
        self, jobid: int, plurals: Sequence[str] = ("workflows", "computes"), timeout: float = 60.0
    ) -> list[str]:
        """Which of the job's workflow and the objects of its name (the Computes DWS made)
        are still there after ``timeout``: the real DWS deletes them after the service's
        delete, as its finalizer runs."""
        assert self.api is not None
        name = workflow_name(self.identity, jobid)
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in plurals if self._exists(p, name)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    def _exists(self, plural: str, name: str) -> bool:
        assert self.api is not None
        try:
            self.api.store.get(plural, self.policy.namespace, name)
        except ApiError:
            return False
        return True

    def delete_workflow_behind_our_back(self, jobid: int) -> None:
        """What an admin's `kubectl delete` plus finalizer removal does."""
        assert self.api is not None
        name = workflow_name(self.identity, jobid)
        self.api.store.patch(
            "workflows", self.policy.namespace, name, {"metadata": {"finalizers": None}}
        )
        self.api.store.delete("workflows", self.policy.namespace, name)

    def reject_directives_containing(self, text: str, reason: str) -> None:
        """Make the API server's admission deny new workflows whose directives hold ``text``,
        as a site's DWDirectiveRule would."""
        assert self.api is not None

        def hook(operation: str, old: dict | None, new: dict) -> None:
            lines = (new.get("spec") or {}).get("dwDirectives") or []
            if operation == "CREATE" and any(text in line for line in lines):
                raise deny(reason)

        self.api.store.add_admission("workflows", hook)

    def set_rabbit(self, rabbit: str, status: str, **kw: Any) -> None:
        """What DWS's Storage controller reports: the rabbit (or some links) change status."""
        assert self.api is not None
        set_rabbit_status(self.api.store, rabbit, status, **kw)

    def health_passes(self) -> int:
        """Health passes the service has completed, as its last heartbeat reported them to the
        dws plugin (-1 before any report): the same on fakeflux and on real Flux."""
        service = self.flux.dws_list().get("service") or {}
        report = (service.get("active") or {}).get("report") or {}
        passes = (report.get("rabbits") or {}).get("passes")
        return passes if isinstance(passes, int) else -1

    def workflows(self) -> list[dict[str, Any]]:
        """This instance's workflows still in the API server."""
        if self.api is None:  # kubeapi is in a process of its own: ask it over HTTP
            kube = KubeClient.connect(
                namespace=self.policy.namespace, identity=self.identity, kubeconfig=self.kubeconfig
            )
            try:
                return kube.list_workflows()[0]
            finally:
                kube.close()
        items, _ = self.api.store.list(
            "workflows", self.policy.namespace, instance_selector(self.identity)
        )
        return items

    def workflows_left(self, timeout: float = 60.0) -> list[str]:
        """The names of this instance's workflows still there after up to ``timeout``: a job
        that failed before it started is inactive while its workflow's Teardown and delete
        still run (no epilog waits for them), and a stack shared by a module's tests can hold
        an earlier test's for a moment."""
        deadline = time.monotonic() + timeout
        while True:
            names = [str(w.get("metadata", {}).get("name")) for w in self.workflows()]
            if not names or time.monotonic() >= deadline:
                return names
            time.sleep(0.1)
