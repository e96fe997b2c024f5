//! The console section of `bin/bench`: the operator console's list and
//! detail pages over real HTTP from a real `maasd`, with many requests in
//! `pipeline_runs` (the line: under 50 ms at p99 with 10 million).
//!
//! `--console-rows=N` (default 200,000 with `--quick`, 1,000,000 without)
//! fills a database of its own, `bench_console_N`, with N finished requests
//! in one `INSERT … SELECT generate_series` per million (triggers off for
//! the load: `session_replication_role = replica`), then `VACUUM ANALYZE`,
//! as a long-lived table would be. The database is kept and reused by the
//! next run with the same N when its schema is still current (a 10 million
//! row load takes minutes). Then each page is fetched sequentially over
//! one keep-alive connection; p50/p99 in milliseconds per page kind,
//! measured by the client (database, rendering and HTTP).
//!
//! The rows: 94 % COMPLETED, 4 % FAILED, 2 % CANCELLED (nothing for the
//! daemon to do), created evenly over 30 days; 100,000 users drawn with a
//! skew (the heaviest has about 0.3 % of the rows); 60 % in one of 7
//! threads of their user; queries of the shape "How do I the invoice for
//! ticket 123 today" (a word of each slot in 1 of 8 to 1 of 10 rows, the
//! ticket number in one). The requests sampled for the detail page get
//! three steps each.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_postgres::Client;

use super::support::daemon::Opts;
use super::support::percentile;
use super::{Bench, connect, round, start_daemon};

/// The path of the `i`-th GET of a measurement.
type PathOf<'a> = Box<dyn Fn(usize) -> String + 'a>;

/// Rows per `INSERT` of the load.
const SLICE: i64 = 1_000_000;
/// Requests sampled for the pages that take an id, a user or a thread.
const SAMPLES: usize = 200;

const LOAD: &str = "
SET session_replication_role = replica;
INSERT INTO pipeline_runs (id, user_id, thread_id, user_query, status, final_answer, error,
                           attempt, lease_token, run_after, created_at, updated_at)
SELECT md5('run' || g)::uuid,
       md5('user' || x.u)::uuid,
       CASE WHEN g % 5 < 3 THEN md5('thread' || x.u || ':' || (g % 7))::uuid END,
       (ARRAY['How do I','Why does','Can you explain','Please summarise','What changed in',
              'Help me fix','Compare','Show me'])[1 + g % 8]
         || ' ' || (ARRAY['the invoice','my refund','the deployment','order','the password reset',
                          'a shipping delay','the API quota','our contract'])[1 + (g / 8) % 8]
         || ' ' || (ARRAY['for','about','since','after','before','with'])[1 + (g / 64) % 6]
         || ' ticket ' || g || ' '
         || (ARRAY['today','last week','in March','on the staging cluster','for the Berlin office',
                   'in the mobile app','again','urgently','please','thanks'])[1 + (g / 384) % 10],
       s.status,
       CASE WHEN s.status = 'COMPLETED' THEN 'Here is what I found: ' || repeat(md5(g::text) || ' ', 4) END,
       CASE WHEN s.status = 'FAILED' THEN 'respond: provider openai: HTTP 429 rate limited after 5 attempts' END,
       0, 3, x.t, x.t, x.t + interval '7 seconds'
FROM generate_series($FROM::int8, $TO::int8) g
CROSS JOIN LATERAL (SELECT floor(100000 * random() ^ 2)::int8 AS u,
                           now() - interval '30 days' + (g * interval '30 days') / $ROWS::int8 AS t) x
CROSS JOIN LATERAL (SELECT CASE WHEN g % 100 < 94 THEN 'COMPLETED'
                                WHEN g % 100 < 98 THEN 'FAILED'
                                ELSE 'CANCELLED' END AS status) s;
RESET session_replication_role;";

