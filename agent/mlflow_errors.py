"""MLflow's twins of our errors: an `AgentError` that is also an `MlflowException`.

`mlflow models serve` only knows `MlflowException`: anything else becomes a 500.
`as_mlflow_exception` therefore gives an error a twin class that derives from
both its own class and `MlflowException`, so the scoring server answers with
the status of `agent.error_answers` while in-process callers can still
`except CheckpointNotFound`. Used by `LangGraphResponsesAgent.predict` and
`predict_stream` only; importing this module imports no MLflow until a twin is made.
"""

from __future__ import annotations

from agent.error_answers import answer_for
from agent.errors import AgentError

_TWINS: dict[type[AgentError], type] = {}


def as_mlflow_exception(error: AgentError) -> AgentError:
    """`error` as an instance of a class deriving from both its class and `MlflowException`.

    MLflow's scoring server turns an `MlflowException` into the HTTP status of its
    `error_code` (the table above) and any other exception into a 500; the twin
    keeps `isinstance(err, type(error))`, `err.message` and `err.ids`.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    if isinstance(error, MlflowException):
        return error
    cls = type(error)
    twin = _TWINS.get(cls)
    if twin is None:
        twin = type(cls.__name__, (cls, MlflowException), {"__module__": cls.__module__, "__reduce__": _reduce_twin})
        _TWINS[cls] = twin
    instance = twin.__new__(twin)
    MlflowException.__init__(instance, error.message, error_code=getattr(databricks_pb2, answer_for(error).mlflow_code))
    instance.ids = dict(error.ids)
    instance.__cause__ = error.__cause__
    return instance


def _reduce_twin(self):
    return (_rebuild_twin, (type(self).__mro__[1], self.message, self.ids))


def _rebuild_twin(cls: type[AgentError], message: str, ids: dict) -> AgentError:
    return as_mlflow_exception(cls(message, **ids))
