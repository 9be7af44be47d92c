"""Tool scopes: which dotted tool names a profile may call. Pure (no grpc, no
I/O): the agent loop in the workers checks every call with it, the registry
offers the model only the tools in scope."""

from __future__ import annotations

import fnmatch


def in_scope(name: str, scopes: list[str]) -> bool:
    """A dotted tool name is allowed when it falls under one of the profile's
    subtrees: ``discord.*`` allows ``discord.send`` and ``discord.a.b``."""
    for scope in scopes:
        if scope == "*" or name == scope or fnmatch.fnmatchcase(name, scope):
            return True
        if scope.endswith(".*") and name.startswith(scope[:-1]):
            return True
    return False
