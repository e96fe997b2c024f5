//! The memory-scale section of `bin/bench` (`--only=memory-scale`): the
//! memory search of one user at 1,000, 10,000 and 100,000 turns, in a
//! table of millions of other users' turns, and what a logged turn costs.
//!
//! Two databases on the bench's cluster: `bench_memory_scale_0` holds the
//! three measured users alone (111,000 turns), `bench_memory_scale_N` the
//! same users and N other turns (`--memory-scale-turns=T`: T turns in all,
//! default 10,000,000, 1,000,000 with `--quick`; 100,000 other users of
//! equal share). Both are kept: the next run reuses them when their
//! schema is current, and a load that stopped (Ctrl-C, a crash) resumes
//! at its last committed slice of a million turns; the time a build took
//! is printed. `DROP DATABASE bench_memory_scale_…` frees the disk (about
//! 8 GB for 10 million turns). `--memory-scale-build` builds (or resumes)
//! the databases and measures nothing.
//!
//! The data is generated in SQL. A measured user's turns are short chat
//! lines over a small vocabulary with one unique number each; their
//! embeddings are 384-dimensional unit vectors drawn around 200 random
//! topic centres (cosine about 0.5 within a topic, 0 across), stored as the
//! embedder stores them (`embedding_parts`, `embedding_code`). The other
//! users' turns have the same kind of text and an 8-dimensional embedding
//! each: their rows are in every index the search uses, but their vectors
//! are never read (invariant 7), so they are kept small to spare the disk.
//! Loads run with triggers off (`session_replication_role = replica`),
//! the secondary indexes built after the load, then `VACUUM ANALYZE`.
//!
//! Measured, searches interleaved between the two databases so that the
//! machine's noise falls on both alike: p50/p99 of `repo::memory::search`
//! (the daemon's statement and settings, semantic part on, the default weight) per
//! user; rows and bytes the statement reads (EXPLAIN (ANALYZE, BUFFERS));
//! the exact scan's p50 at 100,000 turns (`maas.memory_exact_turns` set
//! above the user's size); recall@10 and @40 of the approximate hits against
//! the exact ones (semantic weight 1, queries = a turn's vector plus
//! noise); disk per turn; the cost of logging a turn (a 10,000-turn
//! INSERT of 1,000 users into the large table, triggers on, per turn); the
//! embedder's throughput back-filling a user of 512 turns with the local
//! model when it is in the model cache (else the offline embedder, named).

use std::time::{Duration, Instant};

use maas::repo::memory::{MemorySearch, Semantic, search};
use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

use super::support::percentile;
use super::{Bench, connect, round};

/// The embedding model name of the bench's data.
const MODEL: &str = "bench-384";
/// The measured users: name and turns.
const USERS: [(&str, i64); 3] = [("1k", 1_000), ("10k", 10_000), ("100k", 100_000)];
/// Other users in the large table.
const OTHER_USERS: i64 = 100_000;
/// Turns per load statement.
const SLICE: i64 = 1_000_000;
/// Above the largest user: the search is exact.
const EXACT_ALWAYS: &str = "SET maas.memory_exact_turns = '1000000000'";

/// A turn's text from its number `g` (SQL).
const TEXT: &str =
    "(ARRAY['I asked about','We talked about','Remind me of','Tell me more on','I changed','You suggested'])[1 + g % 6]
         || ' ' || (ARRAY['the invoice','my refund','the deployment','the order','the password reset',
                          'a shipping delay','the API quota','our contract','the dentist','my sister''s move',
                          'the garden','the guitar lessons','the trip to Lisbon'])[1 + (g * 7) % 13]
         || ' ' || (ARRAY['on Monday','last week','in March','for the Berlin office','with Olga',
                          'before the holidays','again','after lunch'])[1 + (g * 13) % 8]
         || ' (note ' || g || ')'";

/// The queries of the searches (with the analysis' keywords, as the
/// assembler sends them).
const QUERIES: [&str; 4] = [
    "What did I tell you about the invoice for the Berlin office?",
    "When is the trip to Lisbon with Olga?",
    "Remind me what we decided on the password reset last week",
    "How did the guitar lessons go in March?",
];

