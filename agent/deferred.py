"""`DeferredResponsesAgent`: what `create_agent` returns before MLflow is imported, a plain `Agent` until
MLflow's side of it is used.

Why: `create_agent` promises a `LangGraphResponsesAgent`, an MLflow `ResponsesAgent`
(`mlflow.models.set_model`, `mlflow.pyfunc.log_model` and every models-from-code file rely on
it), but importing MLflow costs about 2 s of CPU (`mlflow/__init__` loads its tracking client,
pandas and `mlflow.genai`). A notebook's first cell, the command line and a server that scales
from zero would pay it even when they only read history. So when MLflow is not imported yet,
`create_agent` returns this `Agent`, which stands for the `LangGraphResponsesAgent`:

* `isinstance(agent, ResponsesAgent)` (or `PythonModel`, or `LangGraphResponsesAgent`), which is
  how MLflow's `set_model`, `log_model` and loaders recognise the model, is true: `isinstance`
  consults `obj.__class__` when `type(obj)` is not a subclass (Python's data model;
  `unittest.mock`'s `spec=` relies on the same rule), and this class's `__class__` answers
  `LangGraphResponsesAgent`. It does so only once `mlflow.pyfunc.model` (where MLflow's classes
  live) is imported: before that nobody can hold those classes, so an `isinstance` against any
  other class (a notebook's display, a logger) loads nothing. It answers without changing the
  object: CPython's `isinstance` compares that answer with the object's type after asking, so an
  object that changed its class inside `__class__` would be refused by a plain class such as
  `PythonModel` on the first check.
* Any attribute the plain `Agent` lacks (`predict`, `predict_stream`, `apredict`,
  `apredict_stream`, `load_context`, MLflow's item helpers, …; dunder names and IPython's display
  probes excepted) makes it a `LangGraphResponsesAgent`: the same instance, its class replaced.
  Before anything of it is traced, a `tracing=False` that `create_agent` could not apply yet (no
  MLflow to switch off) is applied (`agent.tracing.apply_tracing_switch`).

Until then `type(agent)` is `DeferredResponsesAgent` (a subclass of `Agent`); afterwards it is
`LangGraphResponsesAgent`. Every `Agent` method works before and after, without MLflow. When
MLflow is already imported, `create_agent` builds the `LangGraphResponsesAgent` at once.
"""

from __future__ import annotations

import sys
from typing import Any

from agent.agent import Agent

# The descriptor that sets an object's class; `DeferredResponsesAgent.__class__` shadows it.
_OBJECT_CLASS = object.__dict__["__class__"]

# The module that defines `PythonModel` and `ResponsesAgent`: an `isinstance` against them needs it imported.
_MLFLOW_CLASSES = "mlflow.pyfunc.model"

# Names looked up on any object by IPython's display machinery; answering them needs no MLflow.
_DISPLAY_PROBES = ("_repr_", "_ipython_")


class DeferredResponsesAgent(Agent):
    """A `LangGraphResponsesAgent` that imports MLflow only when MLflow's interface is first used
    (module docstring). Build one with `agent.create_agent(...)`."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105 - see the module docstring
        if _MLFLOW_CLASSES not in sys.modules:
            return type(self)
        from agent.responses import LangGraphResponsesAgent

        return LangGraphResponsesAgent

    def __getattr__(self, name: str) -> Any:
        # Only called for names the plain Agent lacks.
        if name.startswith("__") or name.startswith(_DISPLAY_PROBES):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        _become_responses_agent(self)
        return getattr(self, name)


def _become_responses_agent(agent: Agent) -> type:
    """Turn `agent` into a `LangGraphResponsesAgent` (importing MLflow) and return that class. Idempotent
    and safe from several threads: the import is locked, and setting the class is one atomic step.

    MLflow starts with tracing on when it is imported: a `tracing=False` that `create_agent` applied before
    (when there was no MLflow to switch off) is applied now, before anything of the agent is traced."""
    from agent.responses import LangGraphResponsesAgent
    from agent.tracing import apply_tracing_switch

    apply_tracing_switch()
    _OBJECT_CLASS.__set__(agent, LangGraphResponsesAgent)
    return LangGraphResponsesAgent
