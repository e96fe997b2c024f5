//! The console's request list (`repo::requests::page`) on a real table:
//! keyset pages, the time range, the bounded text search, and the plan of
//! every filter combination (each reads an index in the list's order,
//! never the whole table).

use chrono::{DateTime, Duration, Utc};
use maas::repo::requests::{self, PAGE_TEXT_SCAN, Page, PageFilter};
use uuid::Uuid;

use crate::support::db::{TestDb, plan_with, value};

/// `n` finished requests, one a second, the newest `now - 1 s`; request
/// `g` (1 = oldest) of user `users[g % users.len()]`, in thread `thread`
/// when `g` is even, FAILED when `g % 10 = 0`, CANCELLED when `g % 20 = 5`; its query holds "needle" when `g` is in `needles`.
async fn fill(c: &tokio_postgres::Client, n: i64, users: &[Uuid], thread: Uuid, needles: &[i64]) {
    c.execute(
        "INSERT INTO pipeline_runs (user_id, thread_id, user_query, status, created_at, updated_at)
         SELECT ($2::uuid[])[1 + g % cardinality($2::uuid[])],
                CASE WHEN g % 2 = 0 THEN $3::uuid END,
                CASE WHEN g = ANY($4::int8[]) THEN 'find the NeEdLe ' ELSE 'plain question ' END || g,
                CASE WHEN g % 10 = 0 THEN 'FAILED' WHEN g % 20 = 5 THEN 'CANCELLED' ELSE 'COMPLETED' END,
                now() - make_interval(secs => $1::int8 - g + 1),
                now() - make_interval(secs => $1::int8 - g + 1)
         FROM generate_series(1, $1::int8) g",
        &[&n, &users, &thread, &needles],
    )
    .await
    .unwrap();
    c.batch_execute("VACUUM ANALYZE pipeline_runs").await.unwrap();
}

/// A connection of the daemon's kind of pool (the one `list` takes); the
/// pool is returned too, to live as long as the test.
async fn pooled(db: &TestDb) -> (maas::db::Pool, deadpool_postgres::Object) {
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    (pool, client)
}

fn filter() -> PageFilter {
    PageFilter {
        limit: 50,
        ..PageFilter::default()
    }
}

/// Every line of every page of `f`, following `next`; also the pages.
async fn all_pages(c: &deadpool_postgres::Object, f: &PageFilter) -> (Vec<String>, Vec<Page>) {
    let mut f = f.clone();
    let mut queries = Vec::new();
    let mut pages = Vec::new();
    for _ in 0..100 {
        let page = requests::page(c, &f).await.unwrap();
        queries.extend(page.lines.iter().map(|l| l.query.clone()));
        let next = page.next;
        pages.push(page);
        match next {
            Some(n) => f.before = Some(n),
            None => return (queries, pages),
        }
    }
    panic!("more than 100 pages");
}

#[tokio::test]
async fn console_list_pages_by_keyset_through_every_filter() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let users = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
    let thread = Uuid::new_v4();
    fill(&c, 1_000, &users, thread, &[]).await;
    let (_pool, pc) = pooled(&db).await;

    // No filter: 1,000 lines over 20 full pages (and an empty 21st: a full
    // page always has a next), newest first, none twice.
    let (queries, pages) = all_pages(&pc, &filter()).await;
    assert_eq!(pages.len(), 21);
    assert!(pages[20].lines.is_empty());
    let want: Vec<String> = (1..=1_000).rev().map(|g| format!("plain question {g}")).collect();
    assert_eq!(queries, want);

    // A user (every third), its FAILED ones, a thread (every second).
    let user = PageFilter {
        user_id: Some(users[1]),
        ..filter()
    };
    let (queries, _) = all_pages(&pc, &user).await;
    let want: Vec<String> = (1..=1_000)
        .rev()
        .filter(|g| g % 3 == 1)
        .map(|g| format!("plain question {g}"))
        .collect();
    assert_eq!(queries, want);
    let failed = PageFilter {
        statuses: Some(vec!["FAILED".into()]),
        ..user
    };
    let (queries, _) = all_pages(&pc, &failed).await;
    let want: Vec<String> = (1..=1_000)
        .rev()
        .filter(|g| g % 3 == 1 && g % 10 == 0)
        .map(|g| format!("plain question {g}"))
        .collect();
    assert_eq!(queries, want);
    let in_thread = PageFilter {
        thread_id: Some(thread),
        ..filter()
    };
    assert_eq!(all_pages(&pc, &in_thread).await.0.len(), 500);

    // A time range: created in [now - 100.5 s, now - 10.5 s): g 901 to 990.
    // The insert's now(): the newest row is one second before it.
    let now: DateTime<Utc> = value(
        &c,
        "SELECT max(created_at) + interval '1 second' FROM pipeline_runs",
        &[],
    )
    .await;
    let window = PageFilter {
        since: Some(now - Duration::milliseconds(100_500)),
        until: Some(now - Duration::milliseconds(10_500)),
        ..filter()
    };
    let (queries, pages) = all_pages(&pc, &window).await;
    let want: Vec<String> = (901..=990).rev().map(|g| format!("plain question {g}")).collect();
    assert_eq!(queries, want);
    assert_eq!(pages.len(), 2);
}