const STATE: &str = "
CREATE TABLE bench_memory_scale_state (filler int8 NOT NULL, filler_done int8 NOT NULL,
                                       built bool NOT NULL, index_defs text[]);
SET max_parallel_workers_per_gather = 0;
SELECT setseed(0.25);
CREATE TABLE bench_memory_scale_centres AS
  SELECT t, ARRAY(SELECT (random() - 0.5)::real FROM generate_series(1, 384) i WHERE t IS NOT NULL) AS c
  FROM generate_series(0, 199) t;";

/// One measured user: turns, then embeddings (around the topic centres),
/// then its mark.
const LOAD_USER: &str = "
SET session_replication_role = replica;
INSERT INTO raw_logs (user_id, thread_id, message_type, content, created_at, user_seq)
SELECT md5('memory-scale-user' || '$TAG')::uuid,
       md5('memory-scale-thread' || '$TAG' || ':' || (g / 20))::uuid,
       CASE WHEN g % 2 = 0 THEN 'user_query' ELSE 'assistant_response' END,
       $TEXT,
       now() - interval '400 days' + g * interval '1 minute', g
FROM generate_series(1, $TURNS) g;
INSERT INTO turn_embeddings (turn_id, user_id, model, dims, parts, code)
SELECT r.id, r.user_id, '$MODEL', 384, embedding_parts(v.e), embedding_code(v.e)
FROM raw_logs r
JOIN bench_memory_scale_centres c ON c.t = (r.user_seq * 7919) % 200
CROSS JOIN LATERAL (SELECT array_agg(c.c[i] + (random() - 0.5)::real ORDER BY i) AS raw
                    FROM generate_series(1, 384) i WHERE r.id IS NOT NULL) x
CROSS JOIN LATERAL (SELECT sqrt(sum(y * y)) AS n FROM unnest(x.raw) y) n
CROSS JOIN LATERAL (SELECT array_agg((u.v / n.n)::real ORDER BY u.k) AS e
                    FROM unnest(x.raw) WITH ORDINALITY u(v, k)) v
WHERE r.user_id = md5('memory-scale-user' || '$TAG')::uuid;
INSERT INTO archive_marks (user_id, logged_seq, embedded_seq, embedded_model)
VALUES (md5('memory-scale-user' || '$TAG')::uuid, $TURNS, $TURNS, '$MODEL');
RESET session_replication_role;";

/// The other users' secondary indexes are dropped before their load and
/// made after it (their definitions kept in the state row meanwhile).
const DROP_INDEXES: &str = "
UPDATE bench_memory_scale_state SET index_defs = (
    SELECT array_agg(indexdef) FROM pg_indexes
    WHERE schemaname = current_schema() AND tablename IN ('raw_logs', 'turn_embeddings')
      AND indexname NOT IN ('raw_logs_pkey', 'turn_embeddings_pkey'));
DO $$ DECLARE i text; BEGIN
    FOR i IN SELECT indexname FROM pg_indexes
             WHERE schemaname = current_schema() AND tablename IN ('raw_logs', 'turn_embeddings')
               AND indexname NOT IN ('raw_logs_pkey', 'turn_embeddings_pkey') LOOP
        EXECUTE format('DROP INDEX %I', i);
    END LOOP;
END $$;";

/// Other users' turns `$FROM` to `$TO` (one transaction with the progress).
const LOAD_OTHERS: &str = "
SET session_replication_role = replica;
WITH ins AS (
    INSERT INTO raw_logs (user_id, thread_id, message_type, content, created_at, user_seq)
    SELECT md5('memory-scale-other' || (g % $USERS))::uuid,
           md5('memory-scale-other-thread' || (g % $USERS) || ':' || (g / $USERS / 20))::uuid,
           CASE WHEN g % 2 = 0 THEN 'user_query' ELSE 'assistant_response' END,
           $TEXT,
           now() - interval '400 days' + (g / $USERS) * interval '1 hour', g / $USERS + 1
    FROM generate_series($FROM, $TO) g
    RETURNING id, user_id)
