use super::*;

#[test]
fn the_document_lists_exactly_the_routes_of_the_router() {
    let doc = document();
    let mut routes: Vec<(String, String)> = super::super::routes()
        .list
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    routes.sort();
    assert_eq!(operations(&doc), routes);
    assert_eq!(doc["openapi"], "3.1.0");
}

/// The document is assembled from groups of paths; together they give
/// every operation once, with the answers clients rely on.
#[test]
fn the_groups_give_every_operation_and_its_key_answers() {
    let doc = document();
    let ops: Vec<String> = operations(&doc).into_iter().map(|(m, p)| format!("{m} {p}")).collect();
    assert_eq!(
        ops,
        [
            "DELETE /api/users/{id}",
            "DELETE /api/users/{id}/memory/{record}",
            "DELETE /api/users/{id}/turns/{turn}",
            "GET /api/query/{id}/events",
            "GET /api/query/{id}/status",
            "GET /api/users/{id}/export",
            "GET /api/users/{id}/memory",
            "GET /api/users/{id}/memory/search",
            "GET /api/ws",
            "GET /healthz",
            "GET /metrics",
            "GET /openapi.json",
            "GET /readyz",
            "GET /v1/models",
            "POST /api/query",
            "POST /api/query/{id}/cancel",
            "POST /api/query/{id}/continue",
            "POST /api/query/{id}/reply",
            "POST /api/query/{id}/retry",
            "POST /api/query/{id}/review",
            "POST /v1/chat/completions",
            "PUT /api/users/{id}/memory/{record}",
        ]
    );
    let codes = |path: &str, method: &str| -> Vec<String> {
        doc["paths"][path][method]["responses"]
            .as_object()
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(
        codes("/api/query", "post"),
        ["200", "202", "400", "401", "403", "413", "415", "422", "429", "503"]
    );
    assert_eq!(
        codes("/api/query/{id}/review", "post"),
        ["200", "400", "401", "403", "404", "409", "422"]
    );
    assert_eq!(
        codes("/api/query/{id}/status", "get"),
        ["200", "400", "401", "403", "404", "429", "503"]
    );
    assert_eq!(codes("/healthz", "get"), ["200"]);
    let submit = &doc["paths"]["/api/query"]["post"];
    assert_eq!(
        submit["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/Submit"
    );
    assert_eq!(submit["security"], serde_json::json!([{ "bearer": [] }]));
    assert_eq!(doc["paths"]["/healthz"]["get"].get("security"), None);
    let params: Vec<&str> = doc["paths"]["/api/query/{id}/status"]["get"]["parameters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(params, ["id", "wait", "include"]);
    let schemas: Vec<&String> = doc["components"]["schemas"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        schemas,
        [
            "Accepted",
            "Delta",
            "Error",
            "Ready",
            "RequestState",
            "Restart",
            "Submit"
        ]
    );
    assert_eq!(
        doc["components"]["schemas"]["RequestState"]["properties"]["stage"]["enum"],
        json!(crate::model::Status::NAMES)
    );
    assert_eq!(
        doc["components"]["schemas"]["RequestState"]["properties"]["status"]["enum"],
        json!([
            "processing",
            "waiting_user_input",
            "awaiting_review",
            "completed",
            "failed"
        ])
    );
}
