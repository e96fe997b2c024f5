//! The semantic search at size, on a real database: above
//! `maas.memory_exact_turns` turns a user's embeddings are ranked by their
//! binary codes first and only the nearest are compared exactly; at or
//! below it every embedding is compared (sql/0024_embedding_codes.sql).

use rand::{Rng, SeedableRng};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::db::TestDb;

/// More turns than the approximate pass compares exactly (1,000), so
/// that a turn can fall outside it.
const TURNS: i64 = 1_500;
const DIMS: usize = 384;
const MODEL: &str = "test-384";

/// Random unit vectors, the same every run.
fn vectors(n: usize) -> Vec<Vec<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(32);
    (0..n)
        .map(|_| {
            let v: Vec<f32> = (0..DIMS).map(|_| rng.random::<f32>() - 0.5).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter().map(|x| x / norm).collect()
        })
        .collect()
}

/// A user of `TURNS` turns, each with an embedding stored as the embedder
/// stores it; the turns' ids in order, and their vectors.
async fn user_with_turns(db: &TestDb, c: &Client, user: Uuid) -> (Vec<i64>, Vec<Vec<f32>>) {
    let ids: Vec<i64> = c
        .query(
            "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
             SELECT $1, $1, 'user_query', 'turn number ' || g FROM generate_series(1, $2::int8) g
             RETURNING id",
            &[&user, &TURNS],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let vs = vectors(ids.len());
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    for (ids, vs) in ids.chunks(500).zip(vs.chunks(500)) {
        maas::repo::embeddings::store(&client, user, MODEL, ids, vs, TURNS)
            .await
            .unwrap();
    }
    (ids, vs)
}

/// The hits of a search by `embedding` alone (semantic weight 1, a query
/// text that matches no turn), best first.
async fn hits(client: &deadpool_postgres::Client, user: Uuid, embedding: &[f32]) -> Vec<i64> {
    let s = maas::repo::memory::MemorySearch {
        user_id: user,
        request_id: Uuid::new_v4(),
        thread_id: None,
        thread_turns: 0,
        query: "zzzzqx",
        hits: 10,
        window: 0,
        records: 0,
        semantic: Some(maas::repo::memory::Semantic {
            embedding: embedding.to_vec(),
            model: MODEL,
            weight: 1.0,
        }),
    };
    let items = maas::repo::memory::search(client, &s).await.unwrap();
    items.iter().filter(|i| i.why == "hit").map(|i| i.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approximate_pass_finds_a_planted_vector_and_small_users_stay_exact() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let (ids, vs) = user_with_turns(&db, &c, user).await;

    // Stored codes are the sign bits, as the migration computes them from
    // the parts of embeddings stored before it.
    let differing: i64 = c
        .query_one(
            "SELECT count(*) FROM turn_embeddings e
             WHERE e.code IS DISTINCT FROM (
                 SELECT string_agg(CASE WHEN cube_ll_coord(p.c, j) > 0 THEN '1' ELSE '0' END, ''
                                   ORDER BY p.k, j)::bit varying
                 FROM unnest(e.parts) WITH ORDINALITY AS p(c, k)
                 CROSS JOIN LATERAL generate_series(1, cube_dim(p.c)) AS j)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(differing, 0);

    // Turn `hidden` gets the code farthest from its own vector's: only an
    // exact comparison can find it.
    let (planted, hidden) = (700, 900);
    c.execute(
        "UPDATE turn_embeddings SET code = ~code WHERE turn_id = $1",
        &[&ids[hidden]],
    )
    .await
    .unwrap();

    let pool = db.pool();
    let client = pool.get().await.unwrap();
    // Below the size (20,000 turns by default): exact.
    assert_eq!(hits(&client, user, &vs[planted]).await.first(), Some(&ids[planted]));
    assert_eq!(hits(&client, user, &vs[hidden]).await.first(), Some(&ids[hidden]));

    // Above it: the codes first, then the exact cosine of the nearest.
    client
        .batch_execute("SET maas.memory_exact_turns = '100'")
        .await
        .unwrap();
    let approx = hits(&client, user, &vs[planted]).await;
    assert_eq!(approx.first(), Some(&ids[planted]), "{approx:?}");
    let approx = hits(&client, user, &vs[hidden]).await;
    assert!(!approx.contains(&ids[hidden]), "{approx:?}");
    assert_eq!(approx.len(), 10);
}
