# SPDX-License-Identifier: LGPL-3.0-only
"""DwsSim: the DWS workflow controller and the nnf-sos / test drivers, against a Store.

The imperative shell around the pure rules in ``status``, ``outcomes``, ``containers`` and
``companions``.  One daemon thread consumes a watch on workflows (re-listing after any watch
failure) and a heap of timers (per-state delays, container deadlines).  Every Workflow write
is a replace carrying the resourceVersion it was computed from; on a conflict the object is
read again and the decision made again, a bounded number of times.  Companion objects are
created idempotently, so repeating a decision is harmless.  A decision never changes the
workflow it is given: it builds the new one from copies of just the parts it changes (the
store copies whatever it is handed), so deciding costs little when nothing is to be done.
That is also why every read asks the store for ``shared`` objects (the stored ones, not
copies): nothing here may change an object it has read.
"""

from __future__ import annotations

import datetime
import heapq
import itertools
import json
import logging
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Union

from flux_dws.base.errors import DirectiveError
from flux_dws.core.directives import Directive, parse_directives
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
    container_nodes,
    pinned_copy,
    ports_failure,
    postrun_verdict,
    prerun_verdict,
)
from flux_dws.testing.dwssim.outcomes import (
    MAJOR,
    USER,
    WLM,
    Complete,
    Fail,
    Outcome,
    ResourceError,
    Wait,
    apply_outcome,
    fatal,
    tester_outcome,
)
from flux_dws.testing.dwssim.status import enter_state, force_ready, roll_up
from flux_dws.testing.kubeapi.errors import ApiError
from flux_dws.testing.kubeapi.podlog import logs_of
from flux_dws.testing.ruleset import BREAKDOWN_COMMANDS, NNF_DRIVER, TEST_DRIVER

LOG = logging.getLogger("flux-dws.testing.dwssim")

#: The finalizer the DWS workflow controller keeps on every workflow until it has cleaned up.
FINALIZER = "dataworkflowservices.github.io/workflow"
WORKFLOWS = "workflows"
DEFAULT_PORTS = range(30000, 30100)

MAX_CONFLICT_RETRIES = 8  # re-reads after a 409 before giving a write up
WATCH_POLL = 0.5  # longest wait on the watch, so stop() and timers are never late by more
RELIST_BACKOFF = (0.05, 2.0)  # first and largest pause before re-listing after a watch failure
API_RETRY = 1.0  # seconds before a driver retries after an unexpected API error
UNMOUNT_RETRY = 1.0  # seconds before nnf-sos tries a hung unmount again (PostRun waits)

#: stands in for a directive that failed, so the rest of the job is read in context.
_PLACEHOLDER = "#DW Teardown action=wait"
_DIRECTIVE_INDEX = re.compile(r"^#DW directive (\d+)")

#: Seconds each state's drivers take in simulation mode: the order of a small real system.
REALISTIC_DELAYS = {
    State.PROPOSAL: 1.0,
    State.SETUP: 5.0,
    State.DATAIN: 3.0,
    State.PRERUN: 3.0,
    State.POSTRUN: 2.0,
    State.DATAOUT: 3.0,
    State.TEARDOWN: 4.0,
}

Delays = Union[float, Mapping[Union[State, str], float]]
Timer = tuple[float, State]  # (seconds from now, state to drive)


@dataclass(frozen=True, order=True)
class _Due:
    at: float
    seq: int
    namespace: str
    name: str
    uid: str
    state: State


def resolve_delays(delays: Delays) -> dict[State, float]:
    """Seconds each state's drivers wait before acting; ValueError names a bad entry."""
    if isinstance(delays, Mapping):
        resolved = dict.fromkeys(State, 0.0)
        for key, value in delays.items():
            state = key if isinstance(key, State) else State.parse(str(key))
            resolved[state] = float(value)
    else:
        resolved = dict.fromkeys(State, float(delays))
    for state, value in resolved.items():
        if not value >= 0:
            raise ValueError(f"delay for {state.value} must be a non-negative number, not {value}")
    return resolved


