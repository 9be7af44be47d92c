"""Run by clients/packaging/check.sh with the scratch venv's python: the
installed server and client wheels, not the repository, make one real call.

    python check_python.py unix:/path/sidecar.sock /path/to/venv
"""

import asyncio
import json
import sys
from importlib import metadata
from pathlib import Path

import agent_sidecar
import agent_sidecar_client
from agent_sidecar_client import client as client_mod
from agent_sidecar_client import connect

target, venv = sys.argv[1], Path(sys.argv[2]).resolve()

# Both come from the venv's site-packages, not from a checkout.
for mod in (agent_sidecar, agent_sidecar_client):
    assert venv in Path(mod.__file__).resolve().parents, mod.__file__

# One licence, declared and shipped; the server says it is Linux only.
for dist in ("agent-sidecar", "agent-sidecar-client"):
    meta = metadata.metadata(dist)
    assert meta["License-Expression"] == "Apache-2.0", (dist, meta["License-Expression"])
    files = [str(f) for f in metadata.files(dist)]
    assert any(f.endswith("licenses/LICENSE") for f in files), (dist, "no LICENSE in the wheel")
    assert meta.get_all("Project-URL"), (dist, "no project URLs")
assert "Operating System :: POSIX :: Linux" in metadata.metadata("agent-sidecar").get_all("Classifier")
# The packaged service config is there and retries the reads.
(method_config,) = json.loads(client_mod.SERVICE_CONFIG)["methodConfig"]
assert any(n["method"] == "GetSession" for n in method_config["name"]), method_config


async def main() -> None:
    async with await connect(target) as client:
        source = {"platform": "package-check", "chat_id": "python"}
        session = await client.get_or_create_session(source)
        frames = await client.prompt("hello from the wheel", source=source).collect()
        final = frames[-1]
        assert final.WhichOneof("event") == "completed", frames
        assert final.completed.final_text == "hello from the wheel", final
        again = await client.get_session(session_key=session.session_key)
        assert again.session_id == session.session_id
        print(f"package-check: python client: {session.session_key} answered {final.completed.final_text!r}")


asyncio.run(main())
