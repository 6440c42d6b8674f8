"""Logging the agent as an MLflow model from code (`log_model`), with its runtime requirements.

`model.py` is the file `mlflow.pyfunc.log_model(python_model=...)` points at; it
builds the agent without connecting and calls `mlflow.models.set_model`.
`log_model(agent_file=...)` logs a file of the user's instead (examples/my_agent.py),
after running it once here with the same loader as `tt-agent serve --agent`
(`serving.agent_file`), so that a broken file is one clear `ConfigurationError`
rather than MLflow's traceback halfway through logging.
`mlflow models serve` then serves it (POST /invocations, no streaming: mlflow issue 12439).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow

from agent.tracing import mlflow_info_silenced, use_default_tracking_uri

__all__ = ["INPUT_EXAMPLE", "LOGGING_ENVIRONMENT", "MODEL_CODE_PATH", "log_model", "runtime_requirements"]

#: The models-from-code file.
MODEL_CODE_PATH = Path(__file__).resolve().parent / "model.py"

#: The distribution whose runtime dependencies the logged model needs.
DISTRIBUTION = "timetravel-agent"

INPUT_EXAMPLE = {"input": [{"role": "user", "content": "I'm headed to SF!"}]}

#: The agent's settings while MLflow logs it. MLflow runs the model file and calls
#: `predict` once on the input example to check the output (mlflow 3.17,
#: `_save_model_responses_agent_helper`, even without an example), which must
#: touch neither the configured database nor a paid model.
LOGGING_ENVIRONMENT = {"AGENT_DATABASE_URL": "memory://", "AGENT_MODEL": "offline"}


def log_model(
    name: str = "agent",
    *,
    register_name: str | None = None,
    experiment: str | None = None,
    agent_file: str | os.PathLike[str] | None = None,
) -> str:
    """Log the agent as an MLflow model from code and return its model URI.

    Logged: `model.py` (or `agent_file`) as the model, the `agent` package as code (so the model
    runs where this project is not installed), the project's runtime
    dependencies as `pip_requirements`, and `INPUT_EXAMPLE`. Nothing connects to
    the configured database: MLflow's check `predict` runs under
    `LOGGING_ENVIRONMENT`. Whoever loads the model later gets an agent
    configured by *their* environment (`AGENT_DATABASE_URL`, `AGENT_MODEL`, ...).

    Where: the active tracking store; if none is configured,
    `sqlite:///.agent/mlflow.db` (`agent.tracing.use_default_tracking_uri`).
    MLflow's INFO lines are not printed (`agent.tracing.mlflow_info_silenced`).

    Args:
        name: the logged model's name.
        register_name: also register it in the model registry under this name.
        experiment: the experiment to log into (created if missing); None: the active one.
        agent_file: your models-from-code file (it calls `mlflow.models.set_model(agent)` with an
            agent from `agent.create_agent`; see examples/my_agent.py), logged as the model; None: the
            built-in agent (`model.py`). Only the file is logged, with the `agent` package: modules
            of your own that it imports must be installed where the model is served.

    Returns:
        `models:/<register_name>/<version>` if registered, else `models:/<model_id>`.

    Raises:
        ConfigurationError: `agent_file` is missing, raises when run, or sets no agent
            (`serving.agent_file.load_agent_file`); nothing is logged.
        mlflow.exceptions.MlflowException: the tracking store refused the model.
    """
    from agent.serving.agent_file import agent_file_path, load_agent_file

    model_code = MODEL_CODE_PATH if agent_file is None else agent_file_path(agent_file)
    if agent_file is not None:
        with _environment(LOGGING_ENVIRONMENT), mlflow_info_silenced():
            load_agent_file(model_code, connect=False).close()
    use_default_tracking_uri()
    if experiment:
        mlflow.set_experiment(experiment)
    with _environment(LOGGING_ENVIRONMENT), mlflow_info_silenced():
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=str(model_code),
            code_paths=[str(MODEL_CODE_PATH.parents[1])],  # the `agent` package
            input_example=INPUT_EXAMPLE,
            pip_requirements=runtime_requirements(),
            registered_model_name=register_name,
        )
    if register_name:
        return f"models:/{register_name}/{info.registered_model_version}"
    return info.model_uri


def runtime_requirements() -> list[str]:
    """The project's dependencies without extras (dev tools), as pip requirement strings."""
    requirements = importlib.metadata.requires(DISTRIBUTION) or []
    return [req for req in requirements if not re.search(r";\s*extra\s*==", req)]


@contextmanager
def _environment(overrides: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
