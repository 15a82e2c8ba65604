# SPDX-License-Identifier: LGPL-3.0-only
"""What the lifecycle core decides from, on the Flux side: the job as Flux shows it and as
flux-dws recorded it on the job's own eventlog (JobView), where the plugin holds it (JobPhase),
and its first fatal exception."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from flux_dws.base.frozen import SLOTS
from flux_dws.base.fsd import format_fsd
from flux_dws.core.containeroutcome import ContainerState
from flux_dws.core.health import Failures
from flux_dws.core.request import DwRequest
from flux_dws.core.states import State
from flux_dws.core.storage import AllocationNeed, jobspec_storage

#: Exception type flux-dws raises on jobs.
EXCEPTION_TYPE = "dws"
#: Fatal exception types that end a job's workflow at once, even after the job has run.
#: Any other fatal exception after the job started (e.g. its time limit) still lets the
#: workflow finish PostRun and DataOut, so the job's data is copied out.
ABORT_TYPES = frozenset({"cancel", EXCEPTION_TYPE})


class JobPhase(str, Enum):
    """Where the jobtap plugin holds the job (or that nothing holds it any more)."""

    DEPEND = "depend"  # held in DEPEND until Proposal is ready and the needs are in the jobspec
    SCHED = "sched"  # dependency released; waiting for resources
    PROLOG = "prolog"  # allocated; prolog held until PreRun is ready
    RUN = "run"  # prolog finished: tasks starting or started (once finished, not yet released)
    EPILOG = "epilog"  # released or never started; epilog held until the workflow is gone
    GONE = "gone"  # inactive or unknown: nothing holds it (an orphan's workflow)


@dataclass(frozen=True)
class JobException:
    """The first fatal exception seen on the job."""

    type: str
    severity: int = 0
    note: str = ""

    @property
    def aborts(self) -> bool:
        return self.severity == 0 and self.type in ABORT_TYPES


@dataclass(frozen=True)
class Refusal:
    """Why acting for the job can never succeed: the job fails with it (found by the
    service while acting; flux_dws.core.failing judges and words it).

    ``state``: the state the failure belongs to (default: the one the workflow is in, or
    Proposal); ``directive`` the #DW directive it is about; ``step`` as failure_note takes it
    (flux_dws.core.messages)."""

    reason: str
    state: State | None = None
    directive: str = ""
    step: str | None = None


@dataclass(frozen=True)
class ProposalInfo:
    """What flux-dws reads once Proposal is ready (breakdowns, pinned container profile)."""

    needs: tuple[AllocationNeed, ...] = ()
    container_timeouts: Mapping[str, float] = field(default_factory=dict)  # prerun/postrun

    def to_json(self) -> dict[str, Any]:
        return {
            "storage": jobspec_storage(self.needs),
            "needs": [n.to_json() for n in self.needs],
            "container_timeouts": {k: format_fsd(v) for k, v in self.container_timeouts.items()},
        }


@dataclass(frozen=True, **SLOTS)
class JobView:
    """What Flux says about the job, and what flux-dws recorded on it earlier."""

    jobid: int
    phase: JobPhase
    userid: int
    groupid: int
    request: DwRequest | None = None
    request_error: str = ""  # why system.dw / dw_timeout were refused, when they were
    hosts: tuple[str, ...] = ()  # compute nodes, once allocated
    rabbits: tuple[tuple[str, str], ...] = ()  # (host, rabbit) Fluxion allocated, if it did
    resources: Any = None  # the jobspec's resources (updates included)
    constraints: Any = None  # attributes.system.constraints as submitted (RFC 31), if any
    started: bool = False  # the job's tasks were started
    exception: JobException | None = None  # first fatal exception, from anyone
    # recorded by flux-dws as job events (so they survive a restart of the service):
    workflow_created: bool = False  # dws-workflow
    proposal_recorded: bool = False  # dws-proposal
    posted_state: State | None = None  # dws-state: the desiredState last recorded
    deadline: float | None = None  # dws-state: absolute deadline for posted_state
    teardown_reason: str = ""  # dws-state Teardown: why flux-dws aborted the workflow
    transient: tuple[State, float] | None = None  # dws-transient: (state, since)
    container_recorded: ContainerState | None = None  # dws-container
    tolerated: tuple[str, ...] = ()  # dws-tolerated: nodes the job goes on without
    teardown_failed: bool = False  # dws-teardown-failed
    copies_recorded: tuple[State, int] | None = None  # dws-datamovement: latest (state, index)
    release: Mapping[str, Any] | None = None  # dws-release: the nodes go back early
    ssd: tuple[str, ...] = ()  # the job's ssd vertex paths in Fluxion's graph (from its R)
    # read by the service from Kubernetes once Proposal is ready (re-read after a restart):
    proposal: ProposalInfo | None = None
    # read by the service when Setup or PreRun failed (ReadFailures; re-read after a restart):
    failures: Failures | None = None
    # found by the service while acting: the job can never go on (core.failing); decide()
    # raises it as the job's exception
    refusal: Refusal | None = None

    @property
    def active(self) -> bool:
        return self.phase is not JobPhase.GONE