/// A database holding `rows` requests: the one a run before left, when it
/// is complete and its schema current; else a new one, loaded.
async fn database(b: &Bench, rows: i64) -> String {
    let name = format!("console_{rows}");
    let url = b.cluster.url(&format!("bench_{name}"));
    if let Ok(mut c) = super::support::try_connect(&url).await {
        let loaded = c
            .query_one("SELECT rows FROM bench_console_loaded", &[])
            .await
            .ok()
            .map(|r| r.get::<_, i64>(0));
        if loaded == Some(rows) {
            if let Ok(report) = maas::db::migrate::migrate(&mut c, false).await {
                if report.applied.is_empty() {
                    eprintln!("console: reusing bench_{name} ({rows} requests)");
                    return url;
                }
            }
        }
    }
    let url = b.fresh_db(&name).await;
    let mut c = connect(&url).await;
    maas::db::migrate::migrate(&mut c, false).await.unwrap();
    let t0 = Instant::now();
    let mut from = 1;
    while from <= rows {
        let to = (from + SLICE - 1).min(rows);
        let sql = LOAD
            .replace("$FROM", &from.to_string())
            .replace("$TO", &to.to_string())
            .replace("$ROWS", &rows.to_string());
        c.batch_execute(&sql).await.unwrap();
        eprintln!(
            "console: loaded {to} of {rows} requests ({:.0} s)",
            t0.elapsed().as_secs_f64()
        );
        from = to + 1;
    }
    c.batch_execute("VACUUM ANALYZE pipeline_runs").await.unwrap();
    c.batch_execute(
        "CREATE TABLE bench_console_loaded AS SELECT $ROWS::int8 AS rows"
            .replace("$ROWS", &rows.to_string())
            .as_str(),
    )
    .await
    .unwrap();
    eprintln!(
        "console: load and VACUUM ANALYZE took {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    url
}

/// The load's number of the `i`-th sampled request: spread over the whole
/// table, the same in every run.
fn spread(i: i64, rows: i64) -> i64 {
    1 + (i * 2_654_435_761).rem_euclid(rows)
}

/// `SAMPLES` values of `expr` (SQL over a request) of requests spread over
/// the table, where it is not NULL (a user or thread appears as often as
/// it has requests).
async fn sample(c: &Client, expr: &str, rows: i64) -> Vec<String> {
    let sql = format!("SELECT ({expr})::text FROM pipeline_runs WHERE id = md5('run' || $1::int8)::uuid");
    let mut out = Vec::with_capacity(SAMPLES);
    let mut i = 0;
    while out.len() < SAMPLES {
        i += 1;
        if let Some(r) = c.query_opt(&sql, &[&spread(i, rows)]).await.unwrap() {
            if let Some(v) = r.get::<_, Option<String>>(0) {
                out.push(v);
            }
        }
    }
    out
}

/// Milliseconds of `n` sequential GETs of the paths `path(i)` makes; each
/// must answer 200 with a page that `check` accepts.
async fn measure(
    http: &reqwest::Client,
    base: &str,
    n: usize,
    path: impl Fn(usize) -> String,
    check: &str,
) -> Vec<f64> {
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        let url = format!("{base}{}", path(i));
        let t0 = Instant::now();
        let resp = http.get(&url).send().await.unwrap();
        let status = resp.status();
        let body = resp.text().await.unwrap();
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert!(
            status.is_success() && body.contains(check),
            "GET {url}: {status}\n{body}"
        );
    }
    ms.sort_by(f64::total_cmp);
    ms
}

