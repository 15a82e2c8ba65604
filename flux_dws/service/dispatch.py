# SPDX-License-Identifier: LGPL-3.0-only
"""Which code carries out each lifecycle action: one explicit table.

Every action type of flux_dws.core.lifecycle has exactly one handler here, checked when this
module is imported, so an action added to the core without its handler stops the service from
starting rather than failing a job later.  ``WakeAt`` is the loop's own (a timer), not an
action for the executor.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from flux_dws.core import actions as act
from flux_dws.core import release as rl
from flux_dws.service import actions, recording, release
from flux_dws.service.outcome import Handler

HANDLERS: Mapping[type, Handler] = {
    act.CreateWorkflow: actions.create_workflow,
    act.SetDesiredState: actions.set_desired_state,
    act.ReadProposal: actions.read_proposal,
    act.ReleaseDependency: actions.release_dependency,
    act.FinishProlog: actions.finish_prolog,
    act.FinishEpilog: actions.finish_epilog,
    act.RaiseException: actions.raise_exception,
    act.PostEvent: actions.post_event,
    act.RecordCopies: recording.record_copies,
    act.SaveOutput: recording.save_output,
    act.DeleteWorkflow: actions.delete_workflow,
    act.ReadFailures: actions.read_failures,
    act.DrainNodes: actions.drain_nodes,
    act.ForceReady: actions.force_ready,
    rl.HoldStorage: release.hold_storage,
    rl.ReturnStorage: release.return_storage,
    rl.MarkReleased: release.mark_released,
    rl.RecordRelease: release.record_release,
}
#: Actions the loop itself handles.
LOOP_ACTIONS = frozenset({act.WakeAt})


def _check(handlers: Mapping[type, Handler]) -> None:
    """Raise ImportError unless ``handlers`` covers exactly the core's action types."""
    declared = set(typing.get_args(act.Action)) - LOOP_ACTIONS
    missing = sorted(t.__name__ for t in declared - set(handlers))
    unknown = sorted(t.__name__ for t in set(handlers) - declared)
    if missing or unknown:
        raise ImportError(
            "flux_dws.service.dispatch: "
            + "; ".join(
                part
                for part in (
                    f"no handler for {', '.join(missing)}" if missing else "",
                    f"handlers for unknown actions {', '.join(unknown)}" if unknown else "",
                )
                if part
            )
        )


_check(HANDLERS)


def handler_for(action: Any) -> Handler:
    """The handler that carries out ``action`` (flux_dws.service.executor runs it)."""
    return HANDLERS[type(action)]
