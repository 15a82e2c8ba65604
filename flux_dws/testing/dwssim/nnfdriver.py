# SPDX-License-Identifier: LGPL-3.0-only
"""dwssim's drivers: nnf-sos's (NNF_DRIVER) and DWS's test driver (TEST_DRIVER).

A driver acts only on its own entries of ``status.drivers`` in the workflow's current state:
it completes them, makes them wait, or fails them, and creates the companion objects nnf-sos
would (DirectiveBreakdowns, Servers status, ClientMounts, container pods, data movements).
The roll-up of those entries into ``status`` is the DWS controller's (controller.py, or the
real DWS manager beside ``DwsSim(workflow_controller=False)``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from flux_dws.base.errors import DirectiveError
from flux_dws.core.directives import Directive
from flux_dws.core.states import State, Status
from flux_dws.core.storage import rabbit_map
from flux_dws.testing.dwssim import companions as cmp
from flux_dws.testing.dwssim import datamovement as dm
from flux_dws.testing.dwssim import faults as flt
from flux_dws.testing.dwssim import persistent as pst
from flux_dws.testing.dwssim import pods as pd
from flux_dws.testing.dwssim.capacity import (
    CapacityLedger,
    outside_servers,
    publish_free,
    requested,
    storage_totals,
)
from flux_dws.testing.dwssim.containers import (
    PROFILE_NAMESPACE,
    PROFILE_PLURAL,
    ProfileSettings,
    check_access,
    check_storages,
    container_nodes,
    pinned_copy,
    ports_failure,
    postrun_verdict,
    prerun_verdict,
)
from flux_dws.testing.dwssim.outcomes import (
    USER,
    WLM,
    Complete,
    Fail,
    Outcome,
    ResourceError,
    Wait,
    apply_outcome,
    fatal,
    is_unclassified,
    tester_outcome,
    unclassified,
)
from flux_dws.testing.dwssim.reading import read_directives
from flux_dws.testing.dwssim.writer import LOG, MAX_CONFLICT_RETRIES, StoreWriter, utc_now, who
from flux_dws.testing.kubeapi.errors import ApiError
from flux_dws.testing.kubeapi.podlog import logs_of
from flux_dws.testing.ruleset import BREAKDOWN_COMMANDS, NNF_DRIVER, TEST_DRIVER

DEFAULT_PORTS = range(30000, 30100)
API_RETRY = 1.0  # seconds before a driver retries after an unexpected API error
UNMOUNT_RETRY = 1.0  # seconds before nnf-sos tries a hung unmount again (PostRun waits)


Timer = tuple[float, State]  # (seconds from now, state to drive)


class NnfDriver(StoreWriter):
    """The drivers' side of dwssim; ``drivers`` are the driver IDs it plays."""

    def __init__(
        self,
        store: Any,
        *,
        time_scale: float,
        clock: Callable[[], float],
        seed: int | None,
        ports: Sequence[int],
        drivers: Sequence[str] = (NNF_DRIVER, TEST_DRIVER),
    ) -> None:
        super().__init__(store)
        self._time_scale = float(time_scale)
        self._clock = clock
        self._rng = random.Random(seed)
        self._free_ports = sorted(set(ports))
        self._ports: dict[str, tuple[int, ...]] = {}
        self._drivers = frozenset(drivers)
        self.capacity = CapacityLedger()
        self._entered: dict[str, dict[State, float]] = {}  # uid -> state -> clock on entry
        self._parsed: dict[str, dict[int, Directive | DirectiveError]] = {}
        #: rabbits whose Setup fails and computes whose mount fails (flux_dws...faults)
        self.faults = flt.Faults()

    @property
    def ports_in_use(self) -> dict[str, tuple[int, ...]]:
        """Container ports held, by workflow uid."""
        return dict(self._ports)

    def _drive(self, wf: dict[str, Any], state: State) -> list[Timer]:
        """Run every driver entry of ``state`` that is still open; edits ``wf`` in place."""
        status = wf["status"]
        drivers = status.get("drivers") or []
        directives = self._directives(wf)
        timers: list[Timer] = []
        now = utc_now()
        for position, entry in enumerate(drivers):
            if entry.get("watchState") != state.value or entry.get("completed"):
                continue
            if entry.get("status") == Status.ERROR.value and not is_unclassified(entry):
                continue
            index = entry.get("dwdIndex", 0)
            directive = directives.get(index)
            if directive is None:
                continue
            try:
                outcome = self._decide(wf, entry.get("driverID"), directive, state)
            except ApiError as exc:
                outcome = unclassified(exc.message)
                timers.append((API_RETRY, state))
            if outcome is None:
                continue
            if is_unclassified(entry):  # nnf-sos's next pass starts the entry afresh
                entry = dict(entry, status="Running", message="", error="")
            drivers[position] = apply_outcome(entry, outcome, now)
            if isinstance(outcome, Complete) and outcome.env:
                status.setdefault("env", {}).update(outcome.env)
            elif isinstance(outcome, Fail):
                LOG.warning(
                    "dwssim: workflow %s: %s: directive %s failed: %s [%s]",
                    who(wf),
                    state.value,
                    index,
                    outcome.message,
                    outcome.error,
                )
            elif isinstance(outcome, Wait) and outcome.seconds is not None:
                timers.append((outcome.seconds, state))
        return timers

    def _decide(
        self,
        wf: dict[str, Any],
        driver: Any,
        directive: Directive | DirectiveError,
        state: State,
    ) -> Outcome | None:
        if driver not in self._drivers:
            return None
        if driver == TEST_DRIVER:
            if isinstance(directive, DirectiveError):
                LOG.error("dwssim: workflow %s: test directive unreadable: %s", who(wf), directive)
                return None
            return tester_outcome(directive.args)
        if driver != NNF_DRIVER:
            return None
        if isinstance(directive, DirectiveError):
            if state is not State.PROPOSAL:
                return Complete()
            return fatal(str(directive), kind=USER)
        handler = {
            State.PROPOSAL: self._proposal,
            State.SETUP: self._setup,
            State.DATAIN: self._data_movement,
            State.PRERUN: self._prerun,
            State.POSTRUN: self._postrun,
            State.DATAOUT: self._data_movement,
            State.TEARDOWN: self._teardown,
        }.get(state)
        return handler(wf, directive) if handler else Complete()

    def _directives(self, wf: Mapping[str, Any]) -> dict[int, Directive | DirectiveError]:
        """The workflow's directives by index, read once per workflow (reading.py)."""
        uid = wf["metadata"].get("uid", "")
        if uid not in self._parsed:
            lines = [str(line) for line in (wf.get("spec") or {}).get("dwDirectives") or []]
            self._parsed[uid] = read_directives(lines)
        return self._parsed[uid]

    def _proposal(self, wf: dict[str, Any], d: Directive) -> Outcome:
        if d.command == "container":
            return self._pin_profile(wf, d)
        if d.command == "persistentdw":
            name = d.args.get("name", "")
            psi = self._get(pst.PLURAL, wf["metadata"]["namespace"], name)
            problem = pst.use_problem(psi, name, (wf.get("spec") or {}).get("userID"))
            if problem is not None:
                return problem
        if d.command not in BREAKDOWN_COMMANDS:
            return Complete()
        try:
            bd = cmp.breakdown(wf, d)
        except DirectiveError as exc:
            return fatal(
                "unable to start parsing DW directive",
                f"could not generate DirectiveBreakdown: {exc}",
                kind=USER,
            )
        status = wf["status"]
        if "storage" in bd["status"]:
            self._ensure("servers", cmp.servers(wf, d.index))
        self._ensure("directivebreakdowns", bd)
        ref = cmp.reference(
            "DirectiveBreakdown", bd["metadata"]["name"], bd["metadata"]["namespace"]
        )
        refs = status.setdefault("directiveBreakdowns", [])
        if ref not in refs:
            refs.append(ref)
        for need in bd["status"]["requires"]:
            requires = status.setdefault("requires", [])
            if need not in requires:
                requires.append(need)
        return Complete()

    def _pin_profile(self, wf: dict[str, Any], d: Directive) -> Outcome:
        name = d.args.get("profile", "")
        profile = self._get(PROFILE_PLURAL, PROFILE_NAMESPACE, name)
        if profile is None:
            return fatal(f"container profile '{name}' not found", kind=USER)
        try:
            settings = ProfileSettings.from_profile(profile)
        except ValueError as exc:
            return fatal(debug=f"container profile '{name}': {exc}")
        spec = wf["spec"]
        denied = check_access(settings, spec.get("userID"), spec.get("groupID"))
        denied = denied or check_storages(profile, d)
        if denied is not None:
            return denied
        metadata = cmp.child_metadata(wf, cmp.indexed_name(wf, d.index))
        self._ensure(PROFILE_PLURAL, pinned_copy(profile, metadata))
        return Complete()

    def _profile(self, wf: Mapping[str, Any], d: Directive) -> ProfileSettings | Fail:
        """The workflow's pinned profile (or the selectable one, if not pinned)."""
        meta = wf["metadata"]
        pinned = self._get(PROFILE_PLURAL, meta["namespace"], cmp.indexed_name(wf, d.index))
        profile = pinned or self._get(PROFILE_PLURAL, PROFILE_NAMESPACE, d.args.get("profile", ""))
        if profile is None:
            return fatal(f"container profile '{d.args.get('profile')}' not found", kind=USER)
        try:
            return ProfileSettings.from_profile(profile)
        except ValueError as exc:
            return fatal(debug=f"container profile '{d.args.get('profile')}': {exc}")

    def _setup(self, wf: dict[str, Any], d: Directive) -> Outcome:
        meta = wf["metadata"]
        if d.command == "container":
            settings = self._profile(wf, d)
            if isinstance(settings, Fail):
                return settings
            if settings.num_ports == 0:
                return Complete()
            ports = self._request_ports(meta.get("uid", ""), settings.num_ports)
            if ports is None:
                return ports_failure()
            return Complete(env={"NNF_CONTAINER_PORTS": ",".join(str(p) for p in ports)})
        if d.command == "persistentdw":
            return self._use_persistent(wf, d, add=True)
        if d.command not in ("jobdw", "create_persistent"):
            return Complete()
        name = cmp.indexed_name(wf, d.index)
        shown = f"{meta['namespace']}/{name}"
        servers = self._get("servers", meta["namespace"], name)
        if servers is None:
            return ResourceError(
                "could not read allocation request", f"unable to get Servers: {shown}: not found"
            ).fail()
        bd = self._get("directivebreakdowns", meta["namespace"], name)
        problem = cmp.servers_problem(servers, bd)
        if problem:
            return ResourceError(
                "invalid Rabbit allocations",
                f"invalid Rabbit allocations for servers: {shown}: {problem}",
                WLM,
                "Fatal",
            ).fail()
        short = self.capacity.take(
            (meta.get("uid", ""), d.index), requested(servers), self._rabbit_capacity()
        )
        publish_free(self._store, self.capacity)
        if short is not None:
            return ResourceError(
                f"{short}: insufficient capacity available",
                f"allocating {shown} on {short}: insufficient capacity available",
                WLM,
                "Fatal",
            ).fail()
        status = cmp.servers_status(servers, utc_now())
        failed = [r for r in flt.rabbits_of(servers) if r in self.faults.snapshot()[0]]
        if failed:
            self._set_status("servers", servers, flt.failed_servers_status(status, failed))
            return flt.setup_failure(failed)
        written = self._set_status("servers", servers, status)
        if d.command == "create_persistent":
            psi = pst.instance(wf, d.args["name"], d.args.get("type", ""), d.text)
            self._ensure(pst.PLURAL, psi)
            self._ensure("servers", pst.owned_servers(written, psi))
        return Complete()

    def _use_persistent(self, wf: dict[str, Any], d: Directive, *, add: bool) -> Outcome:
        """A persistentdw's workflow becomes (or stops being) a consumer of the instance."""
        namespace, name = wf["metadata"]["namespace"], d.args.get("name", "")
        ref = pst.consumer(wf, d.index)
        for _ in range(MAX_CONFLICT_RETRIES):
            psi = self._get(pst.PLURAL, namespace, name)
            if psi is None:
                return pst.use_problem(None, name, None) if add else Complete()
            if add and psi.get("status", {}).get("state") not in pst.USABLE:
                return pst.use_problem(None, name, None)
            try:
                self._store.replace(
                    pst.PLURAL, namespace, name, pst.with_consumer(psi, ref, add), shared=True
                )
                self._count(pst.PLURAL)
                return Complete()
            except ApiError as exc:
                if exc.code != 409:
                    raise
        raise ApiError(409, "Conflict", f"{pst.PLURAL} {namespace}/{name} kept changing")

    def _destroy(self, wf: dict[str, Any], d: Directive) -> Outcome:
        namespace, name = wf["metadata"]["namespace"], d.args.get("name", "")
        psi = self._get(pst.PLURAL, namespace, name)
        if psi is None:
            return Complete()
        problem = pst.destroy_problem(psi, (wf.get("spec") or {}).get("userID"))
        if problem is not None:
            return problem
        for plural in ("servers", pst.PLURAL):
            try:
                self._store.delete(plural, namespace, name, shared=True)
                self._count(plural)
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return Complete()

    def _rabbit_capacity(self) -> dict[str, int | None]:
        """Rabbit -> total capacity of its Storage resource (None where it reports none)."""
        return storage_totals(self._store)

    def add_outside_storage(
        self, name: str, rabbit: str, size: int, kind: str = "NnfSystemStorage"
    ) -> None:
        """Storage made outside the WLM (system storage, or a persistent file system): its
        Servers in DWS's namespace and ``size`` bytes taken from ``rabbit``."""
        self._store.create(
            "servers", cmp.STORAGE_NAMESPACE, outside_servers(name, rabbit, size, kind)
        )
        self.capacity.take(("outside:" + name, 0), {rabbit: size}, {})
        publish_free(self._store, self.capacity)

    def leak(self, rabbit: str, size: int, name: str = "leak") -> None:
        """``size`` bytes left allocated on ``rabbit`` with no Servers (a failed Teardown's
        NnfNodeBlockStorage nnf-sos never deleted); ``unleak`` frees them."""
        self.capacity.take(("leak:" + name, 0), {rabbit: size}, {})
        publish_free(self._store, self.capacity)

    def unleak(self, name: str = "leak") -> None:
        self.capacity.release("leak:" + name)
        publish_free(self._store, self.capacity)

    def _prerun(self, wf: dict[str, Any], d: Directive) -> Outcome:
        meta = wf["metadata"]
        if d.command in ("jobdw", "persistentdw"):
            parsed = [x for x in self._directives(wf).values() if isinstance(x, Directive)]
            if cmp.COPY_OFFLOAD in cmp.requires_of(d):
                self._issue_token(wf)
            env = cmp.storage_env(wf, d, parsed)
            failed = self._mount(wf, d, env)
            return flt.mount_failure(failed) if failed else Complete(env=env)
        if d.command != "container":
            return Complete()
        settings = self._profile(wf, d)
        if isinstance(settings, Fail):
            return settings
        nodes = self._rabbits(wf)
        if isinstance(nodes, Fail):
            return nodes
        self._put_pods(wf, d.index, settings, nodes, pd.STARTED)
        return prerun_verdict(
            settings,
            self._elapsed(wf, State.PRERUN),
            self._time_scale,
            meta["name"],
            meta["namespace"],
            nodes,
        )

    def _rabbits(self, wf: Mapping[str, Any]) -> tuple[str, ...] | Fail:
        """The rabbits serving the job's compute nodes (its Computes)."""
        meta = wf["metadata"]
        computes = self._get("computes", meta["namespace"], meta["name"]) or {}
        hosts = [c.get("name", "") for c in computes.get("data") or []]
        namespace, name = cmp.SYSTEM_CONFIGURATION
        config = self._get("systemconfigurations", namespace, name)
        return container_nodes(hosts, None if config is None else rabbit_map(config))

    def _put_pods(
        self, wf: Mapping[str, Any], index: int, settings: ProfileSettings, nodes: Any, stage: str
    ) -> None:
        """The container pods at ``stage``, and their logs (as the kubelet keeps them)."""
        logs = logs_of(self._store)
        built = pd.pods(wf, index, settings, nodes, stage)
        for pod, texts in built:
            meta = pod["metadata"]
            self._ensure("pods", pod)
            for container, text in texts.items():
                logs.write(meta["namespace"], meta["name"], container, text)
        if stage == pd.ENDED:  # pods not part of the end (MPI workers) are gone
            keep = {pod["metadata"]["name"] for pod, _ in built}
            self._delete_labelled(wf, "pods", keep=keep)

    def _data_movement(self, wf: dict[str, Any], d: Directive) -> Outcome:
        """copy_in in DataIn, copy_out in DataOut: NnfDataMovements, finished at once."""
        if d.command not in ("copy_in", "copy_out"):
            return Complete()
        nodes = self._rabbits(wf)
        rabbits = () if isinstance(nodes, Fail) else nodes
        parsed = [x for x in self._directives(wf).values() if isinstance(x, Directive)]
        state = wf["status"].get("state", "")
        objects = dm.data_movements(wf, d, parsed, rabbits, state, utc_now())
        for obj in objects:
            self._ensure(dm.PLURAL, obj)
        return dm.verdict(objects, state)

    def _postrun(self, wf: dict[str, Any], d: Directive) -> Outcome:
        if d.command in ("jobdw", "persistentdw"):
            stuck, fenced = self._unmount(wf)
            if fenced:
                return flt.fence_failure(fenced)
            # a hung unmount holds PostRun; nnf-sos tries again (the hang may clear, or the
            # compute be Disabled in SystemStatus and skipped)
            return Wait(UNMOUNT_RETRY) if stuck else Complete()
        if d.command != "container":
            return Complete()
        settings = self._profile(wf, d)
        if isinstance(settings, Fail):
            return settings
        meta = wf["metadata"]
        elapsed = self._elapsed(wf, State.POSTRUN)
        verdict = postrun_verdict(
            settings, elapsed, self._time_scale, meta["name"], meta["namespace"]
        )
        nodes = self._rabbits(wf)
        if not isinstance(verdict, Wait) and not isinstance(nodes, Fail):
            self._put_pods(wf, d.index, settings, nodes, pd.ENDED)
        return verdict

    def _teardown(self, wf: dict[str, Any], d: Directive) -> Outcome:
        if d.command in ("jobdw", "persistentdw"):
            stuck, _ = self._unmount(wf)
            if stuck:
                return flt.unmount_failure(stuck)
        if d.command == "persistentdw":
            return self._use_persistent(wf, d, add=False)
        if d.command == "destroy_persistent":
            return self._destroy(wf, d)
        if d.command == "container":
            self._release_ports(wf["metadata"].get("uid", ""))
        self.capacity.release(wf["metadata"].get("uid", ""))
        publish_free(self._store, self.capacity)
        if d.command in ("container", "copy_in", "copy_out"):
            self._delete_labelled(wf, "pods" if d.command == "container" else dm.PLURAL)
        return Complete()

    def _mount(self, wf: dict[str, Any], d: Directive, env: Mapping[str, str]) -> list[str]:
        """nnf-sos mounts the file system on each of the workflow's computes: one ClientMount
        per compute; the computes whose mount failed."""
        meta = wf["metadata"]
        computes = self._get("computes", meta["namespace"], meta["name"]) or {}
        hosts = [c.get("name", "") for c in computes.get("data") or [] if c.get("name")]
        broken = self.faults.snapshot()[1]
        path = cmp.mount_path(wf, d.index)
        for host in hosts:
            self._ensure("clientmounts", flt.clientmount(wf, d.index, host, path, host in broken))
        return [h for h in hosts if h in broken]

    def _unmount(self, wf: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """nnf-sos unmounts the workflow's ClientMounts (PostRun; Teardown again): the
        computes whose unmount hangs (``Faults.unmount``: mounted, with ``status.error``), and
        those fenced.  Computes Disabled in SystemStatus, or Offline or Fenced in their
        rabbit's Storage, are skipped, never tried (``checkOfflineOrFencedCompute``)."""
        status = self._get("systemstatuses", "default", "default") or {}
        disabled = {
            n for n, s in ((status.get("data") or {}).get("nodes") or {}).items() if s == "Disabled"
        }
        storages, _ = self._store.list("storages", cmp.STORAGE_NAMESPACE, shared=True)
        links = flt.link_states(storages)
        hung = self.faults.stuck()
        stuck, fenced = [], []
        for item in self._labelled(wf, "clientmounts"):
            node = (item.get("spec") or {}).get("node", "")
            if links.get(node) == "Fenced":
                fenced.append(node)
            if node in disabled or links.get(node) in ("Offline", "Fenced"):
                continue
            if node in hung:
                stuck.append(node)
            new = flt.unmounted(item, node in hung)
            if new != item:
                where = item["metadata"]
                try:
                    self._store.replace("clientmounts", where["namespace"], where["name"], new)
                    self._count("clientmounts")
                except ApiError as exc:
                    if exc.code not in (404, 409):
                        raise
        return sorted(set(stuck)), sorted(set(fenced))

    def _elapsed(self, wf: Mapping[str, Any], state: State) -> float:
        started = self._entered.get(wf["metadata"].get("uid", ""), {}).get(state)
        return 0.0 if started is None else self._clock() - started

    # ------------------------------------------------------------------ NNF companions

    def _issue_token(self, wf: dict[str, Any]) -> None:
        """The copy-offload token: a Secret in the workflow's namespace, named in status."""
        status = wf["status"]
        if status.get("workflowToken"):
            return
        secret = cmp.token_secret(wf, f"{self._rng.getrandbits(256):064x}")
        self._ensure("secrets", secret)
        status["workflowToken"] = {
            "secretName": secret["metadata"]["name"],
            "secretNamespace": secret["metadata"]["namespace"],
        }

    def _request_ports(self, uid: str, count: int) -> tuple[int, ...] | None:
        if uid in self._ports:
            return self._ports[uid]
        if count > len(self._free_ports):
            return None
        taken, self._free_ports = self._free_ports[:count], self._free_ports[count:]
        self._ports[uid] = tuple(taken)
        return self._ports[uid]

    def _release_ports(self, uid: str) -> None:
        ports = self._ports.pop(uid, ())
        if ports:
            self._free_ports = sorted(self._free_ports + list(ports))
