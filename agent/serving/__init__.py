"""Serving the agent: MLflow models from code, and the MLflow Agent Server.

* `mlflow_model`  `log_model()`: log the agent as an MLflow model from code (`model.py`);
                  `mlflow models serve` serves it (POST /invocations, no streaming: mlflow issue 12439).
* `model`         the models-from-code file MLflow runs; it builds the agent without connecting.
* `agent_file`    your own models-from-code file (`--agent FILE`, `log_model(agent_file=...)`), run with
                  MLflow's loader and checked to set an agent.
* `app`           lifecycle: build the agent and the app, run uvicorn (`tt-agent serve`).
* `workers`       `--workers N`: uvicorn's supervisor, each worker on its own `SO_REUSEPORT` socket.
* `agent_server`  the MLflow Agent Server's routes for one agent (POST /invocations and /responses,
                  streaming, GET /health, /ready, /agent/info).
* `web`           the web page at `/` (built from `web/` into `web_assets/`).
* `limits`        request body limits (size, JSON, time), before MLflow parses anything.
* `errors`        the one mapping from the agent's errors to HTTP statuses and bodies.

Nothing is imported until used, so importing `agent.serving.errors` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "log_model": "agent.serving.mlflow_model",
    "runtime_requirements": "agent.serving.mlflow_model",
    "INPUT_EXAMPLE": "agent.serving.mlflow_model",
    "LOGGING_ENVIRONMENT": "agent.serving.mlflow_model",
    "MODEL_CODE_PATH": "agent.serving.mlflow_model",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agent.serving' has no attribute {name!r}")
