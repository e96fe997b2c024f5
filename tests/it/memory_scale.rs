//! The semantic search at size, on a real database: above
//! `maas.memory_exact_turns` turns a user's embeddings are ranked by their
//! binary codes first and only the nearest are compared exactly
//! (sql/0024_embedding_codes.sql), of the nearest lists only once the
//! user's lists are trained and assigned (sql/0028_embedding_lists.sql);
//! at or below it every embedding is compared.

use rand::{Rng, SeedableRng};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::db::{TestDb, rows};

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
    user_with(db, c, user, TURNS).await
}

/// A user of `turns` turns with embeddings (see [`user_with_turns`]).
async fn user_with(db: &TestDb, c: &Client, user: Uuid, turns: i64) -> (Vec<i64>, Vec<Vec<f32>>) {
    let ids: Vec<i64> = c
        .query(
            "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
             SELECT $1, $1, 'user_query', 'turn number ' || g FROM generate_series(1, $2::int8) g
             RETURNING id",
            &[&user, &turns],
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
        maas::repo::embeddings::store(&client, user, MODEL, ids, vs, turns)
            .await
            .unwrap();
    }
    (ids, vs)
}

/// Forgets `user` as `maasctl users forget` does.
async fn forget(pool: &maas::db::Pool, user: Uuid) {
    let why = maas::repo::users::Why {
        actor: "test",
        reason: None,
    };
    maas::users::forget_now(pool, maas::repo::users::UserKey::new(user), why)
        .await
        .unwrap();
}

/// The hits of a search by `embedding` alone (semantic weight 1, a query
/// text that matches no turn), best first.
async fn hits(client: &deadpool_postgres::Client, user: Uuid, embedding: &[f32]) -> Vec<i64> {
    hits_for(client, user, embedding, "zzzzqx").await
}

/// The hits of a search by `embedding` and `query` (semantic weight 1: the
/// text only makes full-text candidates), best first.
async fn hits_for(client: &deadpool_postgres::Client, user: Uuid, embedding: &[f32], query: &str) -> Vec<i64> {
    let s = maas::repo::memory::MemorySearch {
        user_id: user,
        request_id: Uuid::new_v4(),
        thread_id: None,
        thread_turns: 0,
        query,
        hits: 10,
        window: 0,
        records: 0,
        first_person: false,
        semantic: Some(maas::repo::memory::Semantic {
            embedding,
            model: MODEL,
            weight: 1.0,
        }),
    };
    let items = maas::repo::memory::search(client, &s).await.unwrap();
    items
        .iter()
        .filter(|i| i.why == maas::model::FoundAs::Hit)
        .map(|i| i.id)
        .collect()
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
    // Named by its words, the hidden turn is a full-text candidate: its
    // cosine is computed too, and it comes first.
    let named = hits_for(&client, user, &vs[hidden], &format!("number {}", hidden + 1)).await;
    assert_eq!(named.first(), Some(&ids[hidden]), "{named:?}");
}

/// A count from `sql` with `user` as `$1`.
async fn count(c: &Client, sql: &str, user: Uuid) -> i64 {
    c.query_one(sql, &[&user]).await.unwrap().get(0)
}

