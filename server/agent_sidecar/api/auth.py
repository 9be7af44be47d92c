"""Who is calling: the Unix socket (mode 0600, so only our own user) is trusted;
a TCP caller must present a bearer token, scoped to platforms, possibly admin
(DECISIONS.md, "Security")."""

from __future__ import annotations

import hmac
from collections import Counter
from dataclasses import dataclass

import grpc

from ..config import AuthToken
from ..errors import OVERLOADED, PERMISSION_DENIED, UNAUTHENTICATED, SidecarError, excerpt

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
        principal, presented = self._lookup(context)
        if principal is not None:
            return principal
        FAILURES[UNAUTHENTICATED] += 1
        if not presented:
            raise SidecarError(UNAUTHENTICATED, "a bearer token is required over TCP"
                               " (an authorization header of 'Bearer <token>')")
        raise SidecarError(UNAUTHENTICATED, "unknown bearer token")

    def known(self, context: grpc.aio.ServicerContext) -> bool:
        """Whether the caller is on the Unix socket or presents one of our
        tokens; not counted as a refusal when it is neither (a health probe
        needs no token)."""
        return self._lookup(context)[0] is not None

    def _lookup(self, context: grpc.aio.ServicerContext) -> tuple[Principal | None, bytes]:
        """The caller's principal (LOCAL on the Unix socket; None for no or an
        unknown token) and the token it presented."""
        if context.peer().startswith("unix:"):
            return LOCAL, b""
        presented = _bearer_token(context.invocation_metadata() or ())
        if presented:
            for token, principal in self._tokens:
                if hmac.compare_digest(token, presented):
                    return principal, presented
        return None, presented


# Streams of the standard services (health's Watch, reflection) that callers
# without a credential may hold open at once, over all TCP connections. They
# need no token (docs/security.md) and each costs the sidecar some 15-20 KB
# while open: unbounded, one connection could open them until memory ran out.
MAX_ANONYMOUS_STREAMS = 128


class AnonymousStreams:
    """Counts the open standard-service streams of callers that are neither
    on the Unix socket nor hold a token, and refuses one past ``limit``
    (OVERLOADED): a caller with a token, or on the socket, is never counted
    nor refused, so a flood of anonymous streams cannot lock it out."""

    def __init__(self, auth: Authenticator, limit: int = MAX_ANONYMOUS_STREAMS):
        self.auth, self.limit, self.open = auth, limit, 0

    def enter(self, context: grpc.aio.ServicerContext) -> bool:
        """Whether this stream was counted (then ``leave`` when it ends);
        SidecarError OVERLOADED when it would be one too many."""
        if self.auth.known(context):
            return False
        if self.open >= self.limit:
            raise SidecarError(OVERLOADED, f"{self.limit} streams without a credential are open"
                                           " (health Watch, reflection); present a bearer token,"
                                           " or use health Check", retry_after_s=1.0)
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


class StreamQuota:
    """Counts the response streams (Prompt, WatchActivity, ServeTools) each
    credential holds open, and refuses one past ``limit`` (OVERLOADED, with
    RetryInfo; 0: no cap). Each open stream holds memory in the sidecar for
    as long as its caller keeps it: without a bound, one adapter (or one
    leaked token) could open them until the host ran out, starving every
    other adapter. The count is per credential, so that one that runs away
    refuses only itself: each ``[[auth.tokens]]`` entry is one, and so is
    the Unix socket. Prompts are also capped sidecar-wide by
    ``max_prompts_in_flight``; this bound covers what that one does not, the
    streams that only follow (watches, a request id's twins, tool hosts)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open: Counter[int] = Counter()  # id(principal) -> its open streams

    def enter(self, principal: Principal) -> None:
        """One more stream of ``principal`` is open (then ``leave``);
        SidecarError OVERLOADED, and nothing counted, when that would be one
        too many."""
        key = id(principal)  # one object per credential (Authenticator, LOCAL), for the process's life
        if self.limit and self.open[key] >= self.limit:
            raise SidecarError(OVERLOADED, f"this credential has {self.open[key]} streams open (Prompt,"
                               " WatchActivity, ServeTools), the most it may"
                               " (sidecar.limits.max_streams_per_credential); close some",
                               retry_after_s=1.0)
        self.open[key] += 1

    def leave(self, principal: Principal) -> None:
        key = id(principal)
        self.open[key] -= 1
        if not self.open[key]:
            del self.open[key]


def _bearer_token(metadata) -> bytes:
    """The token of the ``authorization`` header, ``Bearer <token>`` with the
    scheme in any case (RFC 6750 via RFC 9110), or b"" when there is none."""
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip().encode()
    return b""
