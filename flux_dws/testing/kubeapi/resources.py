# SPDX-License-Identifier: LGPL-3.0-only
"""The resource table: which kinds the stand-in API server serves, as data.

Adding a resource is one line in RESOURCES.  Every served version of a group shares one stored
object (as a CRD with a no-op conversion does); the first version listed is the preferred one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from . import builtin
from .builtin import Column
from .errors import ApiError

__all__ = ["Column", "Resource", "RESOURCES", "by_plural", "groups", "lookup", "served"]

DWS_GROUP = "dataworkflowservices.github.io"
DWS_VERSIONS = ("v1alpha7", "v1alpha6")
NNF_GROUP = "nnf.cray.hpe.com"
NNF_VERSIONS = ("v1alpha10",)
CORE_VERSIONS = ("v1",)

NAMESPACED_VERBS = (
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
)


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group: str  # "" for the core group
    versions: tuple[str, ...]
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()
    #: the Table starts with the Name column (CRDs, most built-in kinds; events do not)
    name_column: bool = True
    #: field selectors the kind supports besides metadata.name and metadata.namespace
    field_labels: tuple[str, ...] = ()
    #: subresources the kind declares ("status": spec and status are written separately)
    subresources: tuple[str, ...] = ()
    #: the structural openAPIV3Schema of a kind served from its CRD (None: openapi's own)
    schema: dict | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def preferred_version(self) -> str:
        return self.versions[0]

    def api_version(self, version: str | None = None) -> str:
        """ "group/version" (or "v1" for core) for ``version`` or the preferred one."""
        version = version or self.preferred_version
        return f"{self.group}/{version}" if self.group else version

    @property
    def qualified(self) -> str:
        """plural.group, as the API server names a resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def kind_group(self) -> str:
        """Kind.group, as the API server names a kind in validation messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


def _col(name: str, path: str, kind: str = "string", description: str = "", priority: int = 0):
    return Column(name, kind, path, description, priority)


# Each CRD's additionalPrinterColumns, in its order and with its names (kubectl upper-cases
# them when printing); a CRD without any gets the API server's default "Age" column.
_AGE = (_col("Age", ".metadata.creationTimestamp", "date"),)
_CRD_AGE = (_col("AGE", ".metadata.creationTimestamp", "date"),)
_ERROR = _col("ERROR", ".status.error.severity")
_WORKFLOW_COLUMNS = (
    _col("STATE", ".status.state", description="Current state"),
    _col("READY", ".status.ready", "boolean", "True if current state is achieved"),
    _col("STATUS", ".status.status", description="Indicates achievement of current state"),
    _col("JOBID", ".spec.jobID", description="Job ID"),
    *_CRD_AGE,
    _col("DESIREDSTATE", ".spec.desiredState", description="Desired state", priority=1),
    _col(
        "DESIREDSTATECHANGE",
        ".status.desiredStateChange",
        "date",
        "Time of most recent desiredState change",
        1,
    ),
    _col(
        "ELAPSEDTIMELASTSTATE",
        ".status.elapsedTimeLastState",
        description="Duration of last state change",
        priority=1,
    ),
    _col("UID", ".spec.userID", description="UID", priority=1),
    _col("GID", ".spec.groupID", description="GID", priority=1),
)
_ALLOCATION_READY = _col(
    "READY", ".status.ready", "boolean", "True if allocation sets have been generated"
)
_STATUS = ("status",)


def _dws(plural: str, kind: str, *columns: Column, status: bool = False) -> Resource:
    return Resource(
        plural,
        kind,
        DWS_GROUP,
        DWS_VERSIONS,
        columns=columns or _AGE,
        subresources=_STATUS if status else (),
    )


RESOURCES: tuple[Resource, ...] = (
    _dws("workflows", "Workflow", *_WORKFLOW_COLUMNS),
    _dws("computes", "Computes"),
    _dws(
        "directivebreakdowns",
        "DirectiveBreakdown",
        _ALLOCATION_READY,
        _ERROR,
        *_CRD_AGE,
        status=True,
    ),
    _dws("servers", "Servers", _ALLOCATION_READY, _ERROR, *_CRD_AGE, status=True),
    _dws(
        "systemconfigurations",
        "SystemConfiguration",
        _col("READY", ".status.ready", "boolean", "True if SystemConfiguration is reconciled"),
        *_CRD_AGE,
        status=True,
    ),
    _dws("persistentstorageinstances", "PersistentStorageInstance", _ERROR, *_CRD_AGE, status=True),
    _dws("dwdirectiverules", "DWDirectiveRule"),
    _dws(
        "storages",
        "Storage",
        _col("State", ".spec.state", description="State of the storage resource"),
        _col("Status", ".status.status", description="Status of the storage resource"),
        _col("Mode", ".spec.mode", description="State of live updates"),
        *_AGE,
        status=True,
    ),
    _dws("systemstatuses", "SystemStatus"),
    _dws(
        "clientmounts",
        "ClientMount",
        _col("DESIREDSTATE", ".spec.desiredState", description="The desired state"),
        _col("READY", ".status.allReady", "boolean", "True if desired state is achieved"),
        _ERROR,
        *_CRD_AGE,
        status=True,
    ),
    Resource("nnfcontainerprofiles", "NnfContainerProfile", NNF_GROUP, NNF_VERSIONS, columns=_AGE),
    Resource(
        "nnfdatamovements",
        "NnfDataMovement",
        NNF_GROUP,
        NNF_VERSIONS,
        columns=(
            _col("STATE", ".status.state", description="Current state"),
            _col("STATUS", ".status.status", description="Status of current state"),
            _ERROR,
            *_CRD_AGE,
        ),
        subresources=_STATUS,
    ),
    Resource(
        "pods",
        "Pod",
        "",
        CORE_VERSIONS,
        short_names=("po",),
        columns=builtin.POD_COLUMNS,
        field_labels=builtin.POD_FIELDS,
        subresources=("status",),
    ),
    Resource(
        "secrets",
        "Secret",
        "",
        CORE_VERSIONS,
        columns=builtin.SECRET_COLUMNS,
        field_labels=("type",),
    ),
    Resource(
        "events",
        "Event",
        "",
        CORE_VERSIONS,
        short_names=("ev",),
        columns=builtin.EVENT_COLUMNS,
        name_column=False,
        field_labels=builtin.EVENT_FIELDS,
    ),
    # nnf-sos lists (and deletes) a workflow's container jobs as it finalizes any workflow:
    # batch Jobs, and the MPI operator's MPIJobs, whose CRD an NNF system installs with it
    Resource("jobs", "Job", "batch", CORE_VERSIONS, columns=_AGE, subresources=_STATUS),
    Resource("mpijobs", "MPIJob", "kubeflow.org", ("v2beta1",), columns=_AGE, subresources=_STATUS),
    # nnf-sos fronts a workflow's non-MPI container pods with a headless Service of its name
    Resource(
        "services",
        "Service",
        "",
        CORE_VERSIONS,
        short_names=("svc",),
        columns=_AGE,
        subresources=_STATUS,
    ),
    # nnf-sos's storage controller watches Nodes (its rabbits' labels and taints)
    Resource(
        "nodes",
        "Node",
        "",
        CORE_VERSIONS,
        namespaced=False,
        short_names=("no",),
        columns=_AGE,
        subresources=("status",),
    ),
    Resource(
        "namespaces",
        "Namespace",
        "",
        CORE_VERSIONS,
        namespaced=False,
        short_names=("ns",),
        columns=builtin.NAMESPACE_COLUMNS,
        field_labels=("status.phase",),
        subresources=("status",),
    ),
)

_BY_PLURAL = {r.plural: r for r in RESOURCES}


def register(extra: Iterable[Resource]) -> None:
    """Serve ``extra`` too, each in place of a kind of the same plural and group.

    Process-wide, for ``python -m flux_dws.testing.kubeapi --crd``: a server that serves the
    kinds of a system's CRD manifests runs in a process of its own.
    """
    global RESOURCES, _BY_PLURAL
    table = {(r.group, r.plural): r for r in RESOURCES}
    for resource in extra:
        table[(resource.group, resource.plural)] = resource
    RESOURCES = tuple(table.values())
    _BY_PLURAL = {r.plural: r for r in RESOURCES}


@contextlib.contextmanager
def serving(extra: Iterable[Resource]) -> Iterator[None]:
    """:func:`register` ``extra`` for a while, then serve what was served before: an
    in-process kubeapi (a test's) serves a system's CRDs only while it runs."""
    global RESOURCES, _BY_PLURAL
    saved = RESOURCES, _BY_PLURAL
    register(extra)
    try:
        yield
    finally:
        RESOURCES, _BY_PLURAL = saved


def by_plural(plural: str) -> Resource:
    """The resource named ``plural``; 404 as the API server answers for an unknown one."""
    try:
        return _BY_PLURAL[plural]
    except KeyError:
        raise ApiError(
            404, "NotFound", "the server could not find the requested resource"
        ) from None


def served(group: str, version: str) -> tuple[Resource, ...]:
    """Resources served under group/version ("" is the core group)."""
    return tuple(r for r in RESOURCES if r.group == group and version in r.versions)


def lookup(group: str, version: str, plural: str) -> Resource:
    for resource in served(group, version):
        if resource.plural == plural:
            return resource
    raise ApiError(404, "NotFound", "the server could not find the requested resource")


def groups() -> dict[str, tuple[str, ...]]:
    """Named groups (core excluded) -> versions, preferred first, in table order."""
    found: dict[str, list[str]] = {}
    for resource in RESOURCES:
        if resource.group:
            versions = found.setdefault(resource.group, [])
            versions.extend(v for v in resource.versions if v not in versions)
    return {group: tuple(versions) for group, versions in found.items()}
