"""`Operation`: one thing you can do to a thread, declared once, and the one door every caller goes through.

An operation is its arguments (a keyword-only frozen dataclass whose fields carry
their checker and where each value comes from in a Responses request, see
`param`), its handler (`run(context, args)`, over an `OperationContext`), what
its result looks like to a Python caller (`python`) and in `custom_outputs`
(`outputs`), and its registration in `agent.operations.registry`. From that
one declaration come:

* the method of `agent.Agent` (`python_method`: signature and docstring from
  the dataclass and the handler, so `help(agent.set_head)` reads like a
  hand-written method);
* the `custom_inputs.action` (`from_request`: the keys it takes, whether it
  takes input items, whether it needs a thread or a user);
* the `tt-agent` command (`agent.cli.operations`) and the reference page.

Every path checks its arguments with the same checkers (`arguments`), so a
limit or an id is refused with the same words from Python, a request and the
command line. Why declared rather than written out: adding an operation used to
take seven edits in four files (method, façade, action entry, parser, handler,
REPL, reference list); now it is its module and one registry line.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agent.errors import InvalidRequest

if TYPE_CHECKING:
    from agent.config import AgentSettings
    from agent.operations.context import OperationContext
    from agent.operations.envelope import Envelope

#: Where an argument's value comes from in a Responses request: `custom` is `custom_inputs[name]`;
#: the others are the envelope's (`thread_id`, `checkpoint_id`, `user_id`, the input items as
#: messages, and the retry and concurrency policy), parsed once by `agent.requests`.
Source = Literal["custom", "thread", "checkpoint", "user", "input", "envelope"]
InputRule = Literal["none", "optional", "required"]

_REQUIRED = dataclasses.MISSING


def param(
    default: Any = _REQUIRED,
    *,
    check: Callable[[Any], Any] | None = None,
    source: Source = "custom",
    python: bool = True,
    python_required: bool = False,
    cli: Mapping[str, Any] | None = None,
) -> Any:
    """A field of an operation's arguments.

    Args:
        default: the value when the caller leaves it out; none given: the argument is required
            (a Python call without it is a TypeError, as for any method; a request without it an
            InvalidRequest).
        check: `check(name, value)` turns the raw value into the argument (raising InvalidRequest
            that names the field), e.g. `agent.validation.check_id`; None: taken as given.
        source: where a request carries it (`Source`).
        python: False: not a parameter of the Python method (request-only, such as the idempotency key).
        python_required: the Python method requires it although None is a valid value (the
            `checkpoint_id` of `update_checkpoint_state`, which a request may leave out: the head).
        cli: options for the `tt-agent` command's parameter (`agent.cli.specs`): `help`, `metavar`,
            `argument: True` for a positional one, `checkpoint: True` for a checkpoint of the thread
            that the command line also takes as a short id (implied by `source="checkpoint"`).
    """
    metadata = {"check": check, "source": source, "python": python, "python_required": python_required, "cli": dict(cli or {})}
    if default is _REQUIRED:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Operation:
    """One operation: see the module docstring.

    `run(context, args)` returns the result; `python(result)` is what the agent's method returns
    (default: `result.as_dict()`, or a list of them); `outputs(result, args)` is the action's
    `custom_outputs` (default: the same as `python`, which must then be a dict).
    """

    name: str
    """The method's name, and the `custom_inputs.action`."""
    summary: str
    """One line, for the action table, the command's help and the reference index."""
    args: type
    """A keyword-only frozen dataclass of `param` fields, in the Python signature's order."""
    run: Callable[[OperationContext, Any], Any]
    positional: int = 1
    """How many leading Python parameters may be passed by position (the rest are keyword-only)."""
    python: Callable[[Any], Any] | None = None
    outputs: Callable[[Any, Any], dict[str, Any]] | None = None
    action: bool = True
    """False: a Python method only (no `custom_inputs.action`)."""
    writes: bool = False
    """It writes (for the reference page and the command line's help)."""
    reads_only: bool = False
    """The handler needs only the context's `storage` reads (no graph, model or memories): the
    command line runs it on `agent.storage.open_reader`, without loading LangGraph."""
    cli: str | None = None
    """The `tt-agent` command (`"history"`, `"threads show"`); None: none."""
    returns: str = "dict[str, Any]"
    """The Python method's return annotation (what `python` gives)."""
    stream: Callable[..., Any] | None = None
    """An operation that is a turn (`merge_branch`): `stream(context, args, stream_tokens=...)` is its body as
    an async iterator of a turn's events (`agent.operations.turns.TurnEvent`), which the Responses adapter
    streams and answers exactly as a turn's; `run` drives the same body to its end. None: an action."""

    # -- what the declaration says -------------------------------------------------------------
    @property
    def fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.args)

    @property
    def keys(self) -> frozenset[str]:
        """The `custom_inputs` keys of its own (besides the envelope's)."""
        return frozenset(f.name for f in self.fields if f.metadata["source"] == "custom")

    @property
    def input(self) -> InputRule:
        """Whether a request's input items are its argument."""
        for f in self.fields:
            if f.metadata["source"] == "input":
                return "required" if _required(f) and f.metadata["check"] is not None else "optional"
        return "none"

    @property
    def needs_thread(self) -> bool:
        return any(f.metadata["source"] == "thread" and _required(f) for f in self.fields)

    @property
    def needs_user(self) -> bool:
        return any(f.metadata["source"] == "user" and _required(f) for f in self.fields)

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.run) or self.summary

    # -- the door ---------------------------------------------------------------------------------
    def call(self, context: OperationContext, args: Any) -> Any:
        """Run the handler on checked `args` and return the result (typed)."""
        return self.run(context, args)

    def as_python(self, result: Any) -> Any:
        if self.python is not None:
            return self.python(result)
        return _as_dict(result)

    def as_outputs(self, result: Any, args: Any) -> dict[str, Any]:
        if self.outputs is not None:
            return self.outputs(result, args)
        return self.as_python(result)