/// A large user's lists: trained by the embedder's rule once the user has
/// enough embeddings, assigned in batches (the search takes the code pass
/// until they are complete), new embeddings stored with their list; the
/// list pass finds a planted vector's turn and reads only the nearest
/// lists; below the size the search stays exact; a change of model drops
/// the lists, and forgetting the user deletes them with its centroids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_are_trained_assigned_searched_and_forgotten() {
    use maas::embedder::lists::{Kept, TRAIN_TURNS, assign_all, keep};
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let turns = TRAIN_TURNS + 100;
    let (ids, vs) = user_with(&db, &c, user, turns).await;
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let lists = "SELECT count(*) FROM embedding_centroids WHERE user_id = $1";

    // Too few logged turns: nothing; enough: trained, not yet assigned.
    assert_eq!(keep(&client, user, MODEL, 384, 10).await.unwrap(), Kept::Unchanged);
    assert_eq!(count(&c, lists, user).await, 0);
    let Kept::Trained(k) = keep(&client, user, MODEL, 384, turns).await.unwrap() else {
        panic!("not trained")
    };
    assert_eq!(k, i64::try_from(maas::embedder::lists::lists_for(turns)).unwrap());
    assert_eq!(count(&c, lists, user).await, k);
    assert_eq!(keep(&client, user, MODEL, 384, turns).await.unwrap(), Kept::Unchanged);

    // Turn `hidden` is put in the list farthest from its vector: only a
    // search that does not go by lists can find it.
    let (planted, hidden) = (700, 900);
    let far = "UPDATE turn_embeddings e SET list = (
                   SELECT c.list FROM embedding_centroids c WHERE c.user_id = e.user_id
                   ORDER BY (SELECT sum(cube_distance(x.a, x.b) ^ 2) FROM unnest(c.parts, e.parts) AS x(a, b)) DESC
                   LIMIT 1)
               WHERE e.turn_id = $1";
    client
        .batch_execute("SET maas.memory_exact_turns = '100'")
        .await
        .unwrap();
    // Not assigned yet: the code pass over all the user's turns.
    c.execute(far, &[&ids[hidden]]).await.unwrap();
    assert_eq!(hits(&client, user, &vs[hidden]).await.first(), Some(&ids[hidden]));

    let assigned = assign_all(&client, MODEL).await.unwrap();
    assert_eq!(assigned, turns);
    let unassigned = "SELECT count(*) FROM turn_embeddings WHERE user_id = $1 AND list IS NULL";
    assert_eq!(count(&c, unassigned, user).await, 0);
    let complete = "SELECT count(*) FROM embedding_lists WHERE user_id = $1 AND complete";
    assert_eq!(count(&c, complete, user).await, 1);

    // The list pass: the planted turn first, the hidden one missed.
    c.execute(far, &[&ids[hidden]]).await.unwrap();
    let approx = hits(&client, user, &vs[planted]).await;
    assert_eq!(approx.first(), Some(&ids[planted]), "{approx:?}");
    let approx = hits(&client, user, &vs[hidden]).await;
    assert!(!approx.contains(&ids[hidden]), "{approx:?}");
    assert_eq!(approx.len(), 10);
    // Named by its words, the hidden turn is a full-text candidate: its
    // cosine is computed too, and it comes first.
    let named = hits_for(&client, user, &vs[hidden], &format!("number {}", hidden + 1)).await;
    assert_eq!(named.first(), Some(&ids[hidden]), "{named:?}");
    // At or below the size: exact, whatever the lists say.
    client.batch_execute("RESET maas.memory_exact_turns").await.unwrap();
    assert_eq!(hits(&client, user, &vs[hidden]).await.first(), Some(&ids[hidden]));

    // A new embedding is stored with its list.
    let extra: i64 = c
        .query_one(
            "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
             VALUES ($1, $1, 'user_query', 'one more') RETURNING id",
            &[&user],
        )
        .await
        .unwrap()
        .get(0);
    maas::repo::embeddings::store(&client, user, MODEL, &[extra], &vs[..1], turns + 1)
        .await
        .unwrap();
    assert_eq!(count(&c, unassigned, user).await, 0);

    // Another model: the user's lists of the first are dropped.
    maas::repo::embeddings::store(&client, user, "another-384", &[ids[0]], &vs[..1], 1)
        .await
        .unwrap();
    assert_eq!(count(&c, lists, user).await, 0);
    assert_eq!(
        count(&c, "SELECT count(*) FROM embedding_lists WHERE user_id = $1", user).await,
        0
    );

    // Forgetting the user deletes its lists and centroids.
    maas::embedder::lists::train(&client, user, "another-384", 384)
        .await
        .unwrap();
    assert_eq!(
        count(&c, lists, user).await,
        1,
        "one embedding of that model: one centroid"
    );
    forget(&pool, user).await;
    assert_eq!(count(&c, lists, user).await, 0);
    assert_eq!(
        count(&c, "SELECT count(*) FROM embedding_lists WHERE user_id = $1", user).await,
        0
    );
}