class DwsSim:
    """Plays DWS and NNF for every Workflow in ``store`` while started.

    ``store``: a kubeapi Store, or anything with its methods (their ``shared`` keyword too).
    """

    def __init__(
        self,
        store: Any,
        *,
        delays: Delays = 0.0,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        ports: Sequence[int] = DEFAULT_PORTS,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be more than zero, not {time_scale}")
        self._store = store
        self._delays = resolve_delays(delays)
        self._time_scale = float(time_scale)
        self._clock = clock
        self._rng = random.Random(seed)
        self._free_ports = sorted(set(ports))
        self._ports: dict[str, tuple[int, ...]] = {}
        self.capacity = CapacityLedger()
        self._entered: dict[str, dict[State, float]] = {}  # uid -> state -> clock on entry
        self._parsed: dict[str, dict[int, Directive | DirectiveError]] = {}
        self._timers: list[_Due] = []
        self._seq = itertools.count()
        self._writes: Counter[str] = Counter()
        self._counter_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        #: rabbits whose Setup fails and computes whose mount fails (flux_dws...faults)
        self.faults = flt.Faults()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> DwsSim:
        """Begin watching workflows in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("DwsSim is already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dwssim", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; pending timers are dropped."""
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                LOG.warning("dwssim: thread did not stop within %.1fs", timeout)
        self._thread = None

    def __enter__(self) -> DwsSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def writes(self) -> dict[str, int]:
        """Writes (create, replace, delete) made so far, by resource plural."""
        with self._counter_lock:
            return dict(self._writes)

    @property
    def ports_in_use(self) -> dict[str, tuple[int, ...]]:
        """Container ports held, by workflow uid."""
        return dict(self._ports)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        pause = RELIST_BACKOFF[0]
        while not self._stop.is_set():
            try:
                items, version = self._store.list(WORKFLOWS, shared=True)
                for item in items:
                    self._handle(item)
                self._watch = self._store.watch(WORKFLOWS, resource_version=version, shared=True)
                if self._stop.is_set():
                    break
                pause = RELIST_BACKOFF[0]
                self._consume(self._watch)
            except Exception:
                if self._stop.is_set():
                    break
                LOG.exception("dwssim: watch on workflows failed; re-listing in %.2fs", pause)
                self._stop.wait(pause)
                pause = min(pause * 2, RELIST_BACKOFF[1])
            finally:
                watch, self._watch = self._watch, None
                if watch is not None:
                    watch.close()

    def _consume(self, watch: Any) -> None:
        while not self._stop.is_set():
            self._fire_timers()
            wait = WATCH_POLL
            if self._timers:
                wait = max(0.0, min(wait, self._timers[0].at - self._clock()))
            event = watch.next(timeout=wait)
            if event is None:
                continue
            kind, obj = event
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                self._forget(obj)
            elif kind in ("ADDED", "MODIFIED"):
                self._handle(obj)
            else:
                raise RuntimeError(f"watch on workflows ended with {kind}: {obj}")

    def _fire_timers(self) -> None:
        while self._timers and self._timers[0].at <= self._clock():
            due = heapq.heappop(self._timers)
            try:
                self._on_timer(due)
            except Exception:
                LOG.exception(
                    "dwssim: workflow %s/%s: %s: timer failed; the state will not advance "
                    "until the workflow changes",
                    due.namespace,
                    due.name,
                    due.state.value,
                )

    def _schedule(self, workflow: Mapping[str, Any], timers: Sequence[Timer]) -> None:
        meta = workflow["metadata"]
        now = self._clock()
        for seconds, state in timers:
            due = _Due(
                now + seconds,
                next(self._seq),
                meta["namespace"],
                meta["name"],
                meta.get("uid", ""),
                state,
            )
            heapq.heappush(self._timers, due)

    # ------------------------------------------------------------------ workflow writes

    def _handle(self, workflow: Mapping[str, Any]) -> None:
        if (workflow.get("metadata") or {}).get("deletionTimestamp"):
            self._finalize(workflow)
        else:
            self._write_workflow(workflow, self._reconcile)

    def _write_workflow(
        self,
        workflow: Mapping[str, Any],
        decide: Callable[[Mapping[str, Any]], tuple[dict[str, Any] | None, list[Timer]]],
    ) -> bool:
        """Write ``decide(workflow)``; on a conflict read the workflow again and decide again.

        False when the decision could not be written (refused, or conflicts kept coming).
        """
        meta = workflow["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        current = workflow
        for _ in range(MAX_CONFLICT_RETRIES):
            new, timers = decide(current)
            if new is None or new == current:
                self._schedule(current, timers)
                return True
            try:
                written = self._store.replace(WORKFLOWS, namespace, name, new, shared=True)
            except ApiError as exc:
                if exc.code == 404:
                    return True
                if exc.code != 409:
                    LOG.error(
                        "dwssim: workflow %s: the API server refused an update (%s %s: %s)",
                        _who(current),
                        exc.code,
                        exc.reason,
                        exc.message,
                    )
                    return False
                fresh = self._get(WORKFLOWS, namespace, name)
                if fresh is None:
                    return True
                current = fresh
                continue
            self._count(WORKFLOWS)
            self._schedule(written, timers)
            return True
        LOG.warning(
            "dwssim: workflow %s: gave up after %d conflicting updates",
            _who(current),
            MAX_CONFLICT_RETRIES,
        )
        return False

    def _reconcile(self, workflow: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[Timer]]:
        """The DWS controller: finalizer, state entry, forceReady, roll-up."""
        wf = dict(workflow)
        meta = wf["metadata"]
        finalizers = meta.get("finalizers", [])
        if FINALIZER not in finalizers:  # DWS adds its finalizer in a write of its own
            wf["metadata"] = {**meta, "finalizers": [*finalizers, FINALIZER]}
            return wf, []
        desired = (wf.get("spec") or {}).get("desiredState")
        try:
            state = State(desired)
        except ValueError:
            LOG.error("dwssim: workflow %s: unknown desiredState %r", _who(wf), desired)
            return None, []
        status = wf.get("status") or {}
        uid = meta.get("uid", "")
        now = _now()
        timers: list[Timer] = []
        if status.get("state") != state.value:
            wf = enter_state(wf, now)
            self._entered.setdefault(uid, {})[state] = self._clock()
            LOG.info("dwssim: workflow %s: entering %s", _who(wf), state.value)
            # DWS writes the entry (state, ready=false, DriverWait) before any roll-up, even
            # for a state without drivers; the next write goes on from there.
            return wf, self._start_drivers(wf, state)
        if state is State.PROPOSAL and not status.get("computes"):
            wf["status"] = {**status, "computes": self._ensure_computes(wf)}  # its own write
            return wf, timers
        if state not in self._entered.get(uid, ()) and not status.get("ready"):
            # First sight of a workflow already in this state (a restarted simulator).
            self._entered.setdefault(uid, {})[state] = self._clock()
            timers = self._start_drivers(wf, state)
        if wf["spec"].get("forceReady") and not status.get("ready"):
            LOG.info("dwssim: workflow %s: %s forced ready", _who(wf), state.value)
            wf = force_ready(wf, now)
        return roll_up(wf, now), timers

    def _start_drivers(self, wf: dict[str, Any], state: State) -> list[Timer]:
        """Drivers act after the state's delay, and never in the write that enters the state:
        DWS admission refuses a change to driver entries of a state the workflow is not in.
        """
        return [(self._delays[state], state)]

    def _on_timer(self, due: _Due) -> None:
        current = self._get(WORKFLOWS, due.namespace, due.name)
        if current is None:
            return
        meta = current["metadata"]
        if meta.get("uid", "") != due.uid or meta.get("deletionTimestamp"):
            return

        def decide(workflow: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[Timer]]:
            status = workflow.get("status") or {}
            if status.get("state") != due.state.value or status.get("ready"):
                return None, []
            if workflow["spec"].get("desiredState") != due.state.value:
                return None, []  # a state change is on its way; _reconcile handles it
            # The drivers change only status, in place: they get a copy of it (and only of it).
            wf = {**workflow, "status": _json_copy(status)}
            timers = self._drive(wf, due.state)
            if due.state is State.PROPOSAL and not status.get("computes"):
                return wf, timers  # DWS rolls up only once its Computes reference is written
            return roll_up(wf, _now()), timers

        if not self._write_workflow(current, decide):
            LOG.warning(
                "dwssim: workflow %s: %s: drivers will try again in %.1fs",
                _who(current),
                due.state.value,
                API_RETRY,
            )
            self._schedule(current, [(API_RETRY, due.state)])

    # ------------------------------------------------------------------ deletion

    def _finalize(self, workflow: Mapping[str, Any]) -> None:
        """A deleted workflow: remove its companions, then our finalizer (others first)."""
        finalizers = workflow["metadata"].get("finalizers") or []
        if FINALIZER not in finalizers or len(finalizers) > 1:
            return
        self._delete_companions(workflow)
        self._release_ports(workflow["metadata"].get("uid", ""))

        def decide(current: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[Timer]]:
            meta = current["metadata"]
            kept = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            return {**current, "metadata": {**meta, "finalizers": kept}}, []

        LOG.info("dwssim: workflow %s: deleted; companions removed", _who(workflow))
        self._write_workflow(workflow, decide)
        # Teardown removed these already; a workflow deleted before it leaves them: after
        # the finalizer, so that a deletion is not held up by them.
        for plural in ("pods", dm.PLURAL, "clientmounts"):
            self._delete_labelled(workflow, plural)
        self._forget(workflow)

    def _delete_companions(self, workflow: Mapping[str, Any]) -> None:
        meta = workflow["metadata"]
        namespace = meta["namespace"]
        targets = [("computes", meta["name"]), ("secrets", cmp.token_secret_name(workflow))]
        for index in range(len((workflow.get("spec") or {}).get("dwDirectives") or [])):
            name = cmp.indexed_name(workflow, index)
            for plural in ("directivebreakdowns", "servers", PROFILE_PLURAL):
                targets.append((plural, name))
        for plural, name in targets:
            try:
                self._store.delete(plural, namespace, name, shared=True)
                self._count(plural)
            except ApiError as exc:
                if exc.code != 404:
                    LOG.warning(
                        "dwssim: workflow %s: could not delete %s %s/%s: %s",
                        _who(workflow),
                        plural,
                        namespace,
                        name,
                        exc.message,
                    )

    def _forget(self, workflow: Mapping[str, Any]) -> None:
        uid = (workflow.get("metadata") or {}).get("uid", "")
        self._release_ports(uid)
        self.capacity.release(uid)
        publish_free(self._store, self.capacity)
        self._parsed.pop(uid, None)
        self._entered.pop(uid, None)

    # ------------------------------------------------------------------ drivers

    def _drive(self, wf: dict[str, Any], state: State) -> list[Timer]:
        """Run every driver entry of ``state`` that is still open; edits ``wf`` in place."""
        status = wf["status"]
        drivers = status.get("drivers") or []
        directives = self._directives(wf)
        timers: list[Timer] = []
        now = _now()
        for position, entry in enumerate(drivers):
            if entry.get("watchState") != state.value or entry.get("completed"):
                continue
            if entry.get("status") == Status.ERROR.value:
                continue
            index = entry.get("dwdIndex", 0)
            directive = directives.get(index)
            if directive is None:
                continue
            try:
                outcome = self._decide(wf, entry.get("driverID"), directive, state)
            except ApiError as exc:
                outcome = ResourceError(debug=f"API error: {exc.message}", severity=MAJOR).fail()
                timers.append((API_RETRY, state))
            if outcome is None:
                continue
            drivers[position] = apply_outcome(entry, outcome, now)
            if isinstance(outcome, Complete) and outcome.env:
                status.setdefault("env", {}).update(outcome.env)
            elif isinstance(outcome, Fail):
                LOG.warning(
                    "dwssim: workflow %s: %s: directive %s failed: %s [%s]",
                    _who(wf),
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
        if driver == TEST_DRIVER:
            if isinstance(directive, DirectiveError):
                LOG.error("dwssim: workflow %s: test directive unreadable: %s", _who(wf), directive)
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
        """The workflow's directives by index, read once per workflow with flux-dws's grammar.

        The job is read as a whole, as nnf-sos validates it in Proposal.  When a directive
        fails, it keeps its error and a placeholder takes its place, so the others are still
        read in context (a container's storage keys name the job's jobdw directives).
        """
        uid = wf["metadata"].get("uid", "")
        if uid in self._parsed:
            return self._parsed[uid]
        lines = [str(line) for line in (wf.get("spec") or {}).get("dwDirectives") or []]
        found: dict[int, Directive | DirectiveError] = {}
        for _ in range(len(lines) + 1):
            try:
                parsed = parse_directives(lines) if lines else ()
            except DirectiveError as exc:
                match = _DIRECTIVE_INDEX.match(str(exc))
                bad = int(match.group(1)) if match else -1
                if not 0 <= bad < len(lines) or bad in found:
                    for index in range(len(lines)):
                        found.setdefault(index, exc)
                    break
                found[bad] = exc
                lines[bad] = _PLACEHOLDER
                continue
            if len(parsed) != len(lines):
                problem = DirectiveError("a dwDirectives entry holds more than one directive")
                found.update({i: problem for i in range(len(lines)) if i not in found})
            else:
                found.update({d.index: d for d in parsed if d.index not in found})
            break
        self._parsed[uid] = found
        return found

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
        status = cmp.servers_status(servers, _now())
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
        objects = dm.data_movements(wf, d, parsed, rabbits, state, _now())
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

    def _labelled(self, wf: Mapping[str, Any], plural: str) -> list[dict[str, Any]]:
        meta = wf["metadata"]
        selector = (
            f"{cmp.WORKFLOW_NAME_LABEL}={meta['name']},"
            f"{cmp.WORKFLOW_NAMESPACE_LABEL}={meta['namespace']}"
        )
        items, _ = self._store.list(plural, None, selector, shared=True)
        return list(items)

    def _delete_labelled(
        self, wf: Mapping[str, Any], plural: str, keep: frozenset[str] | set[str] = frozenset()
    ) -> None:
        """Delete ``plural`` objects carrying the workflow's labels (in any namespace), but
        those named in ``keep``."""
        for item in self._labelled(wf, plural):
            where = item["metadata"]
            if where["name"] in keep:
                continue
            try:
                self._store.delete(plural, where["namespace"], where["name"], shared=True)
                self._count(plural)
            except ApiError as exc:
                if exc.code != 404:
                    raise
            if plural == "pods":
                logs_of(self._store).forget(where["namespace"], where["name"])

    def _elapsed(self, wf: Mapping[str, Any], state: State) -> float:
        started = self._entered.get(wf["metadata"].get("uid", ""), {}).get(state)
        return 0.0 if started is None else self._clock() - started

    # ------------------------------------------------------------------ companions

    def _ensure_computes(self, wf: Mapping[str, Any]) -> dict[str, str]:
        obj = self._ensure("computes", cmp.computes(wf))
        meta = obj["metadata"]
        return cmp.reference("Computes", meta["name"], meta["namespace"])

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

    # ------------------------------------------------------------------ store helpers

    def _count(self, plural: str) -> None:
        with self._counter_lock:
            self._writes[plural] += 1

    def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._store.get(plural, namespace, name, shared=True)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def _ensure(self, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``obj`` unless it exists; give it ``obj``'s status if it has another."""
        meta = obj["metadata"]
        try:
            current = self._store.create(plural, meta["namespace"], obj, shared=True)
            self._count(plural)
        except ApiError as exc:
            if exc.code != 409:
                raise
            current = self._store.get(plural, meta["namespace"], meta["name"], shared=True)
        if "status" in obj and current.get("status") != obj["status"]:
            current = self._set_status(plural, current, obj["status"])
        return current

    def _set_status(
        self, plural: str, obj: Mapping[str, Any], status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Replace ``obj``'s status, re-reading on a conflict (bounded)."""
        meta = obj["metadata"]
        current = dict(obj)
        for _ in range(MAX_CONFLICT_RETRIES):
            new = dict(current, status=dict(status))  # the store copies what it is given
            try:
                written = self._store.replace(
                    plural, meta["namespace"], meta["name"], new, shared=True
                )
                self._count(plural)
                return written
            except ApiError as exc:
                if exc.code != 409:
                    raise
                current = self._store.get(plural, meta["namespace"], meta["name"], shared=True)
        raise ApiError(
            409, "Conflict", f"{plural} {meta['namespace']}/{meta['name']} kept changing"
        )


def _json_copy(data: Any) -> Any:
    """A deep copy of plain JSON data (several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(data))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _who(wf: Mapping[str, Any]) -> str:
    """How a log line names a workflow: namespace/name and the WLM's job id."""
    meta = wf.get("metadata") or {}
    job = (wf.get("spec") or {}).get("jobID", "?")
    return f"{meta.get('namespace')}/{meta.get('name')} (job {job})"
