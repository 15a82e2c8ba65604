# SPDX-License-Identifier: LGPL-3.0-only
"""Early release: a job's compute nodes go back once PostRun has unmounted its storage.

With ``[dws] release-nodes = "after-unmount"`` (and no ``-S dw_release=after-teardown`` on the
job), a job whose PostRun is ready and whose every ClientMount reads unmounted has its epilog
finished at once: its nodes return to the scheduler while DataOut and Teardown go on on the
rabbits.  The job's Fluxion ``ssd`` vertices are marked down first (``HoldStorage``), so the
capacity it held stays out of reach until Teardown is done (``ReturnStorage``); Fluxion's
``set_status`` leaves an allocated vertex's schedule alone and its satisfiability check ignores
status, so the free still works and a queued job needing that rabbit waits rather than fails
(doc/guide/admin.rst, "Early release").

Once the epilog is finished the job is inactive: nothing more can be posted on its eventlog and
the jobtap plugin no longer holds it.  What the rest of the lifecycle needs is therefore written
on the workflow itself, as the :data:`RELEASE_ANNOTATION` (:class:`ReleaseMark`), before the
epilog is finished; a restarted service reads it back from Kubernetes, so the remaining steps
are decided from the workflow alone (:func:`flux_dws.core.lifecycle.decide` on a gone job).
How DataOut and Teardown ended is saved in the job's KVS (``RecordRelease``,
:data:`RELEASE_KEY`), where ``flux dws status JOBID`` finds it.

Everything here is pure; the annotation is untrusted (anyone who may edit the workflow may
change it), so :func:`read_mark` never raises.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flux_dws.base import untrusted
from flux_dws.base.frozen import FrozenMap
from flux_dws.core.copies import UNKNOWN, CopyRecord, copy_note
from flux_dws.core.identity import FINALIZER, GROUP

#: The workflow annotation that says its job's nodes went back early, and what is still held.
RELEASE_ANNOTATION = f"{GROUP}/released"
#: The job's KVS key (under its job directory) where DataOut's and Teardown's outcomes go.
RELEASE_KEY = "dws.release"
#: The most ssd paths one mark may carry (a job holds at most one part per GiB it asked for).
MAX_PATHS = 4096


@dataclass(frozen=True)
class ReleaseMark:
    """What the workflow carries once its job's nodes were given back early."""

    ssd: tuple[str, ...] = ()  # Fluxion ssd vertex paths held down until Teardown is done
    dataout: float = math.inf  # DataOut's timeout (seconds) for this job
    teardown: float = math.inf  # Teardown's timeout (seconds) for this job
    drained: tuple[str, ...] = ()  # nodes drained because their storage never unmounted
    problem: str = ""  # why the annotation could not be read whole (then nothing is held)

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "ssd": list(self.ssd),
                "timeouts": {
                    "dataout": _seconds(self.dataout),
                    "teardown": _seconds(self.teardown),
                },
                "drained": list(self.drained),
            },
            separators=(",", ":"),
            sort_keys=True,
        )