/// The long-term hits of a full-text search for `query` (ids and scores,
/// best first).
async fn text_hits(client: &deadpool_postgres::Client, user: Uuid, query: &str) -> Vec<(i64, String)> {
    let s = maas::repo::memory::MemorySearch {
        user_id: user,
        request_id: Uuid::new_v4(),
        thread_id: None,
        thread_turns: 0,
        query,
        hits: 40,
        window: 0,
        records: 0,
        first_person: false,
        semantic: None,
    };
    let items = maas::repo::memory::search(client, &s).await.unwrap();
    items
        .iter()
        .filter(|i| i.why == maas::model::FoundAs::Hit)
        .map(|i| (i.id, format!("{:?}", i.score)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn common_lexemes_are_counted_skipped_and_forgotten_and_the_hits_stay_the_same() {
    use maas::repo::memory::count_common_lexemes;
    let db = TestDb::new().await;
    let c = db.client().await;
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let user = Uuid::new_v4();
    // Every turn holds "apples" and "number", every other one "pears",
    // three "kiwis"; the newest turns no kiwi.
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
         SELECT $1, $1, 'user_query',
                'apples ' || CASE WHEN g % 2 = 0 THEN 'pears ' ELSE '' END
                || CASE WHEN g % 150 = 7 THEN 'kiwis ' ELSE '' END || 'number ' || g
         FROM generate_series(1, 600) g",
        &[&user],
    )
    .await
    .unwrap();
    let stored = "SELECT count(*) FROM common_lexemes WHERE user_id = $1";
    let query = "apples, pears and kiwis: what number?";
    let before = text_hits(&client, user, query).await;
    assert_eq!(before.len(), 40);

    // Below the least size, or not logged: not counted.
    assert_eq!(count_common_lexemes(&client, user, 600, 1_000).await.unwrap(), 0);
    assert_eq!(
        count_common_lexemes(&client, Uuid::new_v4(), 600, 500).await.unwrap(),
        0
    );
    assert_eq!(count(&c, stored, user).await, 0);

    // Counted: the lexemes in at least 256 turns, with their turns.
    assert_eq!(count_common_lexemes(&client, user, 600, 500).await.unwrap(), 3);
    let common: Vec<(String, i64)> = rows(
        &c,
        "SELECT lexeme, turns FROM common_lexemes WHERE user_id = $1 ORDER BY lexeme",
        &[&user],
        |r| (r.get(0), r.get(1)),
    )
    .await;
    let lexeme = |w: &str| {
        let c = &c;
        let w = w.to_owned();
        async move {
            let r = c
                .query_one("SELECT strip(to_tsvector('maas_memory', $1))::text", &[&w])
                .await
                .unwrap();
            r.get::<_, String>(0).trim_matches('\'').to_owned()
        }
    };
    let (apples, pears, number) = (lexeme("apples").await, lexeme("pears").await, lexeme("number").await);
    let mut want = vec![(apples, 600), (number, 600), (pears, 300)];
    want.sort();
    assert_eq!(common, want);

    // The search skips their lookups and finds the same hits, same scores.
    assert_eq!(text_hits(&client, user, query).await, before);

    // Not due again until the user has doubled.
    assert_eq!(count_common_lexemes(&client, user, 1_199, 500).await.unwrap(), 0);
    c.execute("UPDATE common_lexemes SET turns = 256 WHERE user_id = $1", &[&user])
        .await
        .unwrap();
    assert_eq!(count_common_lexemes(&client, user, 1_200, 500).await.unwrap(), 3);
    let recounted = "SELECT count(*) FROM common_lexemes WHERE user_id = $1 AND turns >= 300";
    assert_eq!(count(&c, recounted, user).await, 3);

    // A lexeme no longer common is dropped at the next count.
    c.execute(
        "INSERT INTO common_lexemes (user_id, lexeme, turns) VALUES ($1, $2, 256)",
        &[&user, &lexeme("kiwis").await],
    )
    .await
    .unwrap();
    assert_eq!(count_common_lexemes(&client, user, 2_400, 500).await.unwrap(), 3);
    assert_eq!(count(&c, stored, user).await, 3);

    // Forgetting the user deletes them with its mark.
    forget(&pool, user).await;
    assert_eq!(count(&c, stored, user).await, 0);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM common_lexemes_counted WHERE user_id = $1",
            user
        )
        .await,
        0
    );
}

