"""Your agent file (`--agent FILE`): a models-from-code file run the way MLflow runs it.

`tt-agent serve --agent FILE`, `tt-agent chat --agent FILE` and
`log_model(agent_file=FILE)` all take the same kind of file as
`mlflow.pyfunc.log_model(python_model=FILE)`: Python that builds an agent with
`create_agent(...)` and calls `mlflow.models.set_model(agent)` (see
examples/my_agent.py). It is run with MLflow's own loader
(`mlflow.models.utils._load_model_code_path`), not an import of ours, so that
a file that works here works the same under `mlflow models serve`: same module
name scheme, same `sys.path` (the file's folder is *not* added), same
`set_model` contract. MLflow's loader is private API; it is the function
`mlflow.pyfunc` itself calls to load a models-from-code file, pinned by the
project's MLflow version and covered by tests/serving/test_agent_file.py.

Where the agent keeps its threads and which model answers still come from the
environment the file's `create_agent` reads (`AGENT_DATABASE_URL`,
`AGENT_MODEL`, ...): the command line's `--database-url` / `--model` options
are put there before the file runs. Such files use `connect=False` (MLflow
runs them at log time too), so `load_agent_file(..., connect=True)` connects
and sets the tables up afterwards, as `create_agent(connect=True)` would: a
wrong URL fails before a server listens or a chat starts.

Every failure is an `AgentError` naming the file: a `ConfigurationError`, or
the class of the file's own `AgentError` (a `StorageUnavailable` stays one, so
a server still answers 503 for it), so the command line prints one red line
instead of a traceback.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import AgentError, ConfigurationError

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent

#: The environment variable that hands `tt-agent serve --agent FILE` to each worker process.
AGENT_FILE_ENV = "AGENT_FILE"


def agent_file_path(path: str | os.PathLike[str]) -> Path:
    """`path` as an absolute path to an existing `.py` file.

    Raises:
        ConfigurationError: it does not exist, is not a file, or does not end in `.py`.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise ConfigurationError(f"Agent file {str(path)!r} does not exist (looked for {resolved}).")
    if not resolved.is_file() or resolved.suffix != ".py":
        raise ConfigurationError(
            f"Agent file {str(path)!r} must be a Python file (.py) that calls mlflow.models.set_model(agent)."
        )
    return resolved


def agent_from_environment(*, connect: bool = True) -> LangGraphResponsesAgent:
    """The agent of a server process: `AGENT_FILE`'s file when that variable is set, else
    `create_agent()` from the `AGENT_*` environment (what `tt-agent serve` and each of its workers run).

    Raises:
        ConfigurationError, StorageUnavailable: from `load_agent_file` or `create_agent`.
    """
    path = os.environ.get(AGENT_FILE_ENV)
    if path:
        return load_agent_file(path, connect=connect)
    from agent.factory import create_agent

    return create_agent(connect=connect)


def load_agent_file(path: str | os.PathLike[str], *, connect: bool = True) -> LangGraphResponsesAgent:
    """Run the models-from-code file at `path` and return the agent it set with `mlflow.models.set_model`.

    Args:
        path: the file, absolute or relative to the current directory.
        connect: then connect to the agent's database and create or migrate its tables
            (`agent.storage.setup()`); False leaves that to the first request.

    Returns:
        The file's `LangGraphResponsesAgent`; the caller closes it.

    Raises:
        ConfigurationError: the file is missing or not `.py`; running it raised (the message
            gives the exception and the file's line); it set no model, or set something that is
            not an agent made by `agent.create_agent`.
        AgentError: the file's own `AgentError`, of the same class with the file named in its message
            (for example `ConfigurationError` for a bad setting).
        StorageUnavailable: `connect` and the database cannot be reached.
    """
    import mlflow.models.model
    from mlflow.exceptions import MlflowException
    from mlflow.models.utils import _load_model_code_path

    from agent.responses import LangGraphResponsesAgent

    resolved = agent_file_path(path)
    # MLflow keeps the model a file sets in this module global and never clears it; its loader then
    # returns whatever is there. Without the reset, a file that sets nothing would silently yield
    # the model an earlier file set in this process (a log_model call, a second chat, a test).
    mlflow.models.model.__mlflow_model__ = None
    try:
        loaded = _load_model_code_path(str(resolved), None)
    except MlflowException as exc:
        cause = exc.__cause__
        if isinstance(cause, AgentError):  # its own type (a 503 stays a 503), the file named
            raise type(cause)(f"Agent file {str(path)!r}: {cause.message}", **cause.ids) from None
        if cause is None:  # the file ran and never called set_model
            raise ConfigurationError(
                f"Agent file {str(path)!r} set no model: it must call mlflow.models.set_model(agent) "
                "with an agent made by agent.create_agent(...)."
            ) from None
        raise ConfigurationError(f"Agent file {str(path)!r} failed{_where(cause, resolved)}: {_describe(cause)}") from None
    except SystemExit as exc:  # MLflow's loader catches Exception only; a file's sys.exit() would end the command
        raise ConfigurationError(f"Agent file {str(path)!r} called sys.exit({exc.code!r}) instead of setting a model") from None
    finally:
        mlflow.models.model.__mlflow_model__ = None
    if not isinstance(loaded, LangGraphResponsesAgent):
        raise ConfigurationError(
            f"Agent file {str(path)!r} set a {_type_name(loaded, resolved)} with "
            "mlflow.models.set_model; it must set an agent made by agent.create_agent(...)."
        )
    if connect:
        try:
            loaded.storage.setup()
        except BaseException:
            loaded.close()
            raise
    return loaded


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _where(exc: BaseException, file: Path) -> str:
    """`" at line N"`: the innermost line of the file itself in the exception's traceback (else "")."""
    if isinstance(exc, SyntaxError) and exc.lineno and Path(exc.filename or "").resolve() == file:
        return f" at line {exc.lineno}"
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if Path(frame.filename) == file]
    return f" at line {lines[-1]}" if lines else ""


def _type_name(value: object, file: Path) -> str:
    # MLflow runs the file as a module named code_model_<hex>; a class defined in it is the file's own.
    module = type(value).__module__
    module = file.stem if module.startswith("code_model_") else module
    return f"{module}.{type(value).__qualname__}"
