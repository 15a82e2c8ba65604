# SPDX-License-Identifier: LGPL-3.0-only
"""Instance identity: the names and labels that make a workflow ours.

Two Flux instances may share one Kubernetes namespace.  Every object flux-dws creates carries
the instance's identity in a label, and its workflow names embed it, so an instance only ever
lists, adopts or sweeps what it created itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from flux_dws.base import untrusted

GROUP = "flux-dws.flux-framework.org"
INSTANCE_LABEL = f"{GROUP}/instance"
JOBID_LABEL = f"{GROUP}/jobid"
FINALIZER = f"{GROUP}/finalizer"
WLM_ID = "flux"

# A label value and a DNS-1123 label both allow this; keep room for "fluxjob-" and a job id.
IDENTITY_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
IDENTITY_HELP = "1-40 lower-case letters, digits or '-', starting and ending with a letter or digit"


def check_identity(identity: str) -> str:
    """Return ``identity`` if it is valid, else raise ValueError saying what is allowed."""
    if not isinstance(identity, str) or not IDENTITY_RE.fullmatch(identity):
        raise ValueError(f"invalid instance identity {identity!r}: must be {IDENTITY_HELP}")
    return identity


def default_identity(hostname: str, owner_uid: int, parent_jobid: str = "") -> str:
    """A stable identity for an instance that was not given one.

    Derived from what survives a restart of the same instance: the rank-0 host, the instance
    owner and, for a nested instance, its job id in the parent.
    """
    short = re.sub(r"[^a-z0-9-]", "-", hostname.split(".")[0].lower()).strip("-")[:24] or "flux"
    digest = hashlib.sha256(f"{hostname}\0{owner_uid}\0{parent_jobid}".encode()).hexdigest()[:8]
    return f"{short}-{digest}".strip("-")


def workflow_name(identity: str, jobid: int) -> str:
    """The workflow for ``jobid``: a valid Kubernetes name that embeds the instance."""
    return f"fluxjob-{identity}-{jobid}"


def ownership_labels(identity: str, jobid: int) -> dict[str, str]:
    """Labels on every object flux-dws creates for a job."""
    return {INSTANCE_LABEL: identity, JOBID_LABEL: str(jobid)}


def instance_selector(identity: str) -> str:
    """The label selector that lists only this instance's objects."""
    return f"{INSTANCE_LABEL}={identity}"


def owned_jobid(obj: Mapping[str, Any], identity: str) -> int | None:
    """The job id of a workflow this instance created, or None if it is not ours.

    Everything about it must agree: the instance label, the job id label, spec.jobID and the
    name this instance gives that job.  A look-alike name or a stray label is not enough, so
    another instance's workflows (or anyone's mislabelled one) are never adopted or swept.
    """
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    labels = meta.get("labels")
    if not isinstance(labels, Mapping) or labels.get(INSTANCE_LABEL) != identity:
        return None
    label, value = labels.get(JOBID_LABEL), spec.get("jobID")
    jobid = untrusted.decimal(label)
    if jobid is None or isinstance(value, bool):
        return None
    if str(value) != label or meta.get("name") != workflow_name(identity, jobid):
        return None
    return jobid