#[tokio::test]
async fn a_text_search_reads_a_bounded_window_per_page_and_says_how_far() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let n = i64::try_from(2 * PAGE_TEXT_SCAN).unwrap() + 500;
    // Needles: the newest row, one just past the first window, one in the
    // third window.
    let first_window_end = n - i64::try_from(PAGE_TEXT_SCAN).unwrap();
    let needles = [n, first_window_end - 10, 100];
    fill(&c, n, &[Uuid::new_v4()], Uuid::new_v4(), &needles).await;
    let (_pool, pc) = pooled(&db).await;

    let f = PageFilter {
        text: Some("needle".into()),
        ..filter()
    };
    let (queries, pages) = all_pages(&pc, &f).await;
    assert_eq!(
        queries,
        needles
            .iter()
            .map(|g| format!("find the NeEdLe {g}"))
            .collect::<Vec<_>>(),
        "case-insensitive, newest first, each once"
    );
    assert_eq!(pages.len(), 3, "one page per window of {PAGE_TEXT_SCAN} requests");
    for p in &pages[..2] {
        let (scanned, _) = p.searched.expect("a window that stopped before the end says so");
        assert_eq!(scanned, PAGE_TEXT_SCAN);
        assert_eq!(p.lines.len(), 1);
    }
    assert!(
        pages[2].searched.is_none() && pages[2].next.is_none(),
        "the last window reached the end"
    );
    // The first window ends at the oldest row it read.
    let oldest_read: String = value(
        &c,
        "SELECT user_query FROM pipeline_runs WHERE created_at = $1",
        &[&pages[0].next.unwrap().0],
    )
    .await;
    assert_eq!(oldest_read, format!("plain question {}", first_window_end + 1));

    // A text that no request holds: windows of PAGE_TEXT_SCAN, no lines, and
    // the search ends.
    let none = PageFilter {
        text: Some("absent".into()),
        ..filter()
    };
    let (queries, pages) = all_pages(&pc, &none).await;
    assert!(queries.is_empty());
    assert_eq!(pages.len(), 3);

    // A page full of matches continues after its last line.
    let plain = PageFilter {
        text: Some("PLAIN".into()),
        ..filter()
    };
    let page = requests::page(&pc, &plain).await.unwrap();
    let newest: Vec<String> = (1..n)
        .rev()
        .filter(|g| !needles.contains(g))
        .take(50)
        .map(|g| format!("plain question {g}"))
        .collect();
    assert_eq!(page.lines.iter().map(|l| l.query.clone()).collect::<Vec<_>>(), newest);
    assert!(page.searched.is_none());
    assert_eq!(page.next, page.lines.last().map(|l| (l.created_at, l.id)));
}

/// The plan of `requests_page` with these literal values for $1 to $10
/// (every tenant's requests: $11 NULL).
async fn plan(c: &tokio_postgres::Client, values: [&str; 10]) -> String {
    let sql = maas::repo::statement("requests_page").unwrap().replace("$11", "NULL");
    plan_with(c, &sql, &values).await
}

