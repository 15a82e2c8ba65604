# SPDX-License-Identifier: LGPL-3.0-only
"""Rabbit and node health, as pure functions: what Kubernetes and Flux show -> what to change.

Three decisions live here, each a function of what is observable now (level-triggered, so a
restarted service reaches the same answer and nothing flaps):

- ``plan_drains``: which compute nodes flux-dws must drain because their rabbit (or their
  link to it) is down, and which of its own earlier drains to undo.  A drain is flux-dws's
  when its reason starts with ``DRAIN_TAG``; any other drain is an admin's and is never
  touched.  Rabbit drains say ``dws: rabbit <name> ...``; drains for a job's failed node
  (failure tolerance, stuck Teardown) say ``dws: job <id> ...`` and are left for an admin to
  undo, since the node itself may be broken.
- ``system_status_patch``: the smallest merge patch that makes DWS's SystemStatus
  ``data.nodes`` agree with Flux by NNF's rule (``node_states``: Disabled only when the
  broker is offline or flux-dws drained the node for a failed unmount or a fence).
- ``tolerate``: whether a job's failed nodes fit within its ``dw_failure_tolerance``.
- ``capacity_drifts``: rabbits with less free space than their Servers explain (a leak).

Everything read from Kubernetes is untrusted: a malformed Storage gives a rabbit in
``Unknown`` state, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.frozen import FrozenMap
from flux_dws.base.jobid import f58
from flux_dws.core.rabbits import device_capacity, servers_held

#: Every drain reason flux-dws writes starts with this; anything else is an admin's.
DRAIN_TAG = "dws: "
#: Rabbit drains (undone when the rabbit is back).
RABBIT_DRAIN = DRAIN_TAG + "rabbit "
#: Drains for a job's failed node (left for an admin).
JOB_DRAIN = DRAIN_TAG + "job "

READY = "Ready"
#: ResourceStatus values DWS defines (Storage status.status, access link status).
STATUSES = (
    "Starting",
    "Ready",
    "Disabled",
    "NotPresent",
    "Offline",
    "Failed",
    "Degraded",
    "Drained",
    "Fenced",
    "Unknown",
)
#: A rabbit in one of these still serves its healthy links: only nodes whose own link is
#: down are affected.  Any other status takes every node the rabbit serves.
PARTIAL = frozenset({"Ready", "Degraded"})
#: Statuses that say NNF has not told yet (see Rabbit.not_yet): the pool is down, but no
#: compute node is drained for them.
NOT_YET = frozenset({"Unknown", "Starting"})
MAX_NAME = 253  # a Kubernetes object name; longer text from the API is cut
MAX_REASON = 200  # drain reasons are shown in `flux resource drain` tables


@dataclass(frozen=True)
class RabbitHealth:
    """One rabbit's health as its Storage resource shows it: whether it and each link to a
    compute node are usable.  Read leniently (junk reads as Unknown, never an exception); the
    graph's strict reading of the same Storage is flux_dws.core.rabbits.RabbitPool."""

    name: str
    status: str = "Unknown"  # status.status
    enabled: bool = True  # spec.state != Disabled
    links: Mapping[str, str] = field(default_factory=FrozenMap)  # compute -> link status
    reboot_required: bool = False  # status.rebootRequired: nnf-sos's mark of a fenced rabbit
    message: str = ""  # status.message
    disable_reason: str = ""  # the disable_reason annotation (`nnf rabbit disable -r`)
    drain_reason: str = ""  # the drain_reason annotation (`nnf rabbit drain -r`)
    reported: bool = True  # the Storage has a status at all (DWS creates it without one)

    def __post_init__(self) -> None:
        object.__setattr__(self, "links", FrozenMap(dict(self.links)))

    @property
    def down(self) -> str | None:
        """Why the whole rabbit is unusable (its ssd pool goes down), or None.

        Degraded is usable (DWS: "ready but operating in a degraded state"), except when
        nnf-sos sets it with ``rebootRequired`` for a rabbit that was fenced (STONITH):
        dws_storage_controller.go writes Degraded, rebootRequired and "Storage node requires
        reboot to recover from STONITH event"; such a rabbit holds nothing until rebooted.
        """
        if not self.enabled:
            why = f": {self.disable_reason}" if self.disable_reason else ""
            return f"Disabled by an admin (spec.state){why}"
        if self.status == "Degraded" and self.reboot_required:
            return f"Degraded, reboot required ({self.message or 'fenced'})"
        if self.status == "Drained" and self.drain_reason:
            return f"Drained: {self.drain_reason}"
        if self.status not in PARTIAL:
            return self.status
        return None

    @property
    def not_yet(self) -> bool:
        """NNF has not said what this rabbit is yet: no status (DWS's SystemConfiguration
        controller creates each Storage bare; nnf-sos's DWSStorageReconciler fills it only once
        the rabbit's NnfNode exists and the Storage is Live), ``Starting``, or ``Unknown``
        (what nnf-sos's ConvertToDWSResourceStatus gives any NNF status it has no name for).
        Every rabbit of a fresh system starts so; its pool stays down, its nodes undrained."""
        return self.enabled and (not self.reported or self.status in NOT_YET)

    def link_down(self, compute: str) -> str | None:
        """Why ``compute`` cannot use this rabbit, or None (never for a rabbit NNF has not
        reported yet: a fresh system's nodes are not drained for it)."""
        whole = self.down
        if whole and self.not_yet:
            return None
        if whole:
            return f"rabbit {self.name} is {whole}"
        link = self.links.get(compute)
        if link is not None and link != READY and link not in NOT_YET:
            return f"rabbit {self.name} link to {compute} is {link}"
        return None