pub async fn console(b: &mut Bench, rows: Option<i64>) {
    let rows = rows.unwrap_or(if b.quick { 200_000 } else { 1_000_000 });
    let samples = if b.quick { 200 } else { 500 };
    let url = database(b, rows).await;
    let c = connect(&url).await;
    let users = sample(&c, "user_id", rows).await;
    let threads = sample(&c, "thread_id", rows).await;
    let ids = sample(&c, "id", rows).await;
    // Keyset cursors (`after=`) at random depths: the key of a request.
    let after = sample(
        &c,
        "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"') || ',' || id",
        rows,
    )
    .await;
    // The detail page's requests get a timeline (idempotent across runs).
    c.execute(
        "INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, finished_at, outcome,
                                     model, prompt_tokens, completion_tokens, latency_ms)
         SELECT r.id, s.stage, 1, 'bench', r.created_at, r.created_at + interval '2 seconds', 'succeeded',
                'gpt-4o-mini', 900, 120, 2000
         FROM pipeline_runs r CROSS JOIN unnest(ARRAY['analyze', 'assemble', 'respond']) s(stage)
         WHERE r.id = ANY($1::text[]::uuid[])
           AND NOT EXISTS (SELECT 1 FROM pipeline_steps p WHERE p.run_id = r.id)",
        &[&ids],
    )
    .await
    .unwrap();
    // A day in the middle of the 30.
    let (since, until): (String, String) = {
        let r = c
            .query_one(
                "SELECT to_char(now() AT TIME ZONE 'UTC' - interval '15 days', 'YYYY-MM-DD\"T\"HH24:MI'),
                        to_char(now() AT TIME ZONE 'UTC' - interval '14 days', 'YYYY-MM-DD\"T\"HH24:MI')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    // The default log level: the HTTP address is logged at info.
    let mut d = start_daemon(&url, Opts::default()).await;
    let addr = d.http_addr(Duration::from_secs(60)).await;
    let base = format!("http://{addr}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    // Warm-up: the first pages load the templates and the pool's connections.
    let _ = measure(&http, &base, 20, |_| "/console/requests".to_owned(), "<table").await;

    let enc = |s: &str| s.replace('+', "%2B").replace(':', "%3A").replace(',', "%2C");
    let row = "class=\"row\"";
    let cases: Vec<(&str, &str, PathOf<'_>, &str)> = vec![
        (
            "console_list",
            "no filter, first page",
            Box::new(|_| "/console/requests".to_owned()),
            row,
        ),
        (
            "console_list_page",
            "no filter, keyset page at a random depth",
            Box::new(|i| format!("/console/requests?after={}", enc(&after[i % after.len()]))),
            row,
        ),
        (
            "console_list_status",
            "status FAILED (4 % of rows)",
            Box::new(|_| "/console/requests?status=FAILED".to_owned()),
            row,
        ),
        (
            "console_list_status_page",
            "status CANCELLED (2 %), page at a random depth",
            Box::new(|i| {
                format!(
                    "/console/requests?status=CANCELLED&after={}",
                    enc(&after[i % after.len()])
                )
            }),
            "<table",
        ),
        (
            "console_list_user",
            "a user's requests (users drawn by their share of rows)",
            Box::new(|i| format!("/console/requests?user={}", users[i % users.len()])),
            row,
        ),
        (
            "console_list_user_status",
            "a user's CANCELLED requests",
            Box::new(|i| format!("/console/requests?status=CANCELLED&user={}", users[i % users.len()])),
            "<table",
        ),
        (
            "console_list_thread",
            "a thread's requests",
            Box::new(|i| format!("/console/requests?thread={}", threads[i % threads.len()])),
            row,
        ),
        (
            "console_list_time",
            "created within one day, 15 days back",
            Box::new(|_| format!("/console/requests?since={}&until={}", enc(&since), enc(&until))),
            row,
        ),
        (
            "console_list_text",
            "text in 1 of 8 rows (\"refund\")",
            Box::new(|_| "/console/requests?text=refund".to_owned()),
            row,
        ),
        (
            "console_list_text_rare",
            "text in one row (a ticket number): reads the bounded window",
            Box::new(move |i| {
                format!(
                    "/console/requests?text=ticket+{}",
                    spread(i64::try_from(i).unwrap_or(0), rows)
                )
            }),
            "<table",
        ),
        (
            "console_list_text_status",
            "text \"refund\" among FAILED",
            Box::new(|_| "/console/requests?status=FAILED&text=refund".to_owned()),
            row,
        ),
        (
            "console_detail",
            "a request's page (three steps)",
            Box::new(|i| format!("/console/requests/{}", ids[i % ids.len()])),
            "analyze",
        ),
    ];
    let mut worst: f64 = 0.0;
    b.record(
        "console_rows",
        Value::from(rows),
        "requests in pipeline_runs for the console lines",
    );
    for (key, note, path, check) in &cases {
        let ms = measure(&http, &base, samples, path, check).await;
        let p50 = percentile(&ms, 0.5).unwrap();
        let p99 = percentile(&ms, 0.99).unwrap();
        worst = worst.max(p99);
        b.record(&format!("{key}_p50_ms"), round(p50, 2), note);
        b.record(
            &format!("{key}_p99_ms"),
            round(p99, 2),
            &format!("{samples} GETs, sequential"),
        );
    }
    b.record(
        "console_worst_p99_ms",
        round(worst, 2),
        &format!("the slowest page kind's p99 at {rows} requests (goal: under 50)"),
    );
    d.kill();
}
