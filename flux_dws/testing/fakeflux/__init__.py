# SPDX-License-Identifier: LGPL-3.0-only
"""fakeflux: Flux's job-manager with the dws jobtap plugin loaded, in one Python thread.

The flux-dws service's scenario tests run against it where flux-core is absent; the same
scenarios run against a real Flux instance with the jobtap/ plugin wherever it is present, so
any difference between the two is a bug here.  The plugin side speaks doc/protocol.rst over
an in-process :class:`~flux_dws.flux.transport.Transport` (``FakeFlux.connect``).
"""

from __future__ import annotations

from flux_dws.testing.fakeflux.jobrecords import job_phase, job_record
from flux_dws.testing.fakeflux.jobs import STATES, JobInfo
from flux_dws.testing.fakeflux.manager import DEFAULT_HOSTS, FakeFlux, SubmitError

__all__ = [
    "DEFAULT_HOSTS",
    "STATES",
    "FakeFlux",
    "JobInfo",
    "SubmitError",
    "job_phase",
    "job_record",
]
