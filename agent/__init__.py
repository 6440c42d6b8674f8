"""timetravel-agent: a conversational agent with LangGraph checkpoint memory you can branch from.

Layout (one responsibility per module; data flows one way, from the edges inwards):

* `config`       settings (`AgentSettings`, `AGENT_*` environment), URL masking
* `version`      the package version (a leaf)
* `errors`       the error types (plain Python); `error_answers`: the one table of what each answers
  (HTTP status, MLflow code, OpenAI type)
* `types`        typed results crossing layers (`TurnResult`, `CheckpointSummary`)
* `validation`   checks of single request values
* `encryption`   encryption at rest: the configured keys, sealing and opening stored values
* `storage/`     short-term memory: checkpoints, thread records, the claim/commit turn protocol
* `memory/`      long-term memory: what the agent learns about a user, across threads
* `models/`      chat model factory, the offline model and its markers
* `tools`        the tools the model can call
* `state`        the graph's state (messages, the branch's context summary)
* `context/`     what the model is sent: token budgets, summaries, tool-call repair
* `graph`        the LangGraph graph
* `messages`     Responses items -> LangChain messages; `items` the other way
* `turn_events`  what a turn yields (deltas, messages, its `TurnResult`)
* `operations/`  what you can do to a thread: each operation declared once (`operations.registry`)
* `agent`        `Agent`, the Python API: one method per registered operation, no MLflow
* `requests`     request parsing and validation, at the edge; `dialect` the OpenAI fields
* `responses`    `LangGraphResponsesAgent`: `Agent` plus MLflow's `ResponsesAgent` interface;
  `response_events` the Responses objects and stream events; `mlflow_errors` MLflow's error twins
* `factory`      `create_agent`; `deferred` the agent it returns, which imports MLflow only when
  MLflow's side of it is first used (`predict`, `isinstance(agent, ResponsesAgent)`)
* `serving/`     models-from-code entry, the HTTP server, the error mapping
* `cli`          the `tt-agent` command

`import agent` is cheap: names are imported on first use (PEP 562), so the
command line and servers pay only for what they use.

Quick use::

    from agent import create_agent

    with create_agent("memory://", model="offline") as agent:
        out = agent.predict({"input": [{"role": "user", "content": "I'm headed to SF!"}]})
        thread_id = out.custom_outputs["thread_id"]
        print(agent.get_checkpoint_history(thread_id))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent.errors import (
    AgentError,
    CheckpointNotFound,
    ConfigurationError,
    EncryptionKeyError,
    InterruptPending,
    InvalidRequest,
    LeaseExpired,
    MemoryNotFound,
    ModelError,
    PreviousResponseNotFound,
    ResponseInProgress,
    ResponseNotFound,
    RunCancelled,
    ServerBusy,
    ServerStopping,
    StorageUnavailable,
    ThreadBusy,
    ThreadExists,
    ThreadNotFound,
    TurnCancelled,
    UserBeingDeleted,
)
from agent.version import __version__

if TYPE_CHECKING:
    from agent.agent import Agent
    from agent.config import AgentSettings
    from agent.factory import create_agent
    from agent.responses import LangGraphResponsesAgent


_LAZY = {
    "create_agent": "agent.factory",
    "AgentSettings": "agent.config",
    "LangGraphResponsesAgent": "agent.responses",
    "Agent": "agent.agent",
}

__all__ = [
    "Agent",
    "AgentError",
    "AgentSettings",
    "CheckpointNotFound",
    "ConfigurationError",
    "EncryptionKeyError",
    "InterruptPending",
    "InvalidRequest",
    "LangGraphResponsesAgent",
    "LeaseExpired",
    "MemoryNotFound",
    "ModelError",
    "PreviousResponseNotFound",
    "ResponseInProgress",
    "ResponseNotFound",
    "RunCancelled",
    "ServerBusy",
    "ServerStopping",
    "StorageUnavailable",
    "ThreadBusy",
    "ThreadExists",
    "ThreadNotFound",
    "TurnCancelled",
    "UserBeingDeleted",
    "__version__",
    "create_agent",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agent' has no attribute {name!r}")