INSERT INTO turn_embeddings (turn_id, user_id, model, dims, parts, code)
SELECT id, user_id, '$MODEL', 8, ARRAY[cube(array_fill((id % 97)::float8 / 97, ARRAY[8]))],
       (id % 256)::bit(8)::bit varying
FROM ins;
UPDATE bench_memory_scale_state SET filler_done = $TO + 1;
RESET session_replication_role;";

/// The other users' marks, once their turns are in.
const MARK_OTHERS: &str = "
INSERT INTO archive_marks (user_id, logged_seq, embedded_seq, embedded_model)
SELECT md5('memory-scale-other' || u)::uuid, x.n, x.n, '$MODEL'
FROM generate_series(0, $USERS - 1) u
CROSS JOIN LATERAL (SELECT $FILLER / $USERS + CASE WHEN u < $FILLER % $USERS THEN 1 ELSE 0 END AS n) x
WHERE x.n > 0
ON CONFLICT (user_id) DO NOTHING";

/// `sql` with `$TEXT`, `$MODEL` and `$USERS` filled in.
fn fill(sql: &str) -> String {
    sql.replace("$TEXT", TEXT)
        .replace("$MODEL", MODEL)
        .replace("$USERS", &OTHER_USERS.to_string())
}

/// The state row of a database a run before left, when its schema is
/// current: (other turns loaded, built).
async fn state(url: &str) -> Option<(Client, i64, bool)> {
    let mut c = super::support::try_connect(url).await.ok()?;
    let r = c
        .query_one("SELECT filler_done, built FROM bench_memory_scale_state", &[])
        .await
        .ok()?;
    let report = maas::db::migrate::migrate(&mut c, false).await.ok()?;
    report.applied.is_empty().then(|| (c, r.get(0), r.get(1)))
}

