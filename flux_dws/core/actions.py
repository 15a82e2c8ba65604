# SPDX-License-Identifier: LGPL-3.0-only
"""What the lifecycle core decides: actions, plain data that the service's handlers carry out
(flux_dws/service/actions.py).  Each is idempotent, so a restarted service may repeat any."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from flux_dws.core.jobview import EXCEPTION_TYPE
from flux_dws.core.release import HoldStorage, MarkReleased, RecordRelease, ReturnStorage
from flux_dws.core.states import State


@dataclass(frozen=True)
class CreateWorkflow:
    """Create the job's workflow in Proposal (idempotent: an existing one of ours is kept)."""

    directives: tuple[str, ...]
    userid: int
    groupid: int


@dataclass(frozen=True)
class SetDesiredState:
    """Ask DWS for ``state``; for Setup, first tell DWS where the job runs (``assign``).

    ``assign`` holds the job's compute nodes: they go into the workflow's Computes and each
    rabbit's share of the storage into the Servers resources (on the rabbits Fluxion
    allocated, when ``rabbits`` says; else as the SystemConfiguration maps the nodes), then
    the state is asked for, in one go.  Computes is only read from DataIn on; writing it
    with the Servers (as flux-coral2 does) makes Setup -> DataIn a single patch.
    """

    state: State
    hurry: bool = False
    assign: tuple[str, ...] = ()
    rabbits: tuple[tuple[str, str], ...] = ()  # (host, rabbit) from the job's R, if Fluxion


@dataclass(frozen=True)
class ReadProposal:
    """Read the DirectiveBreakdowns and the pinned container profile into JobView.proposal."""


@dataclass(frozen=True)
class ReleaseDependency:
    """Put the storage needs into the jobspec and remove the job's dependency."""

    jobspec_update: Mapping[str, Any]


@dataclass(frozen=True)
class FinishProlog:
    """End the prolog hold: with the workflow's environment, or failed (the job never runs)."""

    success: bool
    env: Mapping[str, str] = field(default_factory=dict)
    token_secret: tuple[str, str] | None = None  # (namespace, name) -> DW_WORKFLOW_TOKEN
    token_required: bool = False  # copy-offload: no token, no start


@dataclass(frozen=True)
class FinishEpilog:
    """End the epilog hold: the workflow is gone, nothing more to wait for."""


@dataclass(frozen=True)
class RaiseException:
    note: str
    severity: int = 0
    type: str = EXCEPTION_TYPE


@dataclass(frozen=True)
class PostEvent:
    """Record something on the job's eventlog (for users, and for the next decide()).

    ``wait``: the chain goes on only once Flux has taken the event.  For the events the
    workflow's next move depends on after a restart (an abort's reason before Teardown, the
    release before DataOut): a service killed between the two must not leave the workflow
    ahead of the story on the job.  Other posts go on at once (they are off the critical path).
    """

    name: str
    context: Mapping[str, Any]
    wait: bool = False


@dataclass(frozen=True)
class RecordCopies:
    """Read the workflow's NnfDataMovements and post one ``dws-datamovement`` per copy
    directive of ``state`` in ``indices`` (in order); a failed copy fails the job with a note
    naming the directive and its first error (the next decision sees that exception)."""

    state: State
    indices: tuple[int, ...]


@dataclass(frozen=True)
class SaveOutput:
    """Save the containers' exit codes and log tails in the job's KVS, then post
    ``dws-container`` (``event`` plus each container's exit code and reason).  Decided before
    anything that could remove the pods (Teardown), and only while dws-container is not on the
    job, so a restart in between saves the same output again, never twice over."""

    event: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteWorkflow:
    """Remove our finalizer and delete the workflow (its companions go with it)."""


@dataclass(frozen=True)
class ReadFailures:
    """Find which compute nodes failed ``state`` (Servers in Setup, ClientMounts in PreRun,
    ClientMounts still mounted in Teardown) into JobView.failures."""

    state: State


@dataclass(frozen=True)
class DrainNodes:
    """Drain ``hosts`` in Flux with ``reason`` (a job's failed or stuck nodes)."""

    hosts: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ForceReady:
    """Write Computes without the failed nodes, then set spec.forceReady on the workflow."""

    computes: tuple[str, ...]


@dataclass(frozen=True)
class WakeAt:
    """Call decide() again at this time even if nothing else happens (a deadline)."""

    time: float


Action = Union[
    CreateWorkflow,
    SetDesiredState,
    ReadProposal,
    ReleaseDependency,
    FinishProlog,
    FinishEpilog,
    RaiseException,
    PostEvent,
    RecordCopies,
    SaveOutput,
    DeleteWorkflow,
    ReadFailures,
    DrainNodes,
    ForceReady,
    WakeAt,
    HoldStorage,
    ReturnStorage,
    MarkReleased,
    RecordRelease,
]
