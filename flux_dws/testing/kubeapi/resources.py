"""The resource table: which kinds the stand-in API server serves, as data.

Adding a resource is one line in RESOURCES.  Every served version of a group shares one stored
object (as a CRD with a no-op conversion does); the first version listed is the preferred one.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ApiError

DWS_GROUP = "dataworkflowservices.github.io"
DWS_VERSIONS = ("v1alpha7", "v1alpha6")
NNF_GROUP = "nnf.cray.hpe.com"
NNF_VERSIONS = ("v1alpha10",)
CORE_VERSIONS = ("v1",)

NAMESPACED_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class Column:
    """An additionalPrinterColumn: what `kubectl get` shows via the Table response."""

    name: str
    type: str  # string | boolean | integer | date
    json_path: str  # dotted path from the object root, e.g. ".status.state"
    description: str = ""
    priority: int = 0  # 0: always shown; 1: only with -o wide


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group: str  # "" for the core group
    versions: tuple[str, ...]
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()

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


_WORKFLOW_COLUMNS = (
    Column("STATE", "string", ".status.state", "Current state"),
    Column("READY", "boolean", ".status.ready", "True if current state is achieved"),
    Column("STATUS", "string", ".status.status", "Indicates achievement of current state"),
    Column("JOBID", "string", ".spec.jobID", "Job ID"),
    Column("AGE", "date", ".metadata.creationTimestamp"),
    Column("DESIREDSTATE", "string", ".spec.desiredState", "Desired state", 1),
    Column("DESIREDSTATECHANGE", "date", ".status.desiredStateChange", "", 1),
    Column("ELAPSEDTIMELASTSTATE", "string", ".status.elapsedTimeLastState", "", 1),
    Column("UID", "string", ".spec.userID", "UID", 1),
    Column("GID", "string", ".spec.groupID", "GID", 1),
)
_AGE = (Column("AGE", "date", ".metadata.creationTimestamp"),)


def _dws(plural: str, kind: str, *columns: Column, short: tuple[str, ...] = ()) -> Resource:
    return Resource(plural, kind, DWS_GROUP, DWS_VERSIONS, True, short, columns or _AGE)


RESOURCES: tuple[Resource, ...] = (
    _dws("workflows", "Workflow", *_WORKFLOW_COLUMNS),
    _dws("computes", "Computes"),
    _dws("directivebreakdowns", "DirectiveBreakdown", short=("dbd",)),
    _dws("servers", "Servers"),
    _dws("systemconfigurations", "SystemConfiguration"),
    _dws("persistentstorageinstances", "PersistentStorageInstance", short=("psi",)),
    _dws("dwdirectiverules", "DWDirectiveRule"),
    _dws(
        "storages",
        "Storage",
        Column("STATE", "string", ".spec.state", "State of the storage resource"),
        Column("STATUS", "string", ".status.status", "Status of the storage resource"),
        Column("MODE", "string", ".spec.mode", "State of live updates"),
        *_AGE,
    ),
    _dws("systemstatuses", "SystemStatus"),
    _dws(
        "clientmounts",
        "ClientMount",
        Column("DESIREDSTATE", "string", ".spec.desiredState", "The desired state"),
        Column("READY", "boolean", ".status.allReady", "True if desired state is achieved"),
        Column("ERROR", "string", ".status.error.severity"),
        *_AGE,
    ),
    Resource("nnfcontainerprofiles", "NnfContainerProfile", NNF_GROUP, NNF_VERSIONS, columns=_AGE),
    Resource("nnfdatamovements", "NnfDataMovement", NNF_GROUP, NNF_VERSIONS, columns=_AGE),
    Resource("pods", "Pod", "", CORE_VERSIONS, short_names=("po",), columns=_AGE),
    Resource(
        "secrets",
        "Secret",
        "",
        CORE_VERSIONS,
        columns=(Column("TYPE", "string", ".type"), *_AGE),
    ),
    Resource("events", "Event", "", CORE_VERSIONS, short_names=("ev",), columns=_AGE),
    Resource(
        "namespaces",
        "Namespace",
        "",
        CORE_VERSIONS,
        namespaced=False,
        short_names=("ns",),
        columns=(Column("STATUS", "string", ".status.phase"), *_AGE),
    ),
)

_BY_PLURAL = {r.plural: r for r in RESOURCES}


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