/// The database with the measured users and `filler` turns of others:
/// reused, resumed, or built.
async fn database(b: &Bench, filler: i64) -> String {
    let name = format!("memory_scale_{filler}");
    let url = format!("{}?sslmode=disable", b.cluster.url(&format!("bench_{name}")));
    let t0 = Instant::now();
    let (c, done) = match state(&url).await {
        Some((_, _, true)) => {
            eprintln!("memory-scale: reusing bench_{name}");
            return url;
        }
        // (nothing of the others loaded: the measured users' part may have
        // stopped half way, so it is made again)
        Some((c, done, false)) if done > 0 => {
            eprintln!("memory-scale: resuming bench_{name} at {done} of {filler} other turns");
            (c, done)
        }
        _ => {
            let url = b.fresh_db(&name).await;
            let mut c = connect(&url).await;
            maas::db::migrate::migrate(&mut c, false).await.unwrap();
            c.batch_execute(STATE).await.unwrap();
            c.execute(
                "INSERT INTO bench_memory_scale_state VALUES ($1, 0, false, NULL)",
                &[&filler],
            )
            .await
            .unwrap();
            for (tag, turns) in USERS {
                let sql = fill(LOAD_USER)
                    .replace("$TAG", tag)
                    .replace("$TURNS", &turns.to_string());
                c.batch_execute(&sql).await.unwrap();
                eprintln!(
                    "memory-scale: user of {turns} turns in ({:.0} s)",
                    t0.elapsed().as_secs_f64()
                );
            }
            lists(&c, &url).await;
            (c, 0)
        }
    };
    load_others(&c, done, filler, t0).await;
    c.batch_execute("UPDATE bench_memory_scale_state SET built = true")
        .await
        .unwrap();
    eprintln!(
        "memory-scale: bench_{name} built in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    url
}

/// The measured users' lists, as the embedder makes them: trained for
/// each user of at least `TRAIN_TURNS` turns, then every embedding
/// assigned (before the other users' load, while the indexes are there).
async fn lists(c: &Client, url: &str) {
    use maas::embedder::lists::{TRAIN_TURNS, assign_all, train};
    // (the statistics and visibility autovacuum would have by then)
    c.batch_execute("VACUUM ANALYZE raw_logs, turn_embeddings")
        .await
        .unwrap();
    let pool = pool(url);
    let client = pool.get().await.unwrap();
    for (tag, turns) in USERS.into_iter().filter(|u| u.1 >= TRAIN_TURNS) {
        let (user, _) = user_and_thread(c, tag, turns).await;
        let t0 = Instant::now();
        let k = train(&client, user, MODEL, 384).await.unwrap();
        let trained = t0.elapsed().as_secs_f64();
        let n = assign_all(&client, MODEL).await.unwrap();
        eprintln!(
            "memory-scale: user of {turns} turns: {k} lists trained in {trained:.1} s, {n} embeddings assigned in {:.1} s",
            t0.elapsed().as_secs_f64() - trained
        );
    }
}

/// Loads the other users' turns from `done` on, then the indexes, marks
/// and statistics.
async fn load_others(c: &Client, done: i64, filler: i64, t0: Instant) {
    if filler > 0 && done == 0 {
        c.batch_execute(DROP_INDEXES).await.unwrap();
    }
    let mut from = done;
    while from < filler {
        let to = (from + SLICE).min(filler) - 1;
        let sql = fill(LOAD_OTHERS)
            .replace("$FROM", &from.to_string())
            .replace("$TO", &to.to_string());
        c.batch_execute(&sql).await.unwrap();
        from = to + 1;
        eprintln!(
            "memory-scale: {from} of {filler} other turns ({:.0} s)",
            t0.elapsed().as_secs_f64()
        );
    }
    let defs: Option<Vec<String>> = c
        .query_one("SELECT index_defs FROM bench_memory_scale_state", &[])
        .await
        .unwrap()
        .get(0);
    c.batch_execute("SET maintenance_work_mem = '1GB'").await.unwrap();
    for def in defs.unwrap_or_default() {
        let def = def.replacen(" INDEX ", " INDEX IF NOT EXISTS ", 1);
        c.batch_execute(&def).await.unwrap();
        eprintln!("memory-scale: {def} ({:.0} s)", t0.elapsed().as_secs_f64());
    }
    let marks = fill(MARK_OTHERS).replace("$FILLER", &filler.to_string());
    c.batch_execute(&marks).await.unwrap();
    c.batch_execute("VACUUM ANALYZE").await.unwrap();
}

/// A measured user's id and the thread of its newest turns.
async fn user_and_thread(c: &Client, tag: &str, turns: i64) -> (Uuid, Uuid) {
    let r = c
        .query_one(
            "SELECT md5('memory-scale-user' || $1::text)::uuid,
                    md5('memory-scale-thread' || $1::text || ':' || ($2::int8 / 20))::uuid",
            &[&tag, &turns],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// The statement `repo::memory::search` runs with embeddings on, for
/// EXPLAIN.
const SEARCH_SQL: &str = concat!(
    include_str!("../../sql/queries/memory_search.sql"),
    include_str!("../../sql/queries/memory_search_semantic.sql"),
    include_str!("../../sql/queries/memory_search_items.sql"),
);

/// A measured user and the queries it is searched with.
struct Probe {
    user: Uuid,
    thread: Uuid,
    /// Query embeddings: sampled turns' vectors plus noise (cosine about
    /// 0.87 with their turn), of unit length.
    vectors: Vec<Vec<f32>>,
}

impl Probe {
    async fn new(c: &Client, tag: &str, turns: i64, n: i64) -> Probe {
        use rand::{Rng, SeedableRng};
        let (user, thread) = user_and_thread(c, tag, turns).await;
        let rows = c
            .query(
                "SELECT ARRAY(SELECT cube_ll_coord(p.c, j)
                              FROM unnest(e.parts) WITH ORDINALITY AS p(c, k)
                              CROSS JOIN LATERAL generate_series(1, cube_dim(p.c)) AS j
                              ORDER BY p.k, j)::real[]
                 FROM (SELECT e.parts FROM turn_embeddings e
                       WHERE e.user_id = $1 AND e.dims = 384
                       ORDER BY md5(e.turn_id::text) LIMIT $2) e",
                &[&user, &n],
            )
            .await
            .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let vectors = rows
            .iter()
            .map(|r| {
                let mut v: Vec<f32> = r.get(0);
                for x in &mut v {
                    *x += (rng.random::<f32>() - 0.5) * 0.1;
                }
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.iter().map(|x| x / norm).collect()
            })
            .collect();
        Probe { user, thread, vectors }
    }

    /// The `i`-th search, as the assembler makes it (the daemon's
    /// `[memory]` defaults) with semantic weight `weight`.
    fn search(&self, i: usize, weight: f64) -> MemorySearch<'_> {
        let m = maas::config::MemoryConfig::default();
        MemorySearch {
            user_id: self.user,
            request_id: Uuid::nil(),
            thread_id: Some(self.thread),
            thread_turns: m.thread_turns,
            query: QUERIES[i % QUERIES.len()],
            hits: m.hits,
            window: m.window,
            records: m.records,
            first_person: false,
            semantic: Some(Semantic {
                embedding: &self.vectors[i % self.vectors.len()],
                model: MODEL,
                weight,
            }),
        }
    }
}

/// The daemon's pool over `url`.
fn pool(url: &str) -> maas::db::Pool {
    let cfg = maas::config::Config {
        database_url: maas::config::Secret(url.to_owned()),
        ..Default::default()
    };
    maas::db::connect_pool(&cfg, "bench-memory-scale").unwrap()
}

/// Milliseconds of one search, and the ids of its hits in order.
async fn timed(client: &deadpool_postgres::Client, s: &MemorySearch<'_>) -> (f64, Vec<i64>) {
    let t0 = Instant::now();
    let items = search(client, s).await.unwrap();
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    (
        ms,
        items
            .iter()
            .filter(|i| i.why == maas::model::FoundAs::Hit)
            .map(|i| i.id)
            .collect(),
    )
}

/// `rounds` searches of `p` in each database, interleaved (after a
/// warm-up); milliseconds, sorted.
async fn latencies(
    small: &deadpool_postgres::Client,
    large: &deadpool_postgres::Client,
    p: &Probe,
    rounds: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut a, mut b) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for i in 0..rounds + 10 {
        let s = p.search(i, maas::config::MemoryConfig::default().semantic_weight);
        let (x, _) = timed(small, &s).await;
        let (y, _) = timed(large, &s).await;
        if i >= 10 {
            a.push(x);
            b.push(y);
        }
    }
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    (a, b)
}

