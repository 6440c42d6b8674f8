"""What you can do to a thread (the domain).

Each operation is declared once, in its module, as an `Operation`
(`operation`): its arguments with their checkers, its handler over an
`OperationContext` (`context`), its result, and its place in `registry`,
from which the agent's methods, the `custom_inputs.action`s, the `tt-agent`
commands and the reference page all come.

Modules:
* the door: `operation` (declaring and running an operation), `checks` (argument
  checkers), `context` (what handlers work on), `envelope` (what every request
  carries), `registry` (the list);
* turns: `turns` (claim, run, commit), `turn_options` (a turn's own inputs),
  `edits` (where an edit or regeneration starts), `tree` (a thread's
  checkpoint tree and where each message sits in it), `interrupts` (questions a
  graph waits on), `idempotency` (retries);
* operations: `history` (checkpoint pages, the head), `state` (state updates),
  `branches` (checkpoint state, branches, head switch, fork, compare), `usage`
  (token totals), `lifecycle` (deletion), `catalogue` (listing threads, titles,
  metadata), `documents` over `transfer` (export and import of whole threads as
  versioned JSON documents), `retention` (expired threads deleted or trimmed),
  `memories` (a user's long-term memories); `conversations` (the OpenAI
  Conversations and Responses objects) and `access` (the ownership rule).

`tree` and `edits` stand apart from `branches` because turns use them too: an
edit and a regeneration are turns (they stream, and follow the multitask
strategy), so only their planning lives outside `turns`.

This package's `__init__` imports nothing, and the modules of the read-only
operations import neither LangGraph, LangChain nor MLflow at module level:
`tt-agent history` runs `get_checkpoint_history` through the same door as the
agent without them (tests/cli holds it).
"""