def _text(value: Any, limit: int = MAX_NAME) -> str | None:
    """A name or message from a resource, as one safe line; None when it is missing, empty
    or holds a NUL (no such name can match a Flux host)."""
    if not isinstance(value, str) or not value or "\0" in value:
        return None
    return untrusted.text(value, limit)


def _status(value: Any) -> str:
    return value if isinstance(value, str) and value in STATUSES else "Unknown"


def rabbit_health(obj: Any) -> RabbitHealth | None:
    """A Storage resource -> Rabbit; None when it has no usable name."""
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    name = _text(meta.get("name")) if isinstance(meta, Mapping) else None
    if name is None:
        return None
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    links: dict[str, str] = {}
    access = status.get("access")
    computes = access.get("computes") if isinstance(access, Mapping) else None
    for entry in computes if isinstance(computes, list) else ():
        if isinstance(entry, Mapping):
            compute = _text(entry.get("name"))
            if compute is not None:
                links[compute] = _status(entry.get("status"))
    annotations = untrusted.mapping(meta.get("annotations"))
    return RabbitHealth(
        name=name,
        status=_status(status.get("status")),
        enabled=spec.get("state") != "Disabled",
        links=links,
        reboot_required=status.get("rebootRequired") is True,
        message=_text(status.get("message"), 120) or "",
        disable_reason=_text(annotations.get("disable_reason"), 120) or "",
        drain_reason=_text(annotations.get("drain_reason"), 120) or "",
        reported=bool(status.get("status")),
    )


def is_ours(reason: str | None) -> bool:
    return isinstance(reason, str) and reason.startswith(DRAIN_TAG)


def rabbit_reason(why: str) -> str:
    """The drain reason for a node whose rabbit or link is down (``why`` names the rabbit)."""
    return untrusted.text(DRAIN_TAG + why, MAX_REASON)


def job_reason(jobid: int, why: str) -> str:
    """The drain reason for a node that failed job ``jobid`` (``why``: workflow and cause),
    the job named in f58 as flux-core names jobs in drain reasons."""
    return untrusted.text(f"{JOB_DRAIN}{f58(jobid)}: {why}", MAX_REASON)


@dataclass(frozen=True)
class DrainPlan:
    """What to change in Flux: drain each rank with its reason; undrain the others.

    Keyed by rank, not hostname: where ranks share a hostname (a test instance, several
    brokers per node) a drain by hostname would take, and an undrain would undo, every rank of
    that host, an admin's drain of another rank included."""

    drain: Mapping[int, str] = field(default_factory=FrozenMap)
    undrain: tuple[int, ...] = ()
    down_rabbits: Mapping[str, str] = field(default_factory=FrozenMap)  # rabbit -> why

    @property
    def empty(self) -> bool:
        return not self.drain and not self.undrain