/// Rows the statement's scans return and bytes it reads (shared buffers
/// hit or read), from EXPLAIN (ANALYZE, BUFFERS) of one search.
async fn reads(c: &Client, s: &MemorySearch<'_>) -> (f64, f64) {
    let sem = s.semantic.as_ref().unwrap();
    let int = |n: usize| i32::try_from(n).unwrap();
    let sql = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {SEARCH_SQL}");
    let row = c
        .query_one(
            &sql,
            &[
                &s.user_id,
                &s.query,
                &int(s.hits),
                &int(s.window),
                &int(s.records),
                &s.thread_id,
                &int(s.thread_turns),
                &s.request_id,
                &sem.embedding,
                &sem.model,
                &sem.weight,
            ],
        )
        .await
        .unwrap();
    let plan: Value = row.get(0);
    let top = &plan[0]["Plan"];
    let blocks = top["Shared Hit Blocks"].as_f64().unwrap_or(0.0) + top["Shared Read Blocks"].as_f64().unwrap_or(0.0);
    (scanned_rows(top), blocks * 8192.0)
}

/// Rows returned by the relation scans under `node` (rows × loops).
fn scanned_rows(node: &Value) -> f64 {
    let own = if node.get("Relation Name").is_some() {
        node["Actual Rows"].as_f64().unwrap_or(0.0) * node["Actual Loops"].as_f64().unwrap_or(1.0)
    } else {
        0.0
    };
    let children = node["Plans"]
        .as_array()
        .map_or(0.0, |ps| ps.iter().map(scanned_rows).sum());
    own + children
}

