"""Drives maasd's OpenAI-compatible endpoint with the official Python SDK
(`openai` on PyPI) and prints what it saw as one JSON document, for the Rust
integration tests to assert on. They run it as `$MAAS_OPENAI_PYTHON client.py`
(bin/test installs the SDK in a venv under target/) with the plan on stdin:

  {"base_url": "http://127.0.0.1:PORT/v1", "api_key": "...", "steps": [...]}

where a step is
  {"kind": "chat", "model": M, "messages": [...], "user"?, "metadata"?, "extra_headers"?}
    -> {"ok": true, "id", "model", "content", "finish_reason", "usage"}
  {"kind": "stream", ...the same..., "include_usage": bool}
    -> {"ok": true, "id", "ids" (distinct chunk ids), "content" (the deltas
        joined), "finish_reason" (the last one given), "usage" (of the usage
        chunk, or null), "chunks"}
  {"kind": "models"} -> {"ok": true, "ids": [...]}
A step the server refused is {"ok": false, "status", "type", "code",
"message", "retry_after"}; one that failed otherwise {"ok": false,
"exception": "..."}. Output: the list of the steps' reports.
"""

import json
import sys

import openai


def usage(u):
    if u is None:
        return None
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def create_args(step):
    """The arguments of chat.completions.create; the optional ones only when given."""
    args = {"model": step["model"], "messages": step["messages"]}
    for key in ("user", "metadata", "extra_headers"):
        if step.get(key) is not None:
            args[key] = step[key]
    return args


def chat(client, step):
    r = client.chat.completions.create(**create_args(step))
    choice = r.choices[0] if r.choices else None
    return {
        "ok": True,
        "id": r.id,
        "model": r.model,
        "content": choice.message.content if choice else None,
        "finish_reason": choice.finish_reason if choice else None,
        "usage": usage(r.usage),
    }


def stream(client, step):
    args = create_args(step)
    if step.get("include_usage"):
        args["stream_options"] = {"include_usage": True}
    ids, content, finish, last_usage, chunks = [], [], None, None, 0
    for chunk in client.chat.completions.create(stream=True, **args):
        chunks += 1
        if chunk.id not in ids:
            ids.append(chunk.id)
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                content.append(choice.delta.content)
            if choice.finish_reason is not None:
                finish = choice.finish_reason
        if chunk.usage is not None:
            last_usage = usage(chunk.usage)
    return {
        "ok": True,
        "id": ids[0] if ids else None,
        "ids": ids,
        "content": "".join(content),
        "finish_reason": finish,
        "usage": last_usage,
        "chunks": chunks,
    }


def models(client, _step):
    return {"ok": True, "ids": [m.id for m in client.models.list()]}


KINDS = {"chat": chat, "stream": stream, "models": models}


def run(client, step):
    try:
        return KINDS[step["kind"]](client, step)
    except openai.APIStatusError as e:
        return {
            "ok": False,
            "status": e.status_code,
            "type": getattr(e, "type", None),
            "code": getattr(e, "code", None),
            "message": str(e.message),
            "retry_after": e.response.headers.get("retry-after"),
        }
    except Exception as e:  # noqa: BLE001 - every failure is part of the report
        return {"ok": False, "exception": repr(e)}


def main():
    report = []
    try:
        plan = json.load(sys.stdin)
        client = openai.OpenAI(base_url=plan["base_url"], api_key=plan["api_key"], max_retries=0, timeout=120)
        for step in plan["steps"]:
            report.append(run(client, step))
    except Exception as e:  # noqa: BLE001 - a bad plan is reported, not raised
        report.append({"ok": False, "exception": repr(e)})
    print(json.dumps(report))


if __name__ == "__main__":
    main()
