//! Sub-queries and entities: a question with several parts ("Which cities
//! has John been to?") finds, through the analysis' `sub_queries` and
//! `entities`, turns its own words cannot find; the same analysis without
//! them does not; a bad field is refused alone, logged, and the request
//! completes. With a provider (the fake one, over HTTP) and the requests
//! over the HTTP API.

use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, value};
use crate::support::fake_llm::{Api as Provider, FakeLlm, Reply};
use crate::support::{GENEROUS, wait_until};

const QUESTION: &str = "Which cities has John been to?";
const PARIS: &str = "I visited Paris last spring";
const SEATTLE: &str = "Seattle was rainy";

/// A daemon whose analyzer and responder are the fake provider's, with
/// embeddings and the archivist off (what is found is found by words).
async fn start(db: &TestDb, fake: &FakeLlm) -> Api {
    let opts = Opts::default()
        .env("MAAS_ARCHIVIST__ENABLED", "false")
        .env("MAAS_LLM_PROVIDER", Provider::OpenAi.provider())
        .env("OPENAI_BASE_URL", fake.openai_base_url())
        .env("OPENAI_API_KEY", "sk-test-sub-queries")
        .env("MAAS_LLM__EMBEDDING__PROVIDER", "off");
    Api::start(db, opts).await
}

/// A user whose memory holds the two cities and a few other turns, each
/// in a thread of its own (no turn is another's neighbour).
async fn johns_memory(c: &Client) -> Uuid {
    let user = Uuid::new_v4();
    for content in [
        PARIS,
        SEATTLE,
        "My cat sleeps all afternoon",
        "Green tea tastes better cold",
        "The new bike has a blue frame",
    ] {
        c.execute(
            "INSERT INTO raw_logs (user_id, thread_id, message_type, content) VALUES ($1, gen_random_uuid(), 'user_query', $2)",
            &[&user, &content],
        )
        .await
        .unwrap();
    }
    user
}

/// The analysis the fake provider gives, with `more` added.
fn analysis(more: Value) -> String {
    let mut a = json!({"needs_context": true, "context_type": "topic", "time_scope": "none",
                       "search_keywords": ["cities"], "context_found": null});
    if let (Some(a), Some(more)) = (a.as_object_mut(), more.as_object()) {
        a.extend(more.clone());
    }
    a.to_string()
}

/// Asks the question with the fake provider's `analysis` (and a plain
/// answer) over HTTP; returns the completed request's context and stored
/// analysis.
async fn ask(api: &Api, fake: &FakeLlm, c: &Client, user: Uuid, analysis: String) -> (String, Value) {
    fake.push(Provider::OpenAi, Reply::text(analysis));
    fake.push(Provider::OpenAi, Reply::text("Noted."));
    let id = api.ask(user, Some(Uuid::new_v4()), QUESTION).await;
    let state = api.status_with(id, "include=context").await;
    let stored: Value = value(c, "SELECT analysis_result FROM pipeline_runs WHERE id = $1", &[&id]).await;
    (state["context"].as_str().unwrap_or_default().to_owned(), stored)
}

/// The sub-queries find both cities; the same analysis without them finds
/// neither (the question shares no word with either turn); the entities
/// alone, searched as one more text, find both too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_queries_find_the_turns_the_questions_own_words_cannot() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = FakeLlm::start().await;
    let api = start(&db, &fake).await;
    let user = johns_memory(&c).await;

    let with = json!({"sub_queries": ["John visited Paris", "John trip Seattle"], "entities": ["John"]});
    let (context, stored) = ask(&api, &fake, &c, user, analysis(with)).await;
    assert!(context.contains(PARIS) && context.contains(SEATTLE), "{context}");
    assert_eq!(
        stored["sub_queries"],
        json!(["John visited Paris", "John trip Seattle"])
    );
    assert!(
        !context.contains("cat sleeps"),
        "only what the searches found: {context}"
    );

    let (context, stored) = ask(&api, &fake, &c, user, analysis(json!({"entities": ["John"]}))).await;
    assert_eq!(stored.get("sub_queries"), None, "{stored}");
    assert!(!context.contains(PARIS) && !context.contains(SEATTLE), "{context}");

    let (context, _) = ask(
        &api,
        &fake,
        &c,
        user,
        analysis(json!({"entities": ["Paris", "Seattle"]})),
    )
    .await;
    assert!(context.contains(PARIS) && context.contains(SEATTLE), "{context}");

    let analyzer = fake.requests_for(Provider::OpenAi)[0].body.to_string();
    assert!(
        analyzer.contains("sub_queries") && analyzer.contains("entities"),
        "the Analyzer prompt asks for them: {analyzer}"
    );
}