/// Recall@10 and @`hits` of the approximate hits against the exact ones
/// (semantic part alone: weight 1), and the exact search's p50 in
/// milliseconds, for the largest user.
async fn recall(client: &deadpool_postgres::Client, p: &Probe) -> (f64, f64, f64) {
    let (mut at10, mut at_all, mut exact_ms) = (0.0, 0.0, Vec::new());
    let n = p.vectors.len();
    for i in 0..n {
        let s = p.search(i, 1.0);
        let (_, approx) = timed(client, &s).await;
        client.batch_execute(EXACT_ALWAYS).await.unwrap();
        let (ms, exact) = timed(client, &s).await;
        client.batch_execute("RESET maas.memory_exact_turns").await.unwrap();
        exact_ms.push(ms);
        let share = |k: usize| {
            let want = &exact[..k.min(exact.len())];
            approx.iter().take(k).filter(|id| want.contains(id)).count() as f64 / want.len().max(1) as f64
        };
        at10 += share(10);
        at_all += share(s.hits);
    }
    exact_ms.sort_by(f64::total_cmp);
    (at10 / n as f64, at_all / n as f64, percentile(&exact_ms, 0.5).unwrap())
}

/// Bytes per turn on disk in the database of the measured users alone:
/// the turns' table (text, tsvector), the full-text GIN index, the other
/// indexes of raw_logs, the embeddings (table and indexes).
async fn disk(b: &mut Bench, c: &Client) {
    let r = c
        .query_one(
            "SELECT (SELECT count(*) FROM raw_logs)::float8,
                    pg_table_size('raw_logs')::float8,
                    pg_relation_size('raw_logs_search_idx')::float8,
                    (pg_indexes_size('raw_logs') - pg_relation_size('raw_logs_search_idx'))::float8,
                    -- a 384-dimension row's share of the table, and an index entry each
                    (SELECT pg_table_size('turn_embeddings')
                                * (sum(pg_column_size(e.*)) FILTER (WHERE e.dims = 384))::float8
                                / sum(pg_column_size(e.*))
                                / (count(*) FILTER (WHERE e.dims = 384))
                            + pg_indexes_size('turn_embeddings')::float8 / count(*)
                     FROM turn_embeddings e)",
            &[],
        )
        .await
        .unwrap();
    let turns: f64 = r.get(0);
    for (i, key, note) in [
        (
            1,
            "memory_disk_text_bytes_per_turn",
            "raw_logs: the row, its text and tsvector",
        ),
        (
            2,
            "memory_disk_gin_bytes_per_turn",
            "raw_logs_search_idx (user_id, search)",
        ),
        (3, "memory_disk_btree_bytes_per_turn", "raw_logs' other indexes"),
        (
            4,
            "memory_disk_embedding_bytes_per_turn",
            "turn_embeddings, a 384-dimension turn: its row (parts, code, list), its two index entries",
        ),
    ] {
        let bytes: f64 = r.get(i);
        let per_turn = if i == 4 { bytes } else { bytes / turns };
        b.record(key, round(per_turn, 0), note);
    }
}

/// Milliseconds per turn of logging 10,000 turns of 1,000 users in one
/// INSERT (triggers on, every index) into `c`'s table; the median of
/// three, each rolled back.
async fn insert_cost(c: &Client) -> f64 {
    let mut per_turn = Vec::new();
    for run in 0..3 {
        let insert = format!(
            "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
             SELECT md5('memory-scale-insert{run}:' || (g % 1000))::uuid,
                    md5('memory-scale-insert-thread{run}:' || (g % 1000))::uuid, 'user_query', {TEXT}
             FROM generate_series(1, 10000) g"
        );
        c.batch_execute("BEGIN").await.unwrap();
        let t0 = Instant::now();
        c.batch_execute(&insert).await.unwrap();
        per_turn.push(t0.elapsed().as_secs_f64() * 1000.0 / 10_000.0);
        c.batch_execute("ROLLBACK").await.unwrap();
    }
    per_turn.sort_by(f64::total_cmp);
    per_turn[1]
}

