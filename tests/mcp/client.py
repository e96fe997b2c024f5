"""Drives maas's MCP server with the official Python SDK (`mcp` on PyPI) and
prints what it saw as one JSON document, for tests/it/mcp.rs to assert on.

Usage: client.py [PLAN_JSON] (without it, the plan is read from standard
input), where the plan is
  {"url": "http://127.0.0.1:PORT/mcp", "token": "...", "mode": "auto"}
  or {"stdio": {"command": "...", "args": [...], "env": {...}}}
  and "steps": a list of
    {"op": "list_tools"} | {"op": "list_resources"} | {"op": "read", "uri": "..."}
    | {"op": "call", "tool": "...", "args": {...}}
    | {"op": "http", "method": "DELETE", "token": "...", "session": true, "json": {...}}
      (one raw request to the URL, as another client would send it: with
      `token` instead of the plan's when given, with the session id the SDK
      holds when `session`; its status and JSON body)
  A string "$N.a.b" in a step's args is the value at a.b of step N's output.
  With "elicit": {"action": "accept", "reply": "..."} (or "decline",
  "cancel") the client declares the elicitation capability and answers every
  elicitation so; what it was asked is the report's "elicited".

Output: {"protocol_version", "server", "instructions", "session_id", "steps":
[...], "elicited": [{"message", "schema"}], "log": [warnings the SDK logged]} or {"connect_error": "..."}; a step
that raised is {"exception": "..."}.
"""

import asyncio
import json
import logging
import sys

import httpx2
from mcp import Client, types
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def resolve(value, outputs):
    if isinstance(value, str) and value.startswith("$"):
        head, *path = value[1:].split(".")
        v = outputs[int(head)]
        for key in path:
            v = v[key]
        return v
    if isinstance(value, dict):
        return {k: resolve(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, outputs) for v in value]
    return value


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class Seen:
    """What the SDK's HTTP client saw: the session id it was given."""

    session_id = None

    @classmethod
    async def response(cls, response):
        sid = response.headers.get("mcp-session-id")
        if sid:
            cls.session_id = sid


class Warnings(logging.Handler):
    """The SDK's log lines of level WARNING and above."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


async def raw(plan, s):
    token = s.get("token", plan.get("token"))
    headers = {"Accept": "application/json, text/event-stream", **s.get("headers", {})}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if s.get("session") and Seen.session_id:
        headers["Mcp-Session-Id"] = Seen.session_id
        headers["MCP-Protocol-Version"] = "2025-03-26"
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30.0)) as http:
        async with http.stream(s["method"], plan["url"], headers=headers, json=s.get("json")) as r:
            if r.headers.get("content-type", "").startswith("text/event-stream"):
                return {"status": r.status_code, "body": None}
            text = (await r.aread()).decode()
            try:
                body = json.loads(text)
            except ValueError:
                body = text
            return {"status": r.status_code, "body": body}


async def step(client, s, outputs, plan):
    op = s["op"]
    if op == "http":
        return await raw(plan, s)
    if op == "list_tools":
        tools = (await client.list_tools()).tools
        return {"tools": [dump(t) for t in tools]}
    if op == "list_resources":
        found = (await client.list_resources()).resources
        return {"resources": [dump(r) for r in found]}
    if op == "read":
        read = await client.read_resource(resolve(s["uri"], outputs))
        return {"contents": [dump(c) for c in read.contents]}
    if op == "call":
        progress = []

        async def on_progress(value, total, message):
            progress.append({"progress": value, "message": message})

        result = await client.call_tool(
            s["tool"], resolve(s.get("args", {}), outputs), progress_callback=on_progress
        )
        texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
        body = None
        if texts:
            try:
                body = json.loads(texts[0])
            except ValueError:
                body = texts[0]
        return {
            "is_error": bool(result.is_error),
            "structured": result.structured_content,
            "body": body,
            "progress": progress,
        }
    raise ValueError(f"unknown op {op}")


def answering(plan, elicited):
    """The elicitation callback the plan asks for (None: no capability)."""
    spec = plan.get("elicit")
    if spec is None:
        return None

    async def on_elicit(context, params):
        schema = getattr(params, "requested_schema", None)
        if schema is not None and not isinstance(schema, dict):
            schema = dump(schema)
        elicited.append({"message": params.message, "schema": schema})
        if spec["action"] == "accept":
            return types.ElicitResult(action="accept", content={"reply": spec["reply"]})
        return types.ElicitResult(action=spec["action"])

    return on_elicit


def connect(plan, elicited):
    mode = plan.get("mode", "auto")
    callback = answering(plan, elicited)
    if "stdio" in plan:
        p = plan["stdio"]
        params = StdioServerParameters(command=p["command"], args=p.get("args", []), env=p.get("env"))
        return Client(params, mode=mode, read_timeout_seconds=120, elicitation_callback=callback)
    headers = {"Authorization": f"Bearer {plan['token']}"} if plan.get("token") else {}
    headers.update(plan.get("headers", {}))
    http = httpx2.AsyncClient(
        headers=headers, timeout=httpx2.Timeout(120.0), event_hooks={"response": [Seen.response]}
    )
    return Client(
        streamable_http_client(plan["url"], http_client=http),
        mode=mode,
        read_timeout_seconds=120,
        elicitation_callback=callback,
    )


def described(e):
    """An exception as text, with those a task group gathered."""
    inner = getattr(e, "exceptions", None)
    text = f"{type(e).__name__}: {e}"
    return f"{text} [{'; '.join(described(i) for i in inner)}]" if inner else text


async def main():
    plan = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())
    outputs = []
    elicited = []
    warnings = Warnings()
    logging.getLogger("mcp").addHandler(warnings)
    try:
        client = connect(plan, elicited)
        async with client:
            info = client.server_info
            report = {
                "protocol_version": client.protocol_version,
                "server": dump(info) if info else None,
                "instructions": client.instructions,
            }
            for s in plan.get("steps", []):
                try:
                    outputs.append(await step(client, s, outputs, plan))
                except Exception as e:  # noqa: BLE001 - the test asserts on it
                    outputs.append({"exception": described(e)})
            report["steps"] = outputs
            report["session_id"] = Seen.session_id
    except BaseException as e:  # noqa: BLE001 - connection refused, 401, 403
        report = {"connect_error": f"{type(e).__name__}: {e}", "steps": outputs}
    report["elicited"] = elicited
    report["log"] = warnings.lines
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
