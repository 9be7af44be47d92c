"""Tools in a cluster (docs/cluster.md "Tools"): a tool host serves the node
its ServeTools stream is open on, and a turn runs on its lane's holder. With a
host on every node, lanes held by either node get their tools' results, each
from the host on its holder, whichever node the prompt was sent to; with a
host on one node only, a turn on the other gets the error result a missing
host gives (``ok = false``; the turn goes on), as on one sidecar.

Real sidecars on one real PostgreSQL database, asserted through gRPC."""

from __future__ import annotations

import json

from helpers.cluster import Cluster
from helpers.config import scripted
from helpers.ids import source
from helpers.streams import kind_of, prompt_req, run
from helpers.tools import AB_SCHEMA, ToolHost, answers

STEPS = [{"tool_calls": [{"name": "calc.add", "arguments": {"a": 2, "b": 3}}]},
         {"text_from_last_tool_result": True}]
CONFIG = scripted("main", STEPS, tools=["calc.*"])
TOOLS = [("calc.add", "Add two numbers", AB_SCHEMA)]


def tool_results(stream) -> list[tuple[bool, dict]]:
    return [(f.tool_result.ok, json.loads(f.tool_result.result_json))
            for f in stream.frames if kind_of(f) == "tool_result"]


def host(node) -> ToolHost:
    return ToolHost(node.tools(), "calc", TOOLS, answers({"calc.add": lambda a: {"sum": a["a"] + a["b"]}}))


def test_with_a_host_on_every_node_each_lane_uses_its_holders_host(tmp_path, cluster_dsn):
    with Cluster(tmp_path, cluster_dsn, n=2, config=CONFIG) as cl:
        hosts = {n.node_id: host(n).wait_registered() for n in cl}
        try:
            for holder, other in ((cl["a"], cl["b"]), (cl["b"], cl["a"])):
                src = source()
                for node in (holder, other):  # the first takes the lane; the second is forwarded
                    out = run(node.prompts(), prompt_req(text="add", source=src))
                    assert out.kinds()[-1] == "completed", (out.kinds(), out.details)
                    assert tool_results(out) == [(True, {"sum": 5})]
                    assert out.text() == '{"sum": 5}'
            assert [len(h.invocations) for h in hosts.values()] == [2, 2]  # each its holder's two
        finally:
            for h in hosts.values():
                h.cancel()


def test_a_lane_held_where_no_host_is_gets_the_missing_hosts_error_result(tmp_path, cluster_dsn):
    with Cluster(tmp_path, cluster_dsn, n=2, config=CONFIG) as cl:
        with host(cl["a"]) as on_a:
            out = run(cl["b"].prompts(), prompt_req(text="add", source=source()))
            assert out.kinds()[-1] == "completed", (out.kinds(), out.details)
            assert tool_results(out) == [(False, {"error": "no tool host serves 'calc.add'"})]
            assert on_a.invocations == []
