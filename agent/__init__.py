"""timetravel-agent: a conversational agent with LangGraph checkpoint memory you can branch from.

Layout (one responsibility per module):

* `config`      settings (`AgentSettings`, `AGENT_*` environment), URL masking
* `errors`      the error types and their HTTP statuses
* `storage/`    databases behind one `Store`: `postgres`, `sqlite` (also `memory://`),
                `deltas` (messages stored once), `base` (turn commits, summaries)
* `models`      chat model factory and the offline model
* `tools`       the tools the model can call
* `graph`       the LangGraph graph
* `messages`    Responses items <-> LangChain messages, tool-call repair
* `requests`    request parsing and validation, at the edge
* `threads`     thread operations: turns, branching, history, state update, deletion, ownership
* `responses`   the MLflow `ResponsesAgent` adapter
* `serving/`    models-from-code entry and the HTTP servers
* `cli`         the `tt-agent` command

Quick use::

    from agent import create_agent

    with create_agent("memory://", model="offline") as agent:
        out = agent.predict({"input": [{"role": "user", "content": "I'm headed to SF!"}]})
        thread_id = out.custom_outputs["thread_id"]
        print(agent.get_checkpoint_history(thread_id))
"""

from __future__ import annotations

from langchain_core.language_models import BaseChatModel

from agent.config import AgentSettings, load_settings, resolve_database_url
from agent.errors import (
    AgentError,
    CheckpointNotFound,
    ConfigurationError,
    InvalidRequest,
    ModelError,
    StorageUnavailable,
    ThreadBusy,
    ThreadNotFound,
)
from agent.graph import build_graph
from agent.models import make_chat_model
from agent.responses import LangGraphResponsesAgent
from agent.storage import open_store
from agent.threads import Threads
from agent.tracing import disable_tracing, enable_tracing

__all__ = [
    "AgentError",
    "AgentSettings",
    "CheckpointNotFound",
    "ConfigurationError",
    "InvalidRequest",
    "LangGraphResponsesAgent",
    "ModelError",
    "StorageUnavailable",
    "ThreadBusy",
    "ThreadNotFound",
    "create_agent",
]


def create_agent(
    database_url: str | None = None,
    model: str | BaseChatModel | None = None,
    *,
    connect: bool = True,
    **settings,
) -> LangGraphResponsesAgent:
    """Build an agent: its store, chat model and compiled graph, once.

    Args:
        database_url: `postgresql://…`, `sqlite:///path` or `memory://`. Unset:
            `AGENT_DATABASE_URL`, else the embedded `sqlite:///.agent/checkpoints.sqlite`.
        model: a LangChain chat model, an OpenAI-compatible model name, or
            `"offline"`. Unset: `AGENT_MODEL`, else `"offline"` unless
            `OPENAI_API_KEY` or `OPENAI_BASE_URL` is set.
        connect: connect and set up the tables now (default), so a wrong URL
            fails here. `False` defers it to the first request (used when
            MLflow logs the model on a machine without the database).
        **settings: any field of `AgentSettings` (pool sizes, `multitask_strategy`,
            `require_user_id`, `credential_provider`, …).

    Returns:
        A `LangGraphResponsesAgent`; call `close()` or use `with` to release its pool.

    Raises:
        ConfigurationError: an unknown setting, a bad value, an unknown URL scheme.
        StorageUnavailable: `connect=True` and the database cannot be reached
            (the message shows the URL with its password masked).
    """
    config = load_settings(database_url=database_url, **settings)
    if isinstance(model, BaseChatModel):
        chat_model = model
    else:
        chat_model = make_chat_model(model or config.model)
    store = open_store(resolve_database_url(config.database_url), config)
    try:
        if connect:
            store.setup()
        graph = build_graph(chat_model, store.saver)
    except BaseException:
        store.close()
        raise
    if config.tracing:
        enable_tracing()
    else:
        disable_tracing()
    return LangGraphResponsesAgent(store, Threads(store, graph, config), config)