def wanted_drains(
    rabbits: Iterable[RabbitHealth], served: Mapping[str, str], hosts: Iterable[str]
) -> dict[str, str]:
    """host -> reason for every Flux host whose rabbit or link to it is down.

    ``served`` maps compute -> rabbit (SystemConfiguration); a rabbit's Storage may also list
    links to computes the configuration does not, and those count too.
    """
    by_name = {r.name: r for r in rabbits}
    linked: dict[str, set[str]] = {}  # host -> rabbits whose Storage links it: one walk
    for rabbit in by_name.values():
        for host in rabbit.links:
            linked.setdefault(host, set()).add(rabbit.name)
    wanted: dict[str, str] = {}
    for host in sorted(set(hosts)):
        names = {served[host]} if host in served else set()
        names |= linked.get(host, set())
        for name in sorted(names):
            rabbit = by_name.get(name)
            why = rabbit.link_down(host) if rabbit else None
            if why:
                wanted[host] = rabbit_reason(why)
                break
    return wanted


def plan_drains(
    rabbits: Sequence[RabbitHealth],
    served: Mapping[str, str],
    hosts: Mapping[int, str],
    drained: Mapping[int, str],
    *,
    drain_nodes: bool = True,
) -> DrainPlan:
    """Compare the drains flux-dws wants with Flux's drained ranks (rank -> reason);
    ``hosts`` names each rank's host (rank -> hostname; ranks may share one).

    - A rank drained by anyone else is left as it is (never overwritten, never undrained).
    - A rank flux-dws drained for a rabbit that is fine again is undrained; with
      ``drain_nodes`` off every such rabbit drain is undone.
    - A rank flux-dws drained for one rabbit problem that is now another gets the new reason.
    - Job drains (``JOB_DRAIN``) are never undone here.
    """
    by_host = wanted_drains(rabbits, served, hosts.values()) if drain_nodes else {}
    wanted = {rank: by_host[host] for rank, host in hosts.items() if host in by_host}
    drain: dict[int, str] = {}
    for rank, reason in sorted(wanted.items()):
        current = drained.get(rank)
        if current is None or (current.startswith(RABBIT_DRAIN) and current != reason):
            drain[rank] = reason
    undrain = tuple(
        sorted(
            rank
            for rank, reason in drained.items()
            if isinstance(reason, str)
            and reason.startswith(RABBIT_DRAIN)
            and rank not in wanted
            and rank in hosts
        )
    )
    down = {r.name: r.down for r in rabbits if r.down}
    return DrainPlan(drain=drain, undrain=undrain, down_rabbits=down)  # type: ignore[arg-type]


# ---- SystemStatus ------------------------------------------------------------------------

ENABLED = "Enabled"
DISABLED = "Disabled"


#: Our drain reasons for a node nnf-sos should give up on: it holds a mount that would not
#: come off, or it was fenced (the text after ``dws: job <id>: ``).
UNMOUNT_FAILED = "unmount failed"
FENCED = "fenced during the job"


def disables_node(reason: str | None) -> bool:
    """Whether a drain makes the node Disabled in SystemStatus: only flux-dws's own drains
    for a failed unmount or a fence (never an admin's, never a rabbit drain)."""
    if not isinstance(reason, str) or not reason.startswith(JOB_DRAIN):
        return False
    _, _, why = reason[len(JOB_DRAIN) :].partition(": ")
    return why.startswith((UNMOUNT_FAILED, FENCED))


def node_states(
    hosts: Iterable[str], drained: Mapping[str, str], offline: Iterable[str]
) -> dict[str, str]:
    """Flux's view of each compute node for DWS, by NNF's rule.

    nnf-sos reads SystemStatus in one place: NnfAccess's ``checkOfflineOrFencedCompute``
    (internal/controller/nnf_access_controller.go) counts a compute whose entry is Disabled
    as offline, and then removes its ClientMount's finalizer *without unmounting*.  So a node
    is Disabled only when it cannot unmount anyway (its broker is offline) or when flux-dws
    gave up on it (drained for a failed unmount or a fence); any other drain (an admin's, a
    rabbit's) leaves a live node Enabled, and its mounts are taken down as usual.
    """
    down = set(offline) | {h for h, reason in drained.items() if disables_node(reason)}
    return {h: DISABLED if h in down else ENABLED for h in hosts}


def system_status_patch(current: Any, wanted: Mapping[str, str]) -> dict[str, Any] | None:
    """The merge patch of ``data.nodes`` that changes only what differs, or None.

    ``current`` is the SystemStatus object as read (None when there is none yet); nodes the
    object lists that Flux does not know are left alone (another instance may own them).
    """
    data = current.get("data") if isinstance(current, Mapping) else None
    nodes = data.get("nodes") if isinstance(data, Mapping) else None
    nodes = untrusted.mapping(nodes)
    changes = {h: s for h, s in sorted(wanted.items()) if nodes.get(h) != s}
    return {"data": {"nodes": changes}} if changes else None