/// A user whose history fills the budget from the question's own words
/// (eighty turns about cities) still gets each sub-query's strongest
/// evidence: the searches are taken in turn, not the question's first. The
/// two turns the sub-queries find are as long as the others, so that they
/// cannot slip into what room the question's hits leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_queries_get_their_turns_when_the_questions_own_hits_fill_the_budget() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = FakeLlm::start().await;
    let api = start(&db, &fake).await;
    let user = Uuid::new_v4();
    let long = |head: &str| {
        format!(
            "{head}, and the streets were loud at night, full of lights and traffic, and everything I read \
             about in magazines seemed more exciting than the town where I grew up and still live today"
        )
    };
    let paris = long("I visited Paris last spring with my sister");
    let seattle = long("Seattle was rainy the whole week of the conference");
    let mut turns = vec![paris.clone(), seattle.clone()];
    turns.extend((0..80).map(|n| long(&format!("Big cities number {n} are what I dream of"))));
    for content in &turns {
        c.execute(
            "INSERT INTO raw_logs (user_id, thread_id, message_type, content) VALUES ($1, gen_random_uuid(), 'user_query', $2)",
            &[&user, content],
        )
        .await
        .unwrap();
    }
    let (context, _) = ask(&api, &fake, &c, user, analysis(json!({}))).await;
    assert!(
        context.matches("Big cities number").count() >= 20 && !context.contains(&paris),
        "the question's own hits fill the budget: {context}"
    );
    let with = json!({"sub_queries": ["John visited Paris", "John trip Seattle"]});
    let (context, _) = ask(&api, &fake, &c, user, analysis(with)).await;
    assert!(context.contains(&paris) && context.contains(&seattle), "{context}");
    assert!(
        context.contains("Big cities number"),
        "and the question's own: {context}"
    );
}

/// A `sub_queries` or `entities` field of the wrong type or over its bound
/// is refused alone, the refusal logged with the field's name and the
/// limit; the request completes on the rest of the analysis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_sub_queries_or_entities_field_is_refused_and_the_request_completes() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = FakeLlm::start().await;
    let api = start(&db, &fake).await;
    let user = johns_memory(&c).await;
    let long = "Paris ".repeat(40);
    for (bad, refusal) in [
        (
            json!({"sub_queries": "John visited Paris"}),
            "sub_queries must be an array of strings, not a string",
        ),
        (
            json!({"sub_queries": ["Paris", "Seattle", "a", "b", "c"]}),
            "sub_queries holds 5 items, more than the 4 allowed",
        ),
        (
            json!({"sub_queries": [long.trim()]}),
            "sub_queries[0] has 239 characters, more than the 200 allowed",
        ),
        (
            json!({"entities": ["Paris", {"city": "Seattle"}]}),
            "entities[1] must be a string, not an object",
        ),
    ] {
        let (context, stored) = ask(&api, &fake, &c, user, analysis(bad.clone())).await;
        assert_eq!(stored["needs_context"], true, "{stored}");
        assert_eq!(
            stored["search_keywords"],
            json!(["cities"]),
            "the rest stands: {stored}"
        );
        assert_eq!(
            (stored.get("sub_queries"), stored.get("entities")),
            (None, None),
            "{stored}"
        );
        assert!(
            !context.contains(PARIS) && !context.contains(SEATTLE),
            "{bad}: {context}"
        );
        wait_until(GENEROUS, "the refusal is logged", || async {
            api.d.plain_log().contains(refusal)
        })
        .await;
    }
}

/// With embeddings on, each sub-query (and the entities, joined) is
/// embedded like the query, once, by the provider, and the request still
/// finds both cities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sub_query_is_embedded_once_like_the_query() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = FakeLlm::start().await;
    let opts = Opts::default()
        .env("MAAS_ARCHIVIST__ENABLED", "false")
        .env("MAAS_LLM_PROVIDER", Provider::OpenAi.provider())
        .env("OPENAI_BASE_URL", fake.openai_base_url())
        .env("MAAS_LLM__OPENAI__BASE_URL", fake.openai_base_url())
        .env("OPENAI_API_KEY", "sk-test-sub-queries")
        .env("MAAS_LLM__EMBEDDING__PROVIDER", "openai");
    let api = Api::start(&db, opts).await;
    let user = johns_memory(&c).await;
    let with = json!({"sub_queries": ["John visited Paris", "John trip Seattle"], "entities": ["John", "Paris"]});
    let (context, _) = ask(&api, &fake, &c, user, analysis(with)).await;
    assert!(context.contains(PARIS) && context.contains(SEATTLE), "{context}");
    let embedded = |text: &str| {
        fake.requests()
            .iter()
            .filter(|r| r.path == "/v1/embeddings" && r.body["input"] == json!([text]))
            .count()
    };
    for text in [QUESTION, "John visited Paris", "John trip Seattle", "John Paris"] {
        assert_eq!(embedded(text), 1, "{text}: {:?}", fake.requests());
    }
}
