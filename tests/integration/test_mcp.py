"""``memstream mcp`` over stdio with the SDK's own client, on the real stack: the tools listed,
``remember`` then ``recall``, the other tools, and a tenant-scoped server binding each session to
the one user its host names."""
from __future__ import annotations

import sys

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from memstream.stack.worker_process import worker_env

from .conftest import HOME, ROOT, wait_until

pytestmark = pytest.mark.asyncio


def server(settings, *scope: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "memstream.cli", "mcp", *scope],
                                 env=worker_env(settings.model_copy(update={"home": HOME})), cwd=str(ROOT))


async def test_an_agent_remembers_then_recalls_corrects_and_forgets_through_the_sdk_client(settings, conn, workers):
    w = workers()
    await w.wait_assigned()
    async with Client(server(settings, "--user", "mcp-ana"), read_timeout_seconds=60) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert tools == {"remember", "recall", "get_context", "list_memories", "correct_memory", "forget_memory"}
        said = await client.call_tool("remember", {"text": "I live in Porto.", "reply": "Noted!"})
        assert not said.is_error, said
        await wait_until(lambda: conn.fetchval("SELECT count(*) = 1 FROM memory_facts WHERE user_id = 'mcp-ana'"),
                         what="the fact formed")
        found = await client.call_tool("recall", {"query": "where do I live?", "kinds": ["facts"]})
        assert not found.is_error and "Porto" in found.structured_content["facts"][0]["text"]
        assert found.structured_content["degraded"] == []
        context = await client.call_tool("get_context", {"message": "where do I live?"})
        assert "Porto" in context.content[0].text
        moved = await client.call_tool("remember", {"text": "I moved to Braga."})
        waited = await client.call_tool("get_context", {"message": "where do I live?",
                                                        "after": moved.structured_content["remembered"]})
        assert not waited.is_error and "Braga" in waited.content[0].text  # read after its own write
        bad = await client.call_tool("get_context", {"message": "x", "after": {**moved.structured_content["remembered"],
                                                                            "topic": "elsewhere"}})
        assert bad.is_error and "position" in bad.content[0].text
        page = (await client.call_tool("list_memories", {"kind": "facts"})).structured_content
        fact_id = page["items"][0]["fact_id"]
        fixed = await client.call_tool("correct_memory", {"fact_id": fact_id, "value": "Faro"})
        assert not fixed.is_error, fixed
        await wait_until(lambda: conn.fetchval("SELECT count(*) = 1 FROM memory_facts WHERE user_id = 'mcp-ana' "
                                               "AND value = 'Faro' AND status = 'current'"), what="the correction")
        current = (await client.call_tool("list_memories", {"kind": "facts"})).structured_content["items"][0]["fact_id"]
        gone = await client.call_tool("forget_memory", {"fact_id": current})
        assert not gone.is_error, gone
        other = await client.call_tool("recall", {"query": "home", "user_id": "someone-else"})
        assert other.is_error and "one user only" in other.content[0].text and "mcp-ana" not in other.content[0].text
        none = await client.call_tool("recall", {"query": "home", "kinds": []})  # as the API: no kinds is no search
        assert none.is_error and "kinds" in none.content[0].text
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 0 FROM memory_facts WHERE user_id = 'mcp-ana' "
                                           "AND status = 'current'"), what="the fact forgotten")


async def test_a_tenant_scoped_server_serves_only_the_user_its_host_names(settings, tmp_path):
    """In tenant mode the host names the user (the ``Memstream-User`` header on the streamable
    HTTP requests), never the agent: a tool call naming another user, even one of the same
    tenant, is refused, and over stdio (no host between agent and server) tenant mode is."""
    import contextlib
    import socket
    import subprocess

    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = worker_env(settings.model_copy(update={"home": HOME}))
    stdio = subprocess.run([sys.executable, "-m", "memstream.cli", "mcp", "--tenant", "acme"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert stdio.returncode == 2 and "streamable-http" in stdio.stderr  # over stdio the agent would name users
    proc = subprocess.Popen([sys.executable, "-m", "memstream.cli", "mcp", "--tenant", "acme", "--transport",
                             "streamable-http", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "mcp.log", "w"))
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        await wait_until(lambda: _listening(port), timeout=60, what="the MCP server")

        def session(headers):
            return Client(url if headers is None else _with_headers(url, headers), read_timeout_seconds=60)

        async with session({"Memstream-User": "acme:bo"}) as client:
            ok = await client.call_tool("list_memories", {})
            assert not ok.is_error and ok.structured_content["items"] == []
            assert not (await client.call_tool("list_memories", {"user_id": "acme:bo"})).is_error
            other = await client.call_tool("list_memories", {"user_id": "acme:cy"})  # an injected agent
            assert other.is_error and "acme:bo" not in other.content[0].text
            assert (await client.call_tool("recall", {"query": "x", "user_id": "globex:bo"})).is_error
        async with session(None) as client:  # no user named by the host: nothing to reach
            unnamed = await client.call_tool("list_memories", {"user_id": "acme:bo"})
            assert unnamed.is_error and "Memstream-User" in unnamed.content[0].text
        async with session({"Memstream-User": "globex:bo"}) as client:
            assert (await client.call_tool("list_memories", {})).is_error
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _with_headers(url: str, headers: dict):
    """A streamable HTTP transport whose requests carry ``headers``."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    class Live(httpx2.Auth):
        def auth_flow(self, request):
            request.headers.update(headers)
            yield request

    return streamable_http_client(url, http_client=httpx2.AsyncClient(auth=Live(), timeout=60))