# ---- failure tolerance -------------------------------------------------------------------


@dataclass(frozen=True)
class Failures:
    """Which of a job's compute nodes failed in ``state``, and why (from Servers/ClientMount)."""

    state: str  # Setup or PreRun
    nodes: tuple[str, ...] = ()
    causes: Mapping[str, str] = field(default_factory=FrozenMap)  # node -> cause
    lustre: bool = False  # a Lustre file system failed to be created: never tolerated

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(sorted(set(self.nodes))))
        object.__setattr__(self, "causes", FrozenMap(dict(self.causes)))

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "nodes": list(self.nodes),
            "causes": dict(self.causes),
            "lustre": self.lustre,
        }


def tolerate(failures: Failures, tolerance: int, hosts: Sequence[str]) -> str | None:
    """None when the job may go on without ``failures.nodes``; otherwise why not (a note)."""
    nodes = ", ".join(failures.nodes) or "none identified"
    if failures.lustre:
        return (
            f"a Lustre file system failed to be created, which is never tolerated; nodes: {nodes}"
        )
    if not failures.nodes:
        return "no failed node could be identified"
    if len(failures.nodes) > tolerance:
        return (
            f"failed on {len(failures.nodes)} node(s), more than "
            f"dw_failure_tolerance={tolerance}: {nodes}"
        )
    if not set(hosts) - set(failures.nodes):
        return f"failed on every node of the job: {nodes}"
    return None


def setup_failures(
    servers: Iterable[Any], served: Mapping[str, str], hosts: Sequence[str]
) -> Failures:
    """Setup: the job's nodes whose rabbit did not create its part of the storage.

    A rabbit failed when its Servers ``status.allocationSets[].storage`` entry is missing
    or not ready, or when the driver error names it; ``lustre`` when a failed set is one of
    Lustre's (mgt, mdt, mgtmdt, ost).
    """
    failed: dict[str, str] = {}
    lustre = False
    for obj in servers:
        if not isinstance(obj, Mapping):
            continue
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        made = _created(status)
        error = _text(status.get("error"), 300) or ""
        for aset in spec.get("allocationSets") or []:
            if not isinstance(aset, Mapping):
                continue
            label = aset.get("label")
            for entry in aset.get("storage") or []:
                rabbit = _text(entry.get("name")) if isinstance(entry, Mapping) else None
                if rabbit is None or (label, rabbit) in made:
                    continue
                if made and rabbit not in error:
                    continue  # others made theirs, this one may still be on its way
                failed[rabbit] = error or f"no {label} storage on {rabbit}"
                if label in ("mgt", "mdt", "mgtmdt", "ost"):
                    lustre = True
    nodes = [h for h in hosts if served.get(h) in failed]
    causes = {h: f"rabbit {served[h]}: {failed[served[h]]}" for h in nodes}
    return Failures("Setup", tuple(nodes), causes, lustre)


def _created(status: Mapping[str, Any]) -> set[tuple[Any, str]]:
    made: set[tuple[Any, str]] = set()
    for aset in status.get("allocationSets") or []:
        if not isinstance(aset, Mapping):
            continue
        storage = aset.get("storage")
        for rabbit, info in storage.items() if isinstance(storage, Mapping) else ():
            ready = info.get("ready", True) if isinstance(info, Mapping) else False
            if isinstance(rabbit, str) and ready is not False:
                made.add((aset.get("label"), rabbit))
    return made


def mount_failures(clientmounts: Iterable[Any], hosts: Sequence[str]) -> Failures:
    """PreRun: the job's nodes whose ClientMount is not mounted and ready (or has an error)."""
    causes: dict[str, str] = {}
    seen: set[str] = set()
    for obj in clientmounts:
        if not isinstance(obj, Mapping):
            continue
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        node = _text(spec.get("node"))
        if node is None or node not in hosts:
            continue
        seen.add(node)
        error = status.get("error")
        mounts = status.get("mounts") if isinstance(status.get("mounts"), list) else []
        ok = bool(mounts) and all(
            isinstance(m, Mapping) and m.get("state") == "mounted" and m.get("ready") is True
            for m in mounts
        )
        if error or not ok:
            detail = error.get("userMessage") if isinstance(error, Mapping) else error
            shown = untrusted.readable(detail, 200) if isinstance(detail, str) else ""
            causes[node] = f"mount failed: {shown or 'not mounted'}"  # a NUL is shown as \x00
    return Failures("PreRun", tuple(causes), causes)


