//! The OpenAPI 3.1 document served at `/openapi.json`. A unit test checks
//! that its paths and methods are exactly the routes the router registers
//! (`super::routes`), and an integration test requests each of them from a
//! running daemon.

use serde_json::{Value, json};

fn error_response(description: &str) -> Value {
    json_response(description, json!({ "$ref": "#/components/schemas/Error" }))
}

/// A response whose JSON body has `schema`.
fn json_response(description: &str, schema: Value) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": schema } }
    })
}

/// A response whose JSON body is an object with `properties`.
fn object_response(description: &str, properties: Value) -> Value {
    json_response(description, json!({ "type": "object", "properties": properties }))
}

/// The body of an operator action: `{"reason": "…"}`.
fn reason_body() -> Value {
    json!({
        "required": true,
        "content": { "application/json": { "schema": {
            "type": "object",
            "required": ["reason"],
            "properties": { "reason": { "type": "string", "minLength": 1, "maxLength": 1000 } }
        } } }
    })
}

fn id_param() -> Value {
    json!({
        "name": "id", "in": "path", "required": true,
        "description": "The request id returned by POST /api/query.",
        "schema": { "type": "string", "format": "uuid" }
    })
}

fn user_param() -> Value {
    json!({
        "name": "id", "in": "path", "required": true,
        "description": "The user id.",
        "schema": { "type": "string", "format": "uuid" }
    })
}

fn row_param(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": { "type": "integer" } })
}

fn correction_responses() -> Value {
    json!({
        "200": object_response("Applied", json!({
            "user_id": { "type": "string", "format": "uuid" },
            "id": { "type": "integer" },
            "memory_version": { "type": "integer" } })),
        "400": error_response("Malformed id or body"),
        "401": error_response("Missing or wrong bearer token"),
        "404": error_response("No such user, or the user has no such record or turn"),
        "409": error_response("The user is being forgotten")
    })
}

/// The document, with the tenant answers of every `/api` operation
/// ([`super::tenancy`]): 403 for a token whose scope does not allow it,
/// and on submit 429 over the tenant's limits.
pub fn document() -> Value {
    let mut doc = base_document();
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut().filter(|(p, _)| p.starts_with("/api")) {
            for (method, op) in item.as_object_mut().into_iter().flatten() {
                let Some(responses) = op["responses"].as_object_mut() else {
                    continue;
                };
                responses.insert(
                    "403".into(),
                    error_response(
                        "The token's scope does not allow this route (scope_required, naming the scope needed)",
                    ),
                );
                if path == "/api/query" && method == "post" {
                    responses.insert(
                        "429".into(),
                        error_response("Over the tenant's requests_per_minute or max_in_flight (the code names which), or a streamed submit over this token's stream cap (http.max_streams_per_token); see Retry-After"),
                    );
                }
            }
        }
    }
    doc
}

fn base_document() -> Value {
    let mut paths = serde_json::Map::new();
    for group in [
        submit_paths(),
        action_paths(),
        reply_paths(),
        review_paths(),
        memory_paths(),
        search_paths(),
        user_paths(),
        stream_paths(),
        probe_paths(),
        super::openai::openapi_paths(),
    ] {
        if let Value::Object(group) = group {
            paths.extend(group);
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "maas",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Submit queries to the maas LLM pipeline and follow them to their answer. \
                Every /api route needs `Authorization: Bearer TOKEN` when the daemon has api_tokens; \
                a token of `maasctl tokens` sees only its tenant's requests and users, within its scope."
        },
        "paths": paths,
        "components": components()
    })
}

/// Every operation needs the bearer token.
fn secured() -> Value {
    json!([{ "bearer": [] }])
}