def _seconds(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def _timeout(value: Any) -> float:
    if value == "inf":
        return math.inf
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and math.isfinite(value) and value > 0:
        return float(value)
    raise ValueError(f"bad timeout {untrusted.field(str(value))!r}")


def _strings(value: Any, what: str, paths: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_PATHS:
        raise ValueError(f"{what} is not a list of at most {MAX_PATHS} strings")
    for item in value:
        if not isinstance(item, str) or not item or (paths and not item.startswith("/")):
            shown = untrusted.text(str(item), 80)
            raise ValueError(f"{what} holds {shown!r}, not a {'path' if paths else 'name'}")
    return tuple(sorted(set(value)))


def read_mark(annotations: Mapping[str, str]) -> ReleaseMark | None:
    """The release mark of a workflow, None when it has none.

    A mark that cannot be read is still a mark (the job's nodes are gone: the workflow must
    be finished without them), with ``problem`` saying what was wrong and nothing held.
    """
    text = annotations.get(RELEASE_ANNOTATION)
    if text is None:
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        timeouts = data.get("timeouts")
        if not isinstance(timeouts, dict):
            raise ValueError("timeouts is not an object")
        return ReleaseMark(
            ssd=_strings(data.get("ssd", []), "ssd", paths=True),
            dataout=_timeout(timeouts.get("dataout", "inf")),
            teardown=_timeout(timeouts.get("teardown", "inf")),
            drained=_strings(data.get("drained", []), "drained", paths=False),
        )
    except (ValueError, TypeError, RecursionError) as exc:
        why = untrusted.text(f"annotation {RELEASE_ANNOTATION} unreadable: {exc}", 300)
        return ReleaseMark(problem=why)


@dataclass(frozen=True)
class HoldStorage:
    """Mark the job's ssd vertices down in Fluxion (before its resources are freed), so the
    rabbit capacity it held is given to nobody until its Teardown is done.  Idempotent."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class ReturnStorage:
    """Mark the ssd vertices of a released job up again once its Teardown is over."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class MarkReleased:
    """Write the release mark on the workflow (before the epilog is finished)."""

    mark: ReleaseMark


@dataclass(frozen=True)
class RecordRelease:
    """Save how a released job's DataOut (each copy_out) or Teardown ended in the job's KVS
    at :data:`RELEASE_KEY` (merged with what is there), for ``flux dws status JOBID``."""

    state: str  # DataOut or Teardown
    outcome: Mapping[str, Any] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", FrozenMap(dict(self.outcome)))


def failed_reason(outcome: Mapping[str, Any], records: Sequence[CopyRecord], jobid: int) -> str:
    """Why a released job failed after its nodes went back (its DataOut failed), in the one
    form: the first failed copy's note, which names the directive and the file, else the
    state's own note.  The job is inactive by then and Flux's ``result`` stays COMPLETED:
    this is the ``reason`` saved beside ``result`` FAILED, which ``flux dws status`` shows."""
    failed = next((r for r in records if r.failed and r.status != UNKNOWN), None)
    if failed is not None:
        return copy_note(failed, jobid)
    return untrusted.field(outcome.get("message"))


def held_parts(workflows: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Every ssd path a released workflow still holds down, from the workflow objects as
    listed (one that flux-dws cannot otherwise read included): what a (re)started service
    holds again before any health pass may mark a rabbit's pool up.

    A workflow deleted outside flux-dws (being deleted, our finalizer gone) holds nothing: its
    job's decisions give nothing back either (doc/guide/admin.rst, "Early release").  A mark
    whose paths remain held after Teardown is harmless: ReturnStorage gives them back."""
    paths: set[str] = set()
    for obj in workflows:
        meta = untrusted.mapping(obj.get("metadata"))
        finalizers = untrusted.sequence(meta.get("finalizers"))
        if meta.get("deletionTimestamp") and FINALIZER not in finalizers:
            continue
        annotations = untrusted.mapping(meta.get("annotations"))
        mark = read_mark({k: v for k, v in annotations.items() if isinstance(v, str)})
        if mark is not None:
            paths.update(mark.ssd)
    return tuple(sorted(paths))


def _rabbit_of(path: str) -> str:
    """``/<cluster>/<rabbit>/ssd<N>`` -> ``<rabbit>``."""
    return posixpath.basename(posixpath.dirname(path))


class PoolMarks:
    """Which ssd vertices to mark up or down in Fluxion, combining the health monitor's marks
    of each rabbit (down, or up but some parts kept for capacity drift) with the parts held
    for released jobs.  A held part stays down whatever its rabbit, and a part given back
    stays down while its rabbit keeps it.  Pure bookkeeping: each method answers the
    ``set_status`` calls to make (path -> up); the adapters make them."""

    def __init__(self) -> None:
        self.held: set[str] = set()  # ssd paths held for released jobs
        self.kept: dict[str, frozenset[str]] = {}  # rabbit -> paths its marking keeps down

    def rabbit(self, rabbit: str, paths: Sequence[str], kept: Iterable[str]) -> dict[str, bool]:
        """The rabbit is marked: ``kept`` of its ``paths`` down, the others up, but never a
        held part (it is down already and stays so)."""
        self.kept[rabbit] = frozenset(kept)
        return {p: p not in self.kept[rabbit] for p in paths if p not in self.held}

    def hold(self, paths: Iterable[str]) -> dict[str, bool]:
        """Hold ``paths`` down; those held already are down already (nothing to send)."""
        fresh = {p: False for p in paths if p not in self.held}
        self.held.update(fresh)
        return fresh

    def give_back(self, paths: Iterable[str]) -> dict[str, bool]:
        """Teardown is over: ``paths`` up again, but those their rabbit keeps down."""
        paths = list(paths)
        self.held.difference_update(paths)
        return {p: True for p in paths if p not in self.kept.get(_rabbit_of(p), ())}


__all__ = [
    "RELEASE_ANNOTATION",
    "RELEASE_KEY",
    "HoldStorage",
    "MarkReleased",
    "PoolMarks",
    "RecordRelease",
    "ReleaseMark",
    "failed_reason",
    "ReturnStorage",
    "held_parts",
    "read_mark",
]
