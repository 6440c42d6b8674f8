"""`create_agent`: settings, storage, chat model and graph, built once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.config import load_settings

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from agent.responses import LangGraphResponsesAgent


def create_agent(
    database_url: str | None = None,
    model: str | BaseChatModel | None = None,
    *,
    connect: bool = True,
    **settings: Any,
) -> LangGraphResponsesAgent:
    """Build an agent: its storage, chat model and compiled graph, once.

    Args:
        database_url: `postgresql://…` (or a libpq `key=value` string), `sqlite:///path`
            or `memory://`. Unset: `AGENT_DATABASE_URL`, else the embedded
            `sqlite:///.agent/checkpoints.sqlite` in the current directory. A SQLite
            path is made absolute now (`agent.info().store` names it).
        model: a LangChain chat model, an OpenAI-compatible model name, or
            `"offline"`. Unset: `AGENT_MODEL`, else `"offline"` unless
            `OPENAI_API_KEY` or `OPENAI_BASE_URL` is set.
        connect: connect and set up the tables now (default), so a wrong URL
            fails here. `False` defers it to the first request (used when
            MLflow logs the model on a machine without the database).
        **settings: any field of `agent.config.AgentSettings` (pool sizes,
            `multitask_strategy`, `require_user_id`, `credential_provider`, …).

    Returns:
        A `LangGraphResponsesAgent`; call `close()` or use `with` to release its pool.

    Raises:
        ConfigurationError: an unknown setting, a bad value, an unknown URL scheme,
            a malformed connection string.
        StorageUnavailable: `connect=True` and the database cannot be reached
            within `connect_timeout` (the message shows the URL with its password masked).
    """
    from langchain_core.language_models import BaseChatModel

    from agent.context.window import ContextWindow
    from agent.graph import build_graph
    from agent.memory.service import Memories
    from agent.memory.tools import memory_tools
    from agent.models import make_chat_model, model_name_of
    from agent.operations import Threads
    from agent.responses import LangGraphResponsesAgent
    from agent.storage import open_storage
    from agent.tracing import configure_tracing

    chat_model = model if isinstance(model, BaseChatModel) else None
    config = load_settings(database_url=database_url, model=None if chat_model else model, **settings)
    if chat_model is None:
        chat_model = make_chat_model(config.model)
    else:
        config.model = model_name_of(chat_model)  # what runs, for banners and /agent/info
    storage = open_storage(config.database_url, config)
    memories = None
    try:
        memories = Memories(storage, config)
        if connect:
            storage.setup()
        window = ContextWindow.for_model(
            chat_model, max_context_tokens=config.max_context_tokens, strategy=config.context_strategy
        )
        # The settings hold the budget in use (the default depends on the chat model, known only here),
        # so a turn's custom_inputs.max_context_tokens can be checked against it.
        config.max_context_tokens = window.max_context_tokens
        graph = build_graph(chat_model, storage.saver, window, memory_tools(memories))
    except BaseException:
        if memories is not None:
            memories.close()
        storage.close()
        raise
    configure_tracing(config)
    return LangGraphResponsesAgent(Threads(storage, graph, config, memories), config)