/// Submitting a query and reading its status.
fn submit_paths() -> Value {
    json!({
        "/api/query": {
            "post": {
                "summary": "Submit a query",
                "security": secured(),
                "parameters": [{
                    "name": "Idempotency-Key", "in": "header", "required": false,
                    "description": "Retrying with the same key (per user, for http.idempotency_ttl_secs) returns the first request instead of creating another; reusing it for a different request is 422.",
                    "schema": { "type": "string", "minLength": 1, "maxLength": 255 }
                }, {
                    "name": "Accept", "in": "header", "required": false,
                    "description": "text/event-stream with \"stream\": true: answer 200 with the answer itself as OpenAI chat.completion.chunk events.",
                    "schema": { "type": "string" }
                }],
                "requestBody": {
                    "required": true,
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Submit" } } }
                },
                "responses": {
                    "202": json_response("Accepted; follow it at the Location header. A replay carries `Idempotent-Replayed: true`.", json!({ "$ref": "#/components/schemas/Accepted" })),
                    "200": {
                        "description": "With \"stream\": true and Accept: text/event-stream: `data:` lines of OpenAI chat.completion.chunk JSON (the role first, a chunk per piece, the rest of the stored answer with finish_reason stop), then `data: [DONE]`; a restart is a chunk with `maas_restart: {attempt}`; a failed request ends with `data: {\"error\": {...}}`. The Location header names the status.",
                        "content": { "text/event-stream": { "schema": { "type": "string" } } }
                    },
                    "400": error_response("Malformed JSON, a malformed id or Idempotency-Key"),
                    "401": error_response("Missing or wrong bearer token"),
                    "413": error_response("Body larger than http.max_body_bytes"),
                    "415": error_response("Content-Type is not application/json"),
                    "422": error_response("A missing, empty or too long field; a query holding a NUL character (invalid_text); an Idempotency-Key reused for a different request"),
                    "503": error_response("Database unavailable or busy (another transaction holds the user's rows), or request timed out, or a streamed submit over the daemon's stream cap; see Retry-After")
                }
            }
        },
        "/api/query/{id}/status": {
            "get": {
                "summary": "Read a request's status, optionally waiting for it to finish",
                "security": secured(),
                "parameters": [id_param(), {
                    "name": "wait", "in": "query", "required": false,
                    "description": "Long-poll: return as soon as the request is terminal, or when this much time has passed (e.g. 30s, 500ms, 2m; capped at http.max_wait_secs).",
                    "schema": { "type": "string", "examples": ["30s"] }
                }, {
                    "name": "include", "in": "query", "required": false,
                    "description": "context: also return the assembled context and the memory it holds (context, context_sources).",
                    "schema": { "type": "string", "enum": ["context"] }
                }],
                "responses": {
                    "200": json_response("The request's state (with include=context, also context and context_sources)", json!({ "$ref": "#/components/schemas/RequestState" })),
                    "400": error_response("Malformed id, wait or include"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("No such request"),
                    "429": error_response("A long-poll over this token's cap (http.max_long_polls_per_token); see Retry-After"),
                    "503": error_response("A long-poll over the daemon's cap (http.max_long_polls); see Retry-After")
                }
            }
        }
    })
}

/// The user's reply to the question a request waits on.
fn reply_paths() -> Value {
    json!({
        "/api/query/{id}/reply": {
            "post": {
                "summary": "Reply to the question a request waits on (waiting_user_input): the request goes back to the analyzer with the reply",
                "security": secured(),
                "parameters": [id_param()],
                "requestBody": {
                    "required": true,
                    "content": { "application/json": { "schema": {
                        "type": "object", "required": ["text"],
                        "properties": { "text": { "type": "string", "description": "The user's reply: not empty, at most 100000 characters, no NUL" } }
                    } } }
                },
                "responses": {
                    "200": object_response(
                        "Applied: the request is processing again, at the analyzer",
                        json!({
                            "request_id": { "type": "string", "format": "uuid" },
                            "status": { "type": "string", "enum": ["processing"] },
                            "stage": { "type": "string", "enum": ["NEW"] }
                        })
                    ),
                    "400": error_response("Malformed id or body"),
                    "401": error_response("Missing or wrong bearer token"),
                    "403": error_response("The token's scope is not submit, operate or admin"),
                    "404": error_response("No such request for this caller"),
                    "409": error_response("not_waiting: the request does not wait for a reply; the message names its status"),
                    "422": error_response("A missing, empty or too long text, or one holding a NUL character")
                }
            }
        }
    })
}

/// The operator actions on one request: cancel, retry, continue.
fn action_paths() -> Value {
    json!({
        "/api/query/{id}/cancel": {
            "post": {
                "summary": "Cancel a request that is not finished (recorded with the reason)",
                "security": secured(),
                "parameters": [id_param()],
                "requestBody": reason_body(),
                "responses": {
                    "200": object_response(
                        "Cancelled; `was` is the status it had",
                        json!({
                            "request_id": { "type": "string", "format": "uuid" },
                            "status": { "type": "string", "enum": ["CANCELLED"] },
                            "was": { "type": "string" }
                        })
                    ),
                    "400": error_response("Malformed id or body"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("No such request"),
                    "409": error_response("Already finished"),
                    "422": error_response("No reason given")
                }
            }
        },
        "/api/query/{id}/retry": {
            "post": {
                "summary": "Send a FAILED request back to the stage that failed, with fresh attempts",
                "security": secured(),
                "parameters": [id_param()],
                "requestBody": reason_body(),
                "responses": {
                    "200": object_response(
                        "Back in the ready status of the stage that failed",
                        json!({
                            "request_id": { "type": "string", "format": "uuid" },
                            "status": { "type": "string" },
                            "stage": { "type": "string" }
                        })
                    ),
                    "400": error_response("Malformed id or body"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("No such request"),
                    "409": error_response("Not FAILED"),
                    "422": error_response("No reason given")
                }
            }
        },
        "/api/query/{id}/continue": {
            "post": {
                "summary": "Release the next stage of a debug request resting in ANALYZED or READY",
                "security": secured(),
                "parameters": [id_param()],
                "responses": {
                    "200": object_response(
                        "Released: the next stage will claim the request",
                        json!({
                            "request_id": { "type": "string", "format": "uuid" },
                            "status": { "type": "string" },
                            "next_stage": { "type": "string", "enum": ["analyze", "assemble", "respond"] }
                        })
                    ),
                    "400": error_response("Malformed id"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("No such request"),
                    "409": error_response("The run is not resting between stages")
                }
            }
        }
    })
}

/// The review of an answer that awaits it (`app::review`).
fn review_paths() -> Value {
    json!({
        "/api/query/{id}/review": {
            "post": {
                "summary": "Approve, edit or reject an answer that awaits review (AWAITING_REVIEW), once",
                "security": secured(),
                "parameters": [id_param()],
                "requestBody": {
                    "required": true,
                    "content": { "application/json": { "schema": {
                        "type": "object",
                        "required": ["action"],
                        "properties": {
                            "action": { "enum": ["approve", "edit", "reject"] },
                            "text": { "type": "string", "minLength": 1, "maxLength": 100000,
                                      "description": "edit: the answer the user gets and memory keeps" },
                            "reason": { "type": "string", "minLength": 1, "maxLength": 1000,
                                        "description": "reject: why (the request's error, or the responder's note)" },
                            "then": { "enum": ["fail", "redo"],
                                      "description": "reject: fail the request (default) or send it back to the responder with the reason" }
                        }
                    } } }
                },
                "responses": {
                    "200": object_response(
                        "Applied: COMPLETED (approve, edit), FAILED (reject, fail) or READY (reject, redo)",
                        json!({
                            "request_id": { "type": "string", "format": "uuid" },
                            "action": { "type": "string", "enum": ["approve", "edit", "reject"] },
                            "status": { "type": "string", "enum": ["COMPLETED", "FAILED", "READY"] }
                        })
                    ),
                    "400": error_response("Malformed id or body"),
                    "401": error_response("Missing or wrong bearer token"),
                    "403": error_response("The token's scope is not operate"),
                    "404": error_response("No such request for this tenant"),
                    "409": error_response("not_awaiting_review: the request does not await review (its status is named)"),
                    "422": error_response("A missing or wrong field (action, text, reason, then)")
                }
            }
        }
    })
}

/// The search of a user's memory (the MCP tool `recall` runs the same).
fn search_paths() -> Value {
    json!({
        "/api/users/{id}/memory/search": {
            "get": {
                "summary": "Search a user's memory with the pipeline's plan and ranking (the MCP tool recall runs the same search)",
                "security": secured(),
                "parameters": [
                    user_param(),
                    { "name": "q", "in": "query", "required": true, "description": "Search text, 1 to 2000 characters.", "schema": { "type": "string" } },
                    { "name": "when", "in": "query", "required": false, "description": "A time phrase (last week, in May 2023, 2023-05-08, вчера): items inside that period come first.", "schema": { "type": "string" } },
                    { "name": "limit", "in": "query", "required": false, "description": "At most this many hits, 1 to 500 (default all the retrieval finds).", "schema": { "type": "integer" } }
                ],
                "responses": {
                    "200": object_response(
                        "The hits, in the order the assembler packs them, with their scores and sources",
                        json!({
                            "user_id": { "type": "string", "format": "uuid" },
                            "memory_version": { "type": "integer" },
                            "query": { "type": "string" },
                            "time_range": { "type": "array", "items": { "type": "string", "format": "date-time" } },
                            "hits": { "type": "array" }
                        })
                    ),
                    "400": error_response("Malformed id or query parameter, or no q"),
                    "401": error_response("Missing or wrong bearer token"),
                    "403": error_response("The token lacks scope read (scope_required) or is bound to another user (user_not_allowed)"),
                    "404": error_response("Nothing is held about the user (unknown_user), or it was forgotten (user_forgotten)"),
                    "409": error_response("The user is being forgotten (erase_running)"),
                    "429": error_response("Too many searches of this token at once (too_many_searches)")
                }
            }
        }
    })
}

/// A user's memory and its corrections.
fn memory_paths() -> Value {
    json!({
        "/api/users/{id}/memory": {
            "get": {
                "summary": "A user's memory: records newest first and turns not archived yet, or with q the pipeline's retrieval hits with scores",
                "security": secured(),
                "parameters": [
                    user_param(),
                    { "name": "q", "in": "query", "required": false, "description": "Search text: the hits of the retrieval the pipeline runs, with scores, instead of the listing.", "schema": { "type": "string" } },
                    { "name": "before", "in": "query", "required": false, "description": "Records with a smaller id (next_before of the previous page).", "schema": { "type": "integer" } },
                    { "name": "turns_before", "in": "query", "required": false, "description": "Pending turns with a smaller user_seq (next_turns_before).", "schema": { "type": "integer" } },
                    { "name": "limit", "in": "query", "required": false, "description": "Records and turns per page, 1 to 500 (50).", "schema": { "type": "integer" } }
                ],
                "responses": {
                    "200": object_response(
                        "The page (or the hits); memory_version is bumped by every new record and every correction",
                        json!({
                            "user_id": { "type": "string", "format": "uuid" },
                            "memory_version": { "type": "integer" },
                            "pending": { "type": "integer" },
                            "records": { "type": "array" },
                            "next_before": { "type": ["integer", "null"] },
                            "pending_turns": { "type": "array" },
                            "next_turns_before": { "type": ["integer", "null"] },
                            "hits": { "type": "array" }
                        })
                    ),
                    "400": error_response("Malformed id or query parameter"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("Nothing is held about the user (unknown_user), or it was forgotten (user_forgotten)"),
                    "409": error_response("The user is being forgotten (erase_running)")
                }
            }
        },
        "/api/users/{id}/memory/{record}": {
            "put": {
                "summary": "Replace a record's summary (bumps the memory version; audited)",
                "security": secured(),
                "parameters": [user_param(), row_param("record", "The record id")],
                "requestBody": {
                    "required": true,
                    "content": { "application/json": { "schema": { "type": "object", "required": ["summary"], "properties": {
                        "summary": { "type": "string" }, "reason": { "type": "string" }, "actor": { "type": "string" } } } } }
                },
                "responses": correction_responses()
            },
            "delete": {
                "summary": "Delete a record (bumps the memory version; audited with ?reason= and ?actor=)",
                "security": secured(),
                "parameters": [user_param(), row_param("record", "The record id")],
                "responses": correction_responses()
            }
        },
        "/api/users/{id}/turns/{turn}": {
            "delete": {
                "summary": "Delete a turn and its id from the records covering it (bumps the memory version; audited)",
                "security": secured(),
                "parameters": [user_param(), row_param("turn", "The turn id")],
                "responses": correction_responses()
            }
        }
    })
}

/// Exporting and forgetting a user.
fn user_paths() -> Value {
    json!({
        "/api/users/{id}/export": {
            "get": {
                "summary": "Everything held about a user (requests with their steps, turns, records, archive state) as one JSON document, streamed",
                "security": secured(),
                "parameters": [user_param()],
                "responses": {
                    "200": object_response("The document; a cut one (the connection closed early) means the export failed", json!({
                        "user_id": { "type": "string", "format": "uuid" },
                        "exported_at": { "type": "string" },
                        "archive_state": { "type": ["object", "null"] },
                        "requests": { "type": "array" },
                        "turns": { "type": "array" },
                        "records": { "type": "array" },
                        "counts": { "type": "object" } })),
                    "400": error_response("Malformed id"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("Nothing is held about the user, or it was forgotten"),
                    "409": error_response("The user is being forgotten")
                }
            }
        },
        "/api/users/{id}": {
            "delete": {
                "summary": "Forget a user: erase every request, turn, record and archive mark of the user, leaving one tombstone; later requests for the user are refused (410)",
                "security": secured(),
                "parameters": [user_param()],
                "responses": {
                    "202": object_response("The erase runs; the memory route answers 409 until it has finished, then 404 user_forgotten", json!({
                        "user_id": { "type": "string", "format": "uuid" }, "status": { "type": "string" } })),
                    "400": error_response("Malformed id"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("Nothing is held about the user, or it was forgotten already"),
                    "409": error_response("An erase of the user is running")
                }
            }
        }
    })
}

/// Following a request: Server-Sent Events and WebSocket.
fn stream_paths() -> Value {
    json!({
        "/api/query/{id}/events": {
            "get": {
                "summary": "Follow a request with Server-Sent Events",
                "description": "One `data:` line of RequestState JSON per change, the current state first; the stream ends after the terminal state (which carries the whole answer) or when the daemon stops. For a request submitted with \"stream\": true, also `event: delta` (Delta JSON, `id: ATTEMPT.SEQ`) per piece of the answer while the model writes, and `event: restart` (Restart JSON) when what was sent is void (a new attempt, or the model call began again).",
                "security": secured(),
                "parameters": [id_param(), {
                    "name": "Last-Event-ID", "in": "header", "required": false,
                    "description": "The id (ATTEMPT.SEQ) of the last delta received: a reconnect gets the pieces after it first.",
                    "schema": { "type": "string", "examples": ["1.17"] }
                }],
                "responses": {
                    "200": {
                        "description": "An event stream",
                        "content": { "text/event-stream": { "schema": { "oneOf": [
                            { "$ref": "#/components/schemas/RequestState" },
                            { "$ref": "#/components/schemas/Delta" },
                            { "$ref": "#/components/schemas/Restart" }
                        ] } } }
                    },
                    "400": error_response("Malformed id or Last-Event-ID"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("No such request"),
                    "429": error_response("A stream over this token's cap (http.max_streams_per_token); see Retry-After"),
                    "503": error_response("A stream over the daemon's cap (http.max_streams); see Retry-After")
                }
            }
        },
        "/api/ws": {
            "get": {
                "summary": "Follow a request or all of a user's requests over WebSocket",
                "description": "Text messages of RequestState JSON: the current state first (for a user: each unfinished request), then every change; for a request submitted with \"stream\": true also Delta and Restart JSON with `event` (`delta`, `restart`) and `id` (ATTEMPT.SEQ). A request's socket closes with 1000 after its terminal state; every socket closes with 1001 when the daemon stops.",
                "security": secured(),
                "parameters": [
                    { "name": "request_id", "in": "query", "required": false, "schema": { "type": "string", "format": "uuid" } },
                    { "name": "user_id", "in": "query", "required": false, "schema": { "type": "string", "format": "uuid" } },
                    { "name": "after", "in": "query", "required": false, "description": "With request_id: the id (ATTEMPT.SEQ) of the last delta received; the pieces after it come first.", "schema": { "type": "string" } }
                ],
                "responses": {
                    "101": { "description": "Switching to WebSocket" },
                    "400": error_response("Not exactly one of request_id and user_id, or a malformed id"),
                    "401": error_response("Missing or wrong bearer token"),
                    "404": error_response("No such request"),
                    "426": error_response("Not a WebSocket handshake"),
                    "429": error_response("A stream over this token's cap (http.max_streams_per_token); see Retry-After"),
                    "503": error_response("A stream over the daemon's cap (http.max_streams); see Retry-After")
                }
            }
        }
    })
}

/// The probes, the metrics and this document.
fn probe_paths() -> Value {
    json!({
        "/healthz": {
            "get": {
                "summary": "Liveness: the process serves HTTP",
                "responses": { "200": json_response("Alive", json!({ "type": "object" })) }
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness: database reachable, listener connected, migrations current",
                "responses": {
                    "200": json_response("Ready", json!({ "$ref": "#/components/schemas/Ready" })),
                    "503": json_response("Not ready; `reason` says why", json!({ "$ref": "#/components/schemas/Ready" }))
                }
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (text format 0.0.4), prefixed maas_",
                "responses": { "200": { "description": "Metrics", "content": { "text/plain": { "schema": { "type": "string" } } } } }
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": { "200": json_response("OpenAPI 3.1", json!({ "type": "object" })) }
            }
        }
    })
}

/// The securitySchemes and the schemas the operations refer to.
fn components() -> Value {
    json!({
        "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        "schemas": {
            "Submit": submit_schema(),
            "Delta": {
                "type": "object",
                "required": ["request_id", "attempt", "seq", "text"],
                "properties": {
                    "request_id": { "type": "string", "format": "uuid" },
                    "attempt": { "type": "integer", "minimum": 1 },
                    "seq": { "type": "integer", "minimum": 1, "description": "The piece's number within its attempt, from 1" },
                    "text": { "type": "string", "description": "The text that follows the previous piece's (since the last restart)" }
                }
            },
            "Restart": {
                "type": "object",
                "required": ["request_id", "attempt"],
                "properties": {
                    "request_id": { "type": "string", "format": "uuid" },
                    "attempt": { "type": "integer", "minimum": 1, "description": "The attempt that writes the answer anew" },
                    "seq": { "type": "integer", "minimum": 1, "description": "Set for a restart inside an attempt (its own piece)" }
                }
            },
            "Accepted": {
                "type": "object",
                "required": ["request_id", "status"],
                "properties": {
                    "request_id": { "type": "string", "format": "uuid" },
                    "status": { "const": "processing" }
                }
            },
            "RequestState": request_state_schema(),
            "Ready": {
                "type": "object",
                "required": ["status", "checks"],
                "properties": {
                    "status": { "enum": ["ready", "unavailable"] },
                    "reason": { "type": "string" },
                    "checks": { "type": "object" }
                }
            },
            "Error": {
                "type": "object",
                "required": ["error", "code"],
                "properties": { "error": { "type": "string" }, "code": { "type": "string" } }
            }
        }
    })
}

/// The body of `POST /api/query`.
fn submit_schema() -> Value {
    json!({
        "type": "object",
        "required": ["user_id", "query"],
        "properties": {
            "user_id": { "type": "string", "format": "uuid" },
            "query": { "type": "string", "minLength": 1, "maxLength": 100000 },
            "thread_id": { "type": ["string", "null"], "format": "uuid" },
            "callback_url": {
                "type": ["string", "null"], "format": "uri", "maxLength": 2048,
                "description": "http(s) URL the outcome is POSTed to, signed (README, callbacks)"
            },
            "debug": {
                "type": ["boolean", "null"],
                "description": "Rest in ANALYZED and READY until POST /api/query/{id}/continue"
            },
            "metadata": {
                "type": ["object", "null"],
                "description": "The client's own JSON object, stored with the request and shown by GET /api/query/{id}/status; at most 4096 bytes as compact JSON and 8 levels deep, no NUL character (400 invalid_metadata otherwise)"
            },
            "review": {
                "type": ["boolean", "null"],
                "description": "An operator approves, edits or rejects the answer (POST /api/query/{id}/review) before the user gets it; the tenant may require it anyway (hitl_review)"
            },
            "stream": {
                "type": ["boolean", "null"],
                "description": "Send the answer's pieces on the request's streams while the model writes (delta and restart events); with Accept: text/event-stream the submit answers with the OpenAI chunk stream"
            },
            "clarify": {
                "type": ["boolean", "null"],
                "description": "true: the analyzer may ask the user a question first (the request then waits in waiting_user_input with question; answer with POST /api/query/{id}/reply); false: never; absent or null: the tenant's hitl_clarify"
            }
        }
    })
}

/// The state of a request, as status, streams and WebSocket show it.
fn request_state_schema() -> Value {
    json!({
        "type": "object",
        "required": ["request_id", "status", "stage"],
        "description": "processing; waiting_user_input with question; awaiting_review; completed with answer; failed with error. A cancelled request is failed with stage CANCELLED.",
        "properties": {
            "request_id": { "type": "string", "format": "uuid" },
            "status": { "enum": ["processing", "waiting_user_input", "awaiting_review", "completed", "failed"] },
            "stage": { "enum": crate::model::Status::NAMES },
            "answer": { "type": "string", "description": "completed: the answer; awaiting_review: the answer under review, to a caller of scope operate only" },
            "error": { "type": "string" },
            "question": { "type": "string", "description": "waiting_user_input only: the question the request waits on for the user's reply" },
            "metadata": { "type": "object", "description": "GET /api/query/{id}/status only: the metadata given at submit, when it was" },
            "context": { "type": ["string", "null"], "description": "With include=context: the assembled context (null before the assemble stage)" },
            "context_sources": {
                "type": ["array", "null"],
                "description": "With include=context: the memory the context holds, most relevant first within each part",
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": { "enum": ["turn", "record"] },
                        "id": { "type": "integer" },
                        "score": { "type": ["number", "null"] },
                        "why": { "enum": ["thread", "hit", "neighbour", "record", "analysis"] }
                    }
                }
            }
        }
    })
}

/// (method, path) of every operation in the document, sorted.
pub fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut ops: Vec<(String, String)> = doc["paths"]
        .as_object()
        .into_iter()
        .flatten()
        .flat_map(|(path, item)| {
            item.as_object()
                .into_iter()
                .flatten()
                .filter(|(m, _)| ["get", "post", "put", "patch", "delete"].contains(&m.as_str()))
                .map(move |(m, _)| (m.to_uppercase(), path.clone()))
        })
        .collect();
    ops.sort();
    ops
}

#[cfg(test)]
mod tests;
