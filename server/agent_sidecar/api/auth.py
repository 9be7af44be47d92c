"""Who is calling: the Unix socket (mode 0600, so only our own user) is trusted;
a TCP caller must present a bearer token, scoped to platforms, possibly admin
(DECISIONS.md, "Security")."""

from __future__ import annotations

import hmac
from collections import Counter
from dataclasses import dataclass

import grpc

from ..config import AuthToken
from ..errors import PERMISSION_DENIED, UNAUTHENTICATED, SidecarError, excerpt

# Refused credentials since the start, by reason (UNAUTHENTICATED: no or an unknown
# token; PERMISSION_DENIED: a token without the platform or admin right), for the
# metrics endpoint. One per process: a process serves one sidecar.
FAILURES: Counter[str] = Counter()


@dataclass(frozen=True, slots=True)
class Principal:
    admin: bool
    platforms: frozenset[str]  # "*" = every platform; names in lower case (config.py)

    def allows(self, platform: str) -> bool:
        return "*" in self.platforms or platform.lower() in self.platforms

    def require_platform(self, platform: str) -> None:
        if not self.allows(platform):
            FAILURES[PERMISSION_DENIED] += 1
            raise SidecarError(PERMISSION_DENIED,
                               f"credential not valid for platform {excerpt(platform)}")

    def require_admin(self) -> None:
        if not self.admin:
            FAILURES[PERMISSION_DENIED] += 1
            raise SidecarError(PERMISSION_DENIED, "this call needs an admin credential")


LOCAL = Principal(admin=True, platforms=frozenset({"*"}))


class Authenticator:
    failures = FAILURES  # what the metrics read

    def __init__(self, tokens: list[AuthToken]):
        self._tokens = [(t.token.encode(), Principal(t.admin, frozenset(t.platforms))) for t in tokens]

    def authenticate(self, context: grpc.aio.ServicerContext) -> Principal:
        if context.peer().startswith("unix:"):
            return LOCAL
        presented = _bearer_token(context.invocation_metadata() or ())
        if not presented:
            FAILURES[UNAUTHENTICATED] += 1
            raise SidecarError(UNAUTHENTICATED, "a bearer token is required over TCP"
                               " (an authorization header of 'Bearer <token>')")
        for token, principal in self._tokens:
            if hmac.compare_digest(token, presented):
                return principal
        FAILURES[UNAUTHENTICATED] += 1
        raise SidecarError(UNAUTHENTICATED, "unknown bearer token")


def _bearer_token(metadata) -> bytes:
    """The token of the ``authorization`` header, ``Bearer <token>`` with the
    scheme in any case (RFC 6750 via RFC 9110), or b"" when there is none."""
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip().encode()
    return b""