/// The embedder the daemon would use by default when its model is in the
/// cache, else the offline one.
fn embedder() -> maas::llm::embed::Embedder {
    use maas::llm::embed::{DEFAULT_BATCH, Embedder, EmbeddingProvider, EmbeddingSettings};
    let env = |k: &str| std::env::var(k).ok();
    let dir = maas::llm::embed::default_model_dir(&env).filter(|d| d.is_dir());
    let (provider, model) = match dir {
        Some(d) => {
            let name = d
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (EmbeddingProvider::Local(d), name)
        }
        None => (EmbeddingProvider::Offline, "offline-hash-384".to_owned()),
    };
    Embedder::new(&EmbeddingSettings {
        provider,
        model,
        batch: DEFAULT_BATCH,
        timeout: Duration::from_secs(60),
    })
    .unwrap()
}

/// Turns per second the embedder service back-fills for one user of 512
/// turns (a database of its own, so nothing else is pending).
async fn backfill(b: &mut Bench) {
    let url = b.fresh_db("memory_scale_embedder").await;
    let mut c = connect(&url).await;
    maas::db::migrate::migrate(&mut c, false).await.unwrap();
    let load = format!(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
         SELECT md5('memory-scale-backfill')::uuid, md5('memory-scale-backfill:' || (g / 20))::uuid,
                'user_query', {TEXT}
         FROM generate_series(1, 512) g"
    );
    c.batch_execute(&load).await.unwrap();
    let embedder = embedder();
    let pool = pool(&url);
    let t0 = Instant::now();
    let mut turns = 0;
    loop {
        let pass = maas::embedder::pass(&pool, &embedder, None).await.unwrap();
        turns += pass.embedded;
        if pass.embedded == 0 {
            break;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    b.record(
        "memory_backfill_turns_per_s",
        round(turns as f64 / secs, 1),
        &format!(
            "embedder service, {} {} (batch {}), {turns} embeddings of one user's 512 turns",
            embedder.provider_name(),
            embedder.model(),
            embedder.batch()
        ),
    );
}

/// Records a must line: PASS or FAIL, with the figure and the bound.
fn must(b: &mut Bench, key: &str, ok: bool, note: &str) {
    b.record(key, if ok { "PASS" } else { "FAIL" }, note);
}

/// The section, when `--only` names it (never as part of a run without
/// `--only`: its first build takes many minutes).
pub async fn when_asked(b: &mut Bench, only: Option<&str>) {
    if only.is_some_and(|o| o.split(',').any(|x| x == "memory-scale")) {
        memory_scale(b).await;
    }
}

/// The measured users' common lexemes, as the embedder counts them (once
/// per database: a count is not due again until the user has doubled).
async fn common_lexemes(c: &Client, client: &deadpool_postgres::Client) {
    use maas::repo::memory::{COMMON_LEXEMES_FROM, count_common_lexemes};
    for (tag, turns) in USERS {
        let (user, _) = user_and_thread(c, tag, turns).await;
        let t0 = Instant::now();
        let n = count_common_lexemes(client, user, turns, COMMON_LEXEMES_FROM)
            .await
            .unwrap();
        if n > 0 {
            eprintln!(
                "memory-scale: user of {turns} turns: {n} common lexemes counted in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
        }
    }
}

/// The section: builds (or reuses) the two databases, then measures.
async fn memory_scale(b: &mut Bench) {
    let measured: i64 = USERS.iter().map(|u| u.1).sum();
    let total = std::env::args()
        .find_map(|a| a.strip_prefix("--memory-scale-turns=")?.parse::<i64>().ok())
        .unwrap_or(if b.quick { 1_000_000 } else { 10_000_000 });
    let others = (total - measured).max(OTHER_USERS + 1);
    let small_url = database(b, OTHER_USERS).await;
    let large_url = database(b, others).await;
    if std::env::args().any(|a| a == "--memory-scale-build") {
        // The databases only (a build needs no quiet machine; the
        // measurement does).
        return;
    }
    let (small, large) = (pool(&small_url), pool(&large_url));
    let (small, large) = (small.get().await.unwrap(), large.get().await.unwrap());
    let c = connect(&large_url).await;
    common_lexemes(&c, &small).await;
    common_lexemes(&c, &large).await;
    b.record(
        "memory_table_turns",
        Value::from(measured + others),
        "turns in raw_logs (and turn_embeddings) of the large database",
    );
    let rounds = if b.quick { 100 } else { 300 };
    let mut flat = true;
    let mut largest = None;
    for (tag, turns) in USERS {
        let p = Probe::new(&c, tag, turns, 50).await;
        let (alone, among) = latencies(&small, &large, &p, rounds).await;
        let pct = |v: &[f64], q: f64| round(percentile(v, q).unwrap(), 2);
        let (p50_alone, p50) = (pct(&alone, 0.5), pct(&among, 0.5));
        b.record(
            &format!("memory_{tag}_p50_ms"),
            p50,
            &format!("{rounds} searches, semantic on"),
        );
        b.record(&format!("memory_{tag}_p99_ms"), pct(&among, 0.99), "");
        b.record(
            &format!("memory_{tag}_alone_p50_ms"),
            p50_alone,
            "the same searches, the user's turns alone in the table",
        );
        flat &= p50 <= p50_alone * 1.25 || p50 - p50_alone <= 0.5;
        let (rows, bytes) = reads(&c, &p.search(0, 0.5)).await;
        b.record(
            &format!("memory_{tag}_rows_read"),
            round(rows, 0),
            "rows the statement's scans return",
        );
        b.record(
            &format!("memory_{tag}_kb_read"),
            round(bytes / 1024.0, 0),
            "shared buffers hit or read (EXPLAIN BUFFERS)",
        );
        if turns == 10_000 {
            // Where the exact scan and the lists cross: the exact scan of
            // this user (the lists' path is the p50 above).
            large.batch_execute(EXACT_ALWAYS).await.unwrap();
            let mut exact = Vec::new();
            for i in 0..30 {
                exact.push(timed(&large, &p.search(i, 0.5)).await.0);
            }
            large.batch_execute("RESET maas.memory_exact_turns").await.unwrap();
            exact.sort_by(f64::total_cmp);
            b.record(
                "memory_10k_exact_p50_ms",
                pct(&exact, 0.5),
                "30 searches, the exact scan (maas.memory_exact_turns above)",
            );
        }
        largest = Some((p, pct(&among, 0.99)));
    }
    let (p, p99) = largest.unwrap();
    let (at10, at40, exact_p50) = recall(&large, &p).await;
    b.record(
        "memory_100k_exact_p50_ms",
        round(exact_p50, 2),
        "the exact scan (maas.memory_exact_turns above)",
    );
    b.record(
        "memory_recall_at_10",
        round(at10, 3),
        "approximate ∩ exact hits, semantic weight 1, 50 queries",
    );
    b.record(
        "memory_recall_at_40",
        round(at40, 3),
        "the same over the 40 hits a search returns",
    );
    disk(b, &connect(&small_url).await).await;
    let insert_ms = insert_cost(&c).await;
    b.record(
        "memory_insert_ms_per_turn",
        round(insert_ms, 4),
        "a 10,000-turn INSERT ÷ 10,000, large table",
    );
    backfill(b).await;
    must(
        b,
        "must_memory_p99_100k",
        p99 <= 50.0,
        &format!("p99 {p99} ms at 100k turns (≤ 50)"),
    );
    must(
        b,
        "must_memory_insert_per_turn",
        insert_ms <= 0.2,
        &format!("{insert_ms:.4} ms of insert work per logged turn (≤ 0.2)"),
    );
    must(
        b,
        "must_memory_other_users",
        flat,
        "p50 among others' turns ≤ 1.25 × alone (or +0.5 ms), every user",
    );
}
