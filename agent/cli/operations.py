"""The `tt-agent` command of each registered operation, made from its declaration, and the one way such a command runs.

`operation_command` makes a command from an operation's entry in
`agent.cli.manifest` (generated from the registry, see `agent.cli.specs`):
its arguments and options, plus `--user-id`, `--json` and `--database-url`, and
the options of its output (`agent.cli.outputs`). Running it (`run_command`)
turns the command line's values into the operation's raw values (repeated
`KEY=VALUE` options into a dict) and hands them to `agent.cli.runs.Run`, which
goes through the same door as the agent's methods.

A command named `"threads show"` belongs to the group `threads`; an operation
named after the group itself (`"threads"`) is what the group does without a
subcommand.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from agent.cli.app import USER_ID_HELP, App, DatabaseUrl, Group, Json, agent_errors, app
from agent.cli.manifest import COMMANDS
from agent.cli.outputs import OUTPUTS, show
from agent.cli.runs import Run, operation_context, registered
from agent.cli.stores import store_label

_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "pairs": list[str], "ids": list[str]}

#: The options every operation's command ends with.
_SHARED = (
    inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Json),
    inspect.Parameter("database_url", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DatabaseUrl),
)


def operation_command(spec: Mapping[str, Any], *, group: bool = False) -> Any:
    """The Typer callback of the command `spec` (an entry of `agent.cli.manifest`): its signature
    says the command's parameters, its docstring the help. `group`: the callback of a group, which
    does nothing when a subcommand is named."""
    output = OUTPUTS.get(spec["operation"])
    params = [_parameter(param) for param in spec["params"]]
    params += [_flag(flag.name, flag.help) for flag in (output.flags if output else ())]
    params += _SHARED
    if group:
        params.insert(0, inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

    def callback(**values: Any) -> None:
        ctx = values.pop("ctx", None)
        if ctx is not None and ctx.invoked_subcommand is not None:
            return
        run_command(spec, values)

    callback.__name__ = spec["command"].split()[-1]
    callback.__doc__ = spec["help"]
    callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    callback.__annotations__ = {param.name: param.annotation for param in params}
    return callback


def _parameter(param: Mapping[str, Any]) -> inspect.Parameter:
    kind = _TYPES[param["type"]]
    if param.get("optional"):
        kind = kind | None
    help_text, metavar = param.get("help"), param.get("metavar")
    if param["name"] == "user_id":  # the shared `--user-id` option
        help_text, metavar = help_text or USER_ID_HELP, metavar or "ID"
    if param.get("argument"):
        info: Any = typer.Argument(help=help_text, metavar=metavar)
    else:
        option = f"--{param['name'].replace('_', '-')}"
        if param["type"] == "bool" and param.get("default") is True:  # a flag that is on unless turned off
            option = f"{option}/--no-{option[2:]}"
        info = typer.Option(option, help=help_text, metavar=metavar)
    default = inspect.Parameter.empty if param.get("required") else param.get("default")
    return inspect.Parameter(param["name"], inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info])


def _flag(name: str, help_text: str) -> inspect.Parameter:
    info = typer.Option(f"--{name.replace('_', '-')}", help=help_text)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, info])


def add_operation_commands(app: typer.Typer) -> dict[str, App]:
    """Register on `app` the command of every operation in the manifest, in its order; returns the
    groups made (`threads`), by name, for hand-written commands to join."""
    groups: dict[str, App] = {}
    named = {spec["command"]: spec for spec in COMMANDS}
    for spec in COMMANDS:
        words = spec["command"].split()
        if len(words) == 1 and not any(other.startswith(f"{words[0]} ") for other in named):
            app.command(words[0])(operation_command(spec))
            continue
        name = words[0]
        if name not in groups:
            own = named.get(name)
            groups[name] = App(name=name, cls=Group, help=own["help"] if own else None,
                               invoke_without_command=own is not None, no_args_is_help=own is None)  # fmt: skip
            if own is not None:
                groups[name].callback()(operation_command(own, group=True))
            app.add_typer(groups[name])
        if len(words) == 2:
            groups[name].command(words[1])(operation_command(spec))
    return groups


# -- running one --------------------------------------------------------------------------------------
def run_command(spec: Mapping[str, Any], values: dict[str, Any]) -> None:
    """Run the operation of command `spec` with the command line's `values` and print its result.
    An `AgentError` is printed (`agent_errors`) and exits with code 1."""
    database_url = values.pop("database_url")
    as_json = values.pop("as_json")
    output = OUTPUTS.get(spec["operation"])
    flags = {flag.name: values.pop(flag.name) for flag in (output.flags if output else ())}
    with agent_errors(store=store_label(database_url)):
        values = {name: _from_command_line(name, value) if _is_pairs(spec, name) else value for name, value in values.items()}
        # A repeatable id option not given is the operation's default (None), not an empty list.
        values = {name: (tuple(value or ()) or None) if _has_type(spec, name, "ids") else value for name, value in values.items()}
        operation = registered(spec["operation"])
        with operation_context(operation, database_url) as context:
            # An operation that is a turn (`merge_branch`) prints its text as the model writes it, as `chat` does.
            printer = None
            if operation.stream is not None and not as_json:
                from agent.cli.printing import TurnPrinter

                printer = TurnPrinter()
            run = Run(operation, context, values, flags, spec, stream_to=printer)
            if printer is not None:
                printer.end()
            show(run, as_json)


def _is_pairs(spec: Mapping[str, Any], name: str) -> bool:
    return _has_type(spec, name, "pairs")


def _has_type(spec: Mapping[str, Any], name: str, kind: str) -> bool:
    return any(param["name"] == name and param["type"] == kind for param in spec["params"])


def _from_command_line(name: str, values: list[str] | None) -> dict[str, str] | None:
    """Repeated `--metadata KEY=VALUE` options as a dict (None: not given).

    Raises:
        InvalidRequest: a value without `=`.
    """
    from agent.errors import InvalidRequest

    if values is None:
        return None
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep:
            raise InvalidRequest(f"--{name.replace('_', '-')} takes KEY=VALUE, got {value!r}")
        pairs[key] = item
    return pairs


#: The groups of the operations' commands (`threads`), by name: registered when `agent.cli` imports this module.
GROUPS = add_operation_commands(app)