def arguments(operation: Operation, values: Mapping[str, Any], settings: AgentSettings, *, request: bool = False) -> Any:
    """`operation.args` from raw `values` (a Python call's, a command's or a request's), every value checked.

    An optional `user` argument is checked against `settings.require_user_id`. `request`: word a
    missing required value for a request (`custom_inputs.<name>`).

    Raises:
        InvalidRequest: a value its checker refuses, or a required one missing (None).
    """
    from agent.validation import check_user_id

    checked: dict[str, Any] = {}
    for f in operation.fields:
        value = values.get(f.name, None if _required(f) else f.default)
        if value is None and _required(f) and request and f.metadata["source"] in ("custom", "checkpoint"):
            raise InvalidRequest(f"The {operation.name} action needs custom_inputs.{f.name}")
        check = f.metadata["check"]
        if check is not None:
            value = check(f.name, value)
        if f.metadata["source"] == "user" and not _required(f):
            value = check_user_id(value, require=settings.require_user_id)
        checked[f.name] = value
    return operation.args(**checked)


def from_request(operation: Operation, envelope: Envelope, custom: Mapping[str, Any], settings: AgentSettings) -> Any:
    """`operation.args` from a parsed request: envelope fields from the envelope, the rest from
    `custom_inputs`. Raises InvalidRequest."""
    values: dict[str, Any] = {}
    for f in operation.fields:
        source = f.metadata["source"]
        if source == "custom":
            if f.name in custom:
                values[f.name] = custom[f.name]
        elif source == "thread":
            values[f.name] = envelope.thread_id
        elif source == "checkpoint":
            values[f.name] = envelope.checkpoint_id
        elif source == "user":
            values[f.name] = envelope.user_id
        elif source == "input":
            values[f.name] = envelope.messages
        else:
            values[f.name] = getattr(envelope, f.name)
    return arguments(operation, values, settings, request=True)


def python_method(operation: Operation) -> Callable[..., Any]:
    """The agent method of `operation`: checks its arguments (`arguments`) and runs it on the agent's
    `OperationContext`, turning an unexpected exception into an `AgentError` (`agent_errors`)."""
    signature = python_signature(operation)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        values = dict(bound.arguments)
        values.pop("self")
        return self.run_operation(operation, values)

    method.__name__ = method.__qualname__ = operation.name
    method.__doc__ = operation.doc
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__module__ = "agent.agent"
    method.operation = operation  # type: ignore[attr-defined]
    return method


def python_signature(operation: Operation) -> inspect.Signature:
    """`(self, <positional>..., *, <keyword-only>...)` from the arguments' fields, with their defaults."""
    hints = _hints(operation.args)
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    shown = [f for f in operation.fields if f.metadata["python"]]
    for index, f in enumerate(shown):
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if index < operation.positional else inspect.Parameter.KEYWORD_ONLY
        default = inspect.Parameter.empty if _required(f) or f.metadata["python_required"] else f.default
        params.append(inspect.Parameter(f.name, kind, default=default, annotation=hints.get(f.name, inspect.Parameter.empty)))
    return inspect.Signature(params, return_annotation=operation.returns)


def _hints(cls: type) -> dict[str, Any]:
    # String annotations (`from __future__ import annotations`) are shown as written.
    return dict(getattr(cls, "__annotations__", {}))


def _required(f: dataclasses.Field) -> bool:
    return f.default is _REQUIRED and f.default_factory is _REQUIRED  # type: ignore[misc]


def _as_dict(result: Any) -> Any:
    if result is None or isinstance(result, (dict, str, int, float, bool)):
        return result
    if isinstance(result, (list, tuple)):
        return [_as_dict(item) for item in result]
    return result.as_dict()
