"""The DWDirectiveRules a DWS + NNF system registers (dws-api.md section 3), as data.

Shared by kubeapi's admission webhook (which driver entries a new Workflow gets) and by
dwssim (which driver acts in which state).  Only the simulator and the stand-in API server use
it: flux-dws itself validates directives in flux_dws.directives.
"""

from __future__ import annotations

from flux_dws.directives import words
from flux_dws.states import State

NNF_DRIVER = "nnf"
TEST_DRIVER = "dws-test"

S = State
#: command -> states whose driver entries the mutating webhook adds for that directive.
WATCH_STATES: dict[str, tuple[State, ...]] = {
    "jobdw": (S.PROPOSAL, S.SETUP, S.PRERUN, S.POSTRUN, S.TEARDOWN),
    "persistentdw": (S.PROPOSAL, S.SETUP, S.PRERUN, S.POSTRUN, S.TEARDOWN),
    "create_persistent": (S.PROPOSAL, S.SETUP, S.TEARDOWN),
    "destroy_persistent": (S.PROPOSAL, S.TEARDOWN),
    "copy_in": (S.PROPOSAL, S.DATAIN, S.TEARDOWN),
    "copy_out": (S.PROPOSAL, S.DATAOUT, S.TEARDOWN),
    "container": (S.PROPOSAL, S.SETUP, S.PRERUN, S.POSTRUN, S.TEARDOWN),
}

#: commands for which nnf-sos creates a DirectiveBreakdown in Proposal.
BREAKDOWN_COMMANDS = frozenset({"jobdw", "persistentdw", "create_persistent"})


def command_of(directive: str) -> str:
    """The command word of a "#DW <command> ..." line ("" if there is none)."""
    found = words(directive)
    return found[1] if len(found) > 1 and found[0] == "#DW" else ""


def watched_states(directive: str) -> tuple[tuple[str, State], ...]:
    """(driverID, state) pairs for one directive, or () when no rule matches it.

    DWS's test driver handles "#DW <State> action=..." in the one state it names.
    """
    command = command_of(directive)
    if command in WATCH_STATES:
        return tuple((NNF_DRIVER, state) for state in WATCH_STATES[command])
    for state in State:
        if command == state.value:
            return ((TEST_DRIVER, state),)
    return ()