def unmount_failures(clientmounts: Iterable[Any], hosts: Sequence[str], state: str) -> Failures:
    """PostRun or Teardown (``state``): the job's nodes whose ClientMount has a mount that
    does not read ``unmounted``, or has an error.  A ClientMount already gone, or one whose
    every mount is unmounted, holds nothing.  Objects are untrusted: junk is skipped."""
    causes: dict[str, str] = {}
    for obj in clientmounts:
        if not isinstance(obj, Mapping):
            continue
        spec = untrusted.mapping(obj.get("spec"))
        status = untrusted.mapping(obj.get("status"))
        node = _text(spec.get("node"))
        if node is None or node not in hosts:
            continue
        error = status.get("error")
        mounts = untrusted.sequence(status.get("mounts"))
        held = any(untrusted.mapping(m).get("state") != "unmounted" for m in mounts)
        if error or held:
            detail = error.get("userMessage") if isinstance(error, Mapping) else error
            causes[node] = f"{UNMOUNT_FAILED}: {_text(detail, 200) or 'still mounted'}"
    return Failures(state, tuple(causes), causes)


#: nnf-sos's fatal error once it unmounted a job whose computes were fenced (STONITH):
#: ``WithUserMessage("Workflow failed: compute nodes %v were fenced during the job", ...)``
#: in internal/controller/nnf_access_controller.go (``detectFencedComputes``); Go's ``%v``
#: of a []string is ``[a b c]``.
_FENCED_RE = re.compile(r"compute nodes \[([^\]]*)\] were fenced during the job")


def fenced_nodes(message: str | None, hosts: Sequence[str]) -> tuple[str, ...]:
    """The job's nodes a workflow message says were fenced (none when it says nothing)."""
    found = _FENCED_RE.search(message) if isinstance(message, str) else None
    if found is None:
        return ()
    named = set(found.group(1).split())
    return tuple(h for h in hosts if h in named)


def hostlist(hosts: Iterable[str]) -> str:
    """Hosts as a comma-separated list (what resource.drain takes as targets)."""
    return ",".join(sorted(set(hosts)))


# ---- capacity truth ------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """A rabbit with less free space than the Servers resources explain.

    ``expected`` is its total device capacity less what every Servers resource allocates on
    it (Flux's jobs', other instances', persistent and system storage); ``free`` is Storage
    ``status.capacity``, what nnf-sos says is unallocated.  ``missing`` bytes are held by
    something no Servers accounts for: storage a failed Teardown left behind, a replaced
    drive, or an allocation made around DWS.
    """

    rabbit: str
    total: int
    expected: int
    free: int

    @property
    def missing(self) -> int:
        return self.expected - self.free

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "expected": self.expected, "free": self.free}


def capacity_drifts(
    storages: Iterable[Any], servers: Iterable[Any], threshold: int
) -> dict[str, Drift]:
    """Rabbit -> Drift for each rabbit missing more than ``threshold`` bytes.

    Only a shortfall counts: a Servers written but not yet allocated (a job between Proposal
    and Setup) makes ``expected`` lower than ``free`` for a moment, which is no alarm.  A
    Storage without devices or without a byte count in ``status.capacity`` is skipped, and so
    is a rabbit that is down or not reported yet (``RabbitHealth.down``): its free figure is not
    what it has (an Offline rabbit reports 0), and its whole pool is down in Fluxion anyway.
    """
    held: dict[str, int] = {}
    for obj in servers:
        for rabbit, size in servers_held(obj).items():
            held[rabbit] = held.get(rabbit, 0) + size
    drifts: dict[str, Drift] = {}
    for obj in storages:
        rabbit = rabbit_health(obj)
        status = untrusted.mapping(untrusted.mapping(obj).get("status"))
        total = device_capacity(status)
        free = untrusted.integer(status.get("capacity"), 0)
        if rabbit is None or rabbit.down or total is None or free is None:
            continue
        drift = Drift(rabbit.name, total, total - held.get(rabbit.name, 0), free)
        if drift.missing > threshold:
            drifts[rabbit.name] = drift
    return drifts
