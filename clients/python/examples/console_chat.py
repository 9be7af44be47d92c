#!/usr/bin/env python3
"""console_chat: a minimal adapter that chats with agent-sidecar from a terminal.

It is the smallest complete adapter, to copy from: it derives a SessionSource
(platform ``local``, a DM with the current OS user), streams replies, maps the
usual chat commands onto SessionService/PromptService calls, and hosts one
tool (``local.clock.now``) so a model with ``tools = ["local.*"]`` can call it.

    python clients/python/examples/console_chat.py [--target unix:./data/sidecar.sock] [--token T] [--ca CA.pem]

Commands: /new and /reset (fresh session), /stop (cancel the turn and
suspend), /queue TEXT (run TEXT as its own turn after the current ones),
/undo (take back the last user turn, even one still waiting or running),
/help, /quit. Any other line is a prompt; sent while a reply is streaming, it
becomes the follow-up (a newer one absorbs an older one that has not started:
one turn answers both). End of input waits for the
replies in flight, so ``echo hello | console_chat.py`` works.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import getpass
import sys
from typing import AsyncIterator

from agent_sidecar_client import DEFAULT_TARGET, SidecarError, ToolHost, connect, frame_kind

HELP = "/new  /reset  /stop  /queue TEXT  /undo  /help  /quit   (anything else is a prompt)"

clock = ToolHost("local.clock")


@clock.tool(description="The current local date and time, ISO 8601 with UTC offset.")
def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def say(text: str) -> None:
    print(text, flush=True)


async def show_reply(stream) -> None:
    """Print one turn's frames as they arrive."""
    try:
        async for frame in stream:
            kind = frame_kind(frame)
            if kind == "accepted" and frame.accepted.queue_position:
                say(f"[queued at position {frame.accepted.queue_position}]")
            elif kind == "started":
                print("bot> ", end="", flush=True)
            elif kind == "text_delta":
                print(frame.text_delta.text, end="", flush=True)
            elif kind == "tool_call":
                say(f"\n[tool {frame.tool_call.name}({frame.tool_call.arguments_json})]")
            elif kind == "completed":
                say("")
            elif kind == "superseded":
                by = frame.superseded.by_request_id
                say("[answered with the newer message]" if by else "[dropped]")
    except SidecarError as err:
        say(f"\n[turn failed: {err}]")


async def lines() -> AsyncIterator[str]:
    """stdin lines, read in a thread so streaming replies keep printing meanwhile."""
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        yield line.rstrip("\n")


async def chat(args: argparse.Namespace) -> int:
    user = getpass.getuser()
    source = {"platform": "local", "chat_type": "dm", "chat_id": args.chat_id or user,
              "user_id": user, "user_name": user}
    client = await connect(args.target, token=args.token, ca_file=args.ca)
    turns: set[asyncio.Task] = set()
    async with client, contextlib.AsyncExitStack() as stack:
        session = await client.get_or_create_session(source, profile=args.profile)
        key = session.session_key
        try:
            await stack.enter_async_context(clock.running(client))
            tools = "hosting local.clock.now"
        except SidecarError as err:
            tools = f"no tools ({err})"
        say(f"session {key} ({session.session_id}); {tools}\n{HELP}")

        def send(text: str, delivery: str = "follow_up") -> None:
            stream = client.prompt(text, source=source, profile=args.profile, delivery=delivery)
            task = asyncio.create_task(show_reply(stream))
            turns.add(task)
            task.add_done_callback(turns.discard)

        async for line in lines():
            command, _, rest = line.strip().partition(" ")
            try:
                if not line.strip():
                    continue
                if command in ("/new", "/reset"):
                    session = await client.reset_session(key)
                    say(f"[new session {session.session_id}]")
                elif command == "/stop":
                    await client.suspend_session(key)
                    say("[stopped; the next message starts a new session]")
                elif command == "/queue":
                    if rest:
                        send(rest, "queue")
                    else:
                        say("usage: /queue TEXT")
                elif command == "/undo":
                    session = await client.get_session(session_key=key)
                    undone = await client.rewind_session(session.session_id, 1)
                    say(f"[undid {undone.turns_undone} turn(s): {undone.target_text!r}]")
                elif command == "/help":
                    say(HELP)
                elif command == "/quit":
                    break
                else:
                    send(line)
            except SidecarError as err:
                say(f"[{command or 'prompt'} failed: {err}]")
        if turns:
            await asyncio.gather(*turns)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="Chat with agent-sidecar from the terminal.")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="unix:PATH or HOST:PORT (default %(default)s)")
    parser.add_argument("--token", default=None, help="bearer token (needed over TCP)")
    parser.add_argument("--ca", default=None, help="PEM CA file: TLS to a listener with a certificate of that CA")
    parser.add_argument("--profile", default=None, help="sidecar profile (default: main)")
    parser.add_argument("--chat-id", default=None, help="chat id (default: your user name)")
    args = parser.parse_args()
    try:
        return asyncio.run(chat(args))
    except KeyboardInterrupt:
        return 130
    except SidecarError as err:
        print(f"console_chat: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
