# SPDX-License-Identifier: LGPL-3.0-only
"""DwsSim: the DWS workflow controller and the nnf-sos / test drivers, against a Store.

This module is DWS's side (finalizer, state entry, Computes, forceReady, roll-up, deletion);
the drivers are ``nnfdriver``'s, so that with ``workflow_controller=False`` they run alone
beside the real DWS manager, as nnf-sos does on a real system. The imperative shell around
the pure rules in ``status``, ``outcomes``, ``containers`` and ``companions``. One daemon
thread consumes a watch on workflows (re-listing after any watch failure) and a heap of
timers (per-state delays, container deadlines). Every Workflow write is a replace carrying
the resourceVersion it was computed from; on a conflict the object is read again and the
decision made again, a bounded number of times. Companion objects are created idempotently,
so repeating a decision is harmless. A decision never changes the workflow it is given: it
builds the new one from copies of just the parts it changes (the store copies whatever it is
handed), so deciding costs little when nothing is to be done. That is also why every read
asks the store for ``shared`` objects (the stored ones, not copies): nothing here may change
an object it has read.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Union

from flux_dws.core.states import State
from flux_dws.testing.dwssim import companions as cmp
from flux_dws.testing.dwssim import datamovement as dm
from flux_dws.testing.dwssim.capacity import publish_free
from flux_dws.testing.dwssim.containers import PROFILE_PLURAL
from flux_dws.testing.dwssim.nnfdriver import API_RETRY, DEFAULT_PORTS, NnfDriver, Timer
from flux_dws.testing.dwssim.status import enter_state, force_ready, roll_up
from flux_dws.testing.dwssim.writer import (
    LOG,
    MAX_CONFLICT_RETRIES,
    json_copy,
    utc_now,
    who,
)
from flux_dws.testing.kubeapi.errors import ApiError
from flux_dws.testing.ruleset import NNF_DRIVER, TEST_DRIVER

#: The finalizer the DWS workflow controller keeps on every workflow until it has cleaned up.
FINALIZER = "dataworkflowservices.github.io/workflow"
WORKFLOWS = "workflows"

WATCH_POLL = 0.5  # longest wait on the watch, so stop() and timers are never late by more
RELIST_BACKOFF = (0.05, 2.0)  # first and largest pause before re-listing after a watch failure

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


class DwsSim(NnfDriver):
    """Plays DWS and NNF for every Workflow in ``store`` while started.

    ``store``: a kubeapi Store, or anything with its methods (their ``shared`` keyword too).
    ``workflow_controller=False`` plays only nnf-sos's driver beside a real DWS manager, as
    on a real system: it acts on its own driver entries of the state DWS has entered, and
    DWS does the rest (finalizer, state entry, Computes, roll-up, deletion).
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
        workflow_controller: bool = True,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be more than zero, not {time_scale}")
        drivers = (NNF_DRIVER, TEST_DRIVER) if workflow_controller else (NNF_DRIVER,)
        super().__init__(
            store, time_scale=time_scale, clock=clock, seed=seed, ports=ports, drivers=drivers
        )
        self._controller = workflow_controller
        self._delays = resolve_delays(delays)
        self._timers: list[_Due] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None

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
                if not self._controller:  # the real DWS finalized it: NNF's objects go too
                    self._delete_companions(obj)
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
            if self._controller:
                self._finalize(workflow)
        elif self._controller:
            self._write_workflow(workflow, self._reconcile)
        else:
            self._schedule(workflow, self._entered_by_dws(workflow))

    def _entered_by_dws(self, workflow: Mapping[str, Any]) -> list[Timer]:
        """Beside the real DWS: the drivers start once per state DWS has entered (written
        ``state`` with ``ready`` false) that the WLM still asks for."""
        status = workflow.get("status") or {}
        try:
            state = State(status.get("state"))
        except ValueError:
            return []
        if status.get("ready") or workflow["spec"].get("desiredState") != state.value:
            return []
        entered = self._entered.setdefault(workflow["metadata"].get("uid", ""), {})
        if state in entered:
            return []
        entered[state] = self._clock()
        return self._start_drivers(dict(workflow), state)

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
                        who(current),
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
            who(current),
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
            LOG.error("dwssim: workflow %s: unknown desiredState %r", who(wf), desired)
            return None, []
        status = wf.get("status") or {}
        uid = meta.get("uid", "")
        now = utc_now()
        timers: list[Timer] = []
        if status.get("state") != state.value:
            wf = enter_state(wf, now)
            self._entered.setdefault(uid, {})[state] = self._clock()
            LOG.info("dwssim: workflow %s: entering %s", who(wf), state.value)
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
            LOG.info("dwssim: workflow %s: %s forced ready", who(wf), state.value)
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
            # Their write is their own: DWS rolls their entries up when it reconciles it, as
            # the real DWS does after nnf-sos's or the test driver's write (_reconcile).
            wf = {**workflow, "status": json_copy(status)}
            return wf, self._drive(wf, due.state)

        if not self._write_workflow(current, decide):
            LOG.warning(
                "dwssim: workflow %s: %s: drivers will try again in %.1fs",
                who(current),
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

        LOG.info("dwssim: workflow %s: deleted; companions removed", who(workflow))
        self._write_workflow(workflow, decide)
        # Teardown removed these already; a workflow deleted before it leaves them: after
        # the finalizer, so that a deletion is not held up by them.
        for plural in ("pods", dm.PLURAL, "clientmounts"):
            self._delete_labelled(workflow, plural)
        self._forget(workflow)

    def _delete_companions(self, workflow: Mapping[str, Any]) -> None:
        """The workflow's objects: the Computes when playing DWS, and NNF's."""
        meta = workflow["metadata"]
        namespace = meta["namespace"]
        targets = [("secrets", cmp.token_secret_name(workflow))]
        if self._controller:
            targets.append(("computes", meta["name"]))
        else:  # nnf-sos's own: the controller removes these after its finalizer
            for plural in ("pods", dm.PLURAL, "clientmounts"):
                self._delete_labelled(workflow, plural)
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
                        who(workflow),
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

    # ------------------------------------------------------------------ companions

    def _ensure_computes(self, wf: Mapping[str, Any]) -> dict[str, str]:
        obj = self._ensure("computes", cmp.computes(wf))
        meta = obj["metadata"]
        return cmp.reference("Computes", meta["name"], meta["namespace"])