/// A user whose turns come in a rhythm (here a question and its answer,
/// each of its own 8 topics, logged in turn, so the ids alternate between
/// the two kinds) is trained from a sample across the rhythm: every topic
/// of both kinds gets a centroid of its own, and the list pass finds the
/// exact search's hits for queries of either kind. A sample of every n-th
/// id with an even n saw one kind only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_are_trained_from_a_sample_across_the_turns_rhythm() {
    use maas::embedder::lists::{assign_all, lists_for, train};
    const RHYTHM_TURNS: usize = 4_000;
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut random = |scale: f32| -> Vec<f32> { (0..DIMS).map(|_| (rng.random::<f32>() - 0.5) * scale).collect() };
    let unit = |v: Vec<f32>| -> Vec<f32> {
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / norm).collect()
    };
    // 16 topics: turn i is of kind i % 2, topic (i / 2) % 8 of that kind;
    // a turn's cosine with its topic's centre is about 0.7.
    let centres: Vec<Vec<f32>> = (0..16).map(|_| unit(random(1.0))).collect();
    let topic = |i: usize| (i % 2) * 8 + (i / 2) % 8;
    let vs: Vec<Vec<f32>> = (0..RHYTHM_TURNS)
        .map(|i| {
            let noise = unit(random(1.0));
            unit(centres[topic(i)].iter().zip(&noise).map(|(c, n)| c + n).collect())
        })
        .collect();
    let ids: Vec<i64> = c
        .query(
            "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
             SELECT $1, $1, CASE WHEN g % 2 = 0 THEN 'user_query' ELSE 'assistant_response' END, 'turn number ' || g
             FROM generate_series(0, $2::int8 - 1) g ORDER BY g
             RETURNING id",
            &[&user, &i64::try_from(RHYTHM_TURNS).unwrap()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut ids = ids;
    ids.sort_unstable();
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let turns = i64::try_from(RHYTHM_TURNS).unwrap();
    for (ids, vs) in ids.chunks(500).zip(vs.chunks(500)) {
        maas::repo::embeddings::store(&client, user, MODEL, ids, vs, turns)
            .await
            .unwrap();
    }
    let k = train(&client, user, MODEL, 384).await.unwrap();
    assert_eq!(k, i64::try_from(lists_for(turns)).unwrap());
    let centroids: Vec<Vec<f32>> = maas::repo::embeddings::lists_centroids(&client, user, MODEL, 384)
        .await
        .unwrap()
        .iter()
        .map(|c| maas::repo::embeddings::parse_parts(&c.parts).unwrap())
        .collect();
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    for (t, centre) in centres.iter().enumerate() {
        let best = centroids.iter().map(|c| dot(c, centre)).fold(f32::MIN, f32::max);
        assert!(
            best > 0.6,
            "topic {t} (kind {}) has no centroid: best cosine {best}",
            t / 8
        );
    }

    // Through the lists, the exact search's hits, for queries of both kinds.
    assign_all(&client, MODEL).await.unwrap();
    client
        .batch_execute("SET maas.memory_exact_turns = '100'")
        .await
        .unwrap();
    let (mut found, mut wanted) = (0, 0);
    for i in (0..RHYTHM_TURNS).step_by(RHYTHM_TURNS / 20) {
        for j in [i, i + 1] {
            let q = unit(vs[j].iter().zip(random(0.1)).map(|(x, n)| x + n).collect());
            client
                .batch_execute("SET maas.memory_exact_turns = '100'")
                .await
                .unwrap();
            let approx = hits(&client, user, &q).await;
            client.batch_execute("RESET maas.memory_exact_turns").await.unwrap();
            let exact = hits(&client, user, &q).await;
            wanted += exact.len();
            found += exact.iter().filter(|id| approx.contains(id)).count();
        }
    }
    assert!(
        found * 10 >= wanted * 9,
        "the list pass found {found} of the exact search's {wanted} hits"
    );
}
