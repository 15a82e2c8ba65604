# SPDX-License-Identifier: LGPL-3.0-only
"""What the service keeps in memory about each job, and the shapes its parts share.

All of it is touched on the loop's thread only, and a job's entry (``Tracked``) is written by
the loop alone (flux_dws.service.service), from observations and from the outcomes its
actions report (flux_dws.service.outcome): handlers get a ``Seen``, never the entry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flux_dws.base.frozen import SLOTS
from flux_dws.base.loop import Timer
from flux_dws.core.failing import Refusal
from flux_dws.core.health import Failures
from flux_dws.core.jobview import JobView, ProposalInfo
from flux_dws.core.request import DwRequest
from flux_dws.core.states import State
from flux_dws.core.workflow import WorkflowView


@dataclass(**SLOTS)
class Tracked:
    """What the service knows about one job (or one orphaned workflow)."""

    jobid: int
    record: dict[str, Any] | None = None
    workflow: WorkflowView | None = None
    # the workflow object: its parts read after the view (core.workflow.kept), or all of it
    # when it could not be read (``unreadable``)
    raw: dict[str, Any] | None = None
    proposal: ProposalInfo | None = None
    failures: Failures | None = None  # which nodes failed Setup/PreRun (act.ReadFailures)
    request: tuple[DwRequest | None, str] | None = None  # parsed once: attributes never change
    deleted: str = ""  # uid of the workflow already deleted (its DELETED event may lag)
    # events posted and not yet in Flux's record: name -> (context, the one it replaced)
    posting: dict[str, tuple[Mapping[str, Any], Any]] = field(default_factory=dict)
    busy: bool = False  # an action chain is in flight
    dirty: bool = False  # something changed while busy: decide again after
    timer: Timer | None = None
    retry: float = 0.0  # the backoff of the last failure (0: the last chain went through)
    observed: float = 0.0  # monotonic time of the last observation (job record or workflow)
    failing_since: float | None = None  # loop time a Kubernetes call first failed, in a row
    refusal: Refusal | None = None  # found while acting: decide() fails the job with it
    asking: Any = None  # the desiredState patch in flight (service.outcome.Asking), if any
    unreadable: str = ""  # why the latest version of the workflow could not be read
    unreadable_since: float | None = None  # loop time it first could not be read (in a row)
    alarmed: str = ""  # the unreadable problem already reported


@dataclass(frozen=True)
class Seen:
    """The inputs a decision was made from, carried with each action of its chain.

    An executor acts on these, not on the job's live entry: the workflow view and the
    Proposal it reads are the ones ``decide()`` saw, even if newer ones arrive while the chain
    runs (the next decision sees those).  All of it is immutable, or replaced whole.
    """

    job: JobView
    workflow: WorkflowView | None
    raw: Mapping[str, Any] | None  # what is kept of the object ``workflow`` was read from
    observed: float  # monotonic time of the observation that led to the decision
    deleted: str = ""  # uid of the workflow already deleted (its DELETED event may lag)
    unreadable: str = ""  # why the workflow's latest version could not be read


@dataclass
class Metrics:
    """Figures for benchmarks and `flux dws` status: reactions, actions and failures."""

    # (next state, seconds from the observation that allowed it to the patch being sent)
    reactions: list[tuple[State, float]] = field(default_factory=list)
    actions: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)


class Attempts:
    """How many times in a row one kind of read failed for one job (record reads, which are
    given up after ``limit`` failures in a row so the job goes on without them).

    Keys are (job, what): each state's copies count apart from the other's.  A success
    clears the count; a job the service forgets takes its counts with it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._failed: dict[tuple[int, str], int] = {}

    def failed(self, jobid: int, what: str) -> bool:
        """Count one more failure of ``what``; True (and the count cleared) at the limit."""
        key = (jobid, what)
        count = self._failed.get(key, 0) + 1
        if count < self.limit:
            self._failed[key] = count
            return False
        self._failed.pop(key, None)
        return True

    def succeeded(self, jobid: int, what: str) -> None:
        self._failed.pop((jobid, what), None)

    def forget(self, jobid: int) -> None:
        for key in [k for k in self._failed if k[0] == jobid]:
            del self._failed[key]

    def __len__(self) -> int:
        return len(self._failed)
