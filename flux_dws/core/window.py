# SPDX-License-Identifier: LGPL-3.0-only
"""The Proposal window: how many #DW jobs may have a workflow in Proposal at once.

A burst of submissions (a thousand jobs in a second) must not turn into a thousand workflow
creations at once: the DWS controllers and the service would then work on every job a little
and finish none, and jobs that are already moving (Setup, PreRun, Teardown) would wait behind
the crowd.  So a job may create its workflow only while fewer than ``[dws] max-proposals``
jobs are in Proposal (their workflow created or being created, the job not yet released to
the scheduler); the others wait in DEPEND, in the order they asked, and take the slots as
they free.  Jobs already in Proposal when the service starts always count, so a restart never
blocks a workflow that exists.  Pure bookkeeping: the service reports, this decides.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class ProposalWindow:
    """Which jobs hold a Proposal slot and which wait for one (``limit`` 0: no limit)."""

    limit: int
    holders: set[int] = field(default_factory=set)
    waiting: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def ask(self, jobid: int) -> bool:
        """May ``jobid`` create its workflow now?  If not, it waits in line (once): a job
        never takes a slot from one that asked before it."""
        if jobid in self.holders:
            return True
        if self.limit and self._ahead_of(jobid) >= self.limit - len(self.holders):
            self.waiting.setdefault(jobid, None)
            return False
        self.waiting.pop(jobid, None)
        self.holders.add(jobid)
        return True

    def entered(self, jobid: int) -> None:
        """``jobid`` is in Proposal (its workflow exists, the job is in DEPEND): it holds a
        slot even past the limit, e.g. a workflow found at start-up."""
        self.waiting.pop(jobid, None)
        self.holders.add(jobid)

    def leave(self, jobid: int) -> list[int]:
        """``jobid`` needs no slot and no place in line any more (released to the scheduler,
        gone, or no longer about to create a workflow).  Returns the waiting jobs that fit
        in the free slots now, first in line first: the ones to wake."""
        self.waiting.pop(jobid, None)
        self.holders.discard(jobid)
        # Even when jobid held no slot: it may have been woken for a slot it now leaves free.
        free = len(self.waiting) if not self.limit else self.limit - len(self.holders)
        return list(itertools.islice(self.waiting, max(free, 0)))

    def _ahead_of(self, jobid: int) -> int:
        """How many waiting jobs asked before ``jobid`` (all of them, if it is not waiting)."""
        if jobid not in self.waiting:
            return len(self.waiting)
        for ahead, waiting in enumerate(self.waiting):
            if waiting == jobid:
                return ahead
        raise AssertionError("unreachable: jobid is waiting")
