"""The registry: every operation of the agent, in the order the reference lists them.

Adding an operation is its module (arguments, handler, `Operation`) and one line
here. From this tuple come the methods of `agent.Agent`, the
`custom_inputs.action`s (`ACTIONS`; a turn, the default action, is not an
`Operation` because it streams: `agent.operations.turn_options`), the
`tt-agent` commands of the operations that declare one, and the reference page.
"""

from __future__ import annotations

from agent.operations import branch_records, branches, catalogue, documents, forks, head, history, lifecycle, memories, merges, retention, search, state, usage
from agent.operations.operation import Operation

OPERATIONS: tuple[Operation, ...] = (
    history.GET_CHECKPOINT_HISTORY,
    state.UPDATE_CHECKPOINT_STATE,
    branches.GET_CHECKPOINT_STATE,
    branches.LIST_BRANCHES,
    branches.SET_HEAD,
    head.GET_HEAD,
    forks.FORK_THREAD,
    branches.COMPARE_CHECKPOINTS,
    branch_records.LABEL_BRANCH,
    branch_records.PIN_BRANCH,
    branch_records.ARCHIVE_BRANCH,
    branch_records.UNARCHIVE_BRANCH,
    branch_records.DELETE_BRANCH,
    merges.MERGE_BRANCH,
    usage.GET_USAGE,
    lifecycle.DELETE_THREAD,
    lifecycle.DELETE_USER_DATA,
    catalogue.LIST_THREADS,
    catalogue.GET_THREAD,
    catalogue.UPDATE_THREAD,
    search.SEARCH_THREADS,
    search.BACKFILL_SEARCH_INDEX,
    documents.EXPORT_THREAD,
    documents.IMPORT_THREAD,
    retention.SWEEP_EXPIRED_THREADS,
    memories.LIST_MEMORIES,
    memories.DELETE_MEMORY,
    memories.EXTRACT_MEMORIES,
)

#: The name of the action a request without `custom_inputs.action` runs.
TURN = "turn"

#: Each `custom_inputs.action` but the turn, by name.
ACTIONS: dict[str, Operation] = {operation.name: operation for operation in OPERATIONS if operation.action}

#: The actions that are turns: the turn, and the operations that run as one (`Operation.stream`: `merge_branch`,
#: which calls the model and streams). A server admits them as turns (`serving.admission`) and traces them.
TURN_ACTIONS: frozenset[str] = frozenset({TURN, *(operation.name for operation in OPERATIONS if operation.stream is not None)})

#: Every action a request may name, the turn first.
ACTION_NAMES: tuple[str, ...] = (TURN, *ACTIONS)
