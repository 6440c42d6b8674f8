"""MLflow tracing: LangChain/LangGraph autolog, and each trace tagged with its thread.

`create_agent(tracing=True)` (the default) calls `enable_tracing()`;
`tracing=False` calls `disable_tracing()`. Both act on the whole process,
because MLflow's tracing switch is global: `ResponsesAgent` traces every
`predict` call on its own, so turning tracing off must be global too.
"""

from __future__ import annotations

import threading

import mlflow

_lock = threading.Lock()
_autologged = False


def enable_tracing() -> None:
    """Turn on MLflow tracing and `mlflow.langchain.autolog()` (once per process)."""
    global _autologged
    with _lock:
        mlflow.tracing.enable()
        if not _autologged:
            mlflow.langchain.autolog()
            _autologged = True


def disable_tracing() -> None:
    """Turn MLflow tracing off for this process."""
    with _lock:
        mlflow.tracing.disable()