/// Asserts that `plan` (of the filter `what`) reads `index`, never the
/// whole table, and that the rows of the text-search window (`CTE
/// scanned`) come from `index` in the list's order, unsorted.
fn assert_window_read_in_order(what: &str, plan: &str, index: &str) {
    // A page of the bounded window (2,000 rows, not 50) may read all the
    // rows of a narrow index range and sort them: the planner's choice
    // when they are few (here: a user's 100, a status's in one hour).
    let sort_ok = matches!(what, "user and status" | "text" | "text and status");
    assert!(plan.contains(index), "{what}: expected {index}:\n{plan}");
    assert!(!plan.contains("Seq Scan"), "{what}: a sequential scan:\n{plan}");
    // The rows come in the list's order from the index: the subtree of
    // `CTE scanned` (the lines indented deeper than it) has no Sort.
    let lines: Vec<&str> = plan.lines().collect();
    let start = lines.iter().position(|l| l.trim_start() == "CTE scanned").expect(plan);
    let indent = |l: &str| l.len() - l.trim_start().len();
    let cte: Vec<&str> = lines[start + 1..]
        .iter()
        .take_while(|l| indent(l) > indent(lines[start]))
        .copied()
        .collect();
    assert!(
        cte.iter().any(|l| l.contains(index)) && (sort_ok || !cte.iter().any(|l| l.contains("Sort"))),
        "{what}: the window is not read in order from {index}:\n{plan}"
    );
}

#[tokio::test]
async fn every_console_list_filter_reads_an_index_in_the_lists_order() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // 100 requests per user.
    let users: Vec<Uuid> = (0..300).map(|_| Uuid::new_v4()).collect();
    let thread = Uuid::new_v4();
    fill(&c, 30_000, &users, thread, &[]).await;
    let user = format!("'{}'", users[3]);
    let thread = format!("'{thread}'");
    // CANCELLED: FAILED has a partial index of its own (the overview's).
    let (null, failed, text) = ("NULL", "'{CANCELLED}'", "'needle'");
    // Literals, as the server sees the parameters in a custom plan.
    let at = |ago: i64| format!("'{}'::timestamptz", (Utc::now() - Duration::seconds(ago)).to_rfc3339());
    let (after_t, after_id) = (&at(3_600), "'ffffffff-ffff-ffff-ffff-ffffffffffff'");
    let (since, until) = (&at(3 * 3_600), &at(2 * 3_600));
    let scan = PAGE_TEXT_SCAN.to_string();
    //           status  user   thread  text  before   id        since  until  limit scan
    let cases: Vec<(&str, [&str; 10], &str)> = vec![
        (
            "no filter",
            [null, null, null, null, null, null, null, null, "50", &scan],
            "pipeline_runs_created_idx",
        ),
        (
            "keyset",
            [null, null, null, null, after_t, after_id, null, null, "50", &scan],
            "pipeline_runs_created_idx",
        ),
        (
            "time range",
            [null, null, null, null, null, null, since, until, "50", &scan],
            "pipeline_runs_created_idx",
        ),
        (
            "status",
            [failed, null, null, null, after_t, after_id, null, null, "50", &scan],
            "pipeline_runs_status_created_idx",
        ),
        (
            "user",
            [null, &user, null, null, after_t, after_id, null, null, "50", &scan],
            "pipeline_runs_user_idx",
        ),
        (
            "user and status",
            [failed, &user, null, null, null, null, null, null, "50", &scan],
            "pipeline_runs_user_idx",
        ),
        (
            "thread",
            [null, null, &thread, null, after_t, after_id, null, null, "50", &scan],
            "pipeline_runs_thread_created_idx",
        ),
        (
            "text",
            [null, null, null, text, null, null, null, null, "50", &scan],
            "pipeline_runs_created_idx",
        ),
        (
            "text and status",
            [failed, null, null, text, null, null, since, until, "50", &scan],
            "pipeline_runs_status_created_idx",
        ),
    ];
    for (what, values, index) in cases {
        assert_window_read_in_order(what, &plan(&c, values).await, index);
    }
}
