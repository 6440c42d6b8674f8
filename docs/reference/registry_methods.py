"""griffe extension: the methods `agent.Agent` gets from the operation registry, in the reference.

`Agent`'s operation methods are made when `agent.agent` is imported
(`agent.operations.operation.python_method`: signature and docstring from the
operation), so reading the source, as the rest of the reference does, does not
see them. When griffe has read the class, this extension adds the members only
dynamic analysis finds: griffe inspects the imported class (which needs no
database or model) and each of them joins the statically read class.
"""

from __future__ import annotations

from typing import Any

import griffe

AGENT = "agent.agent.Agent"


class RegistryMethods(griffe.Extension):
    """Adds to `agent.agent.Agent` the members that are made at import time."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if cls.path != AGENT:
            return
        inspected = griffe.inspect("agent.agent")["Agent"]
        for name, member in inspected.members.items():
            if not name.startswith("_") and name not in cls.members:
                cls.set_member(name, member)
