#!/usr/bin/env python3
"""What PostgreSQL full-text search retrieves on LoCoMo within a memory budget.

Loads LoCoMo conversations into a scratch schema `memres` of a PostgreSQL
database (the harness's raw_logs layout: one row per turn, the conversation's
first speaker `user_query`, the second `assistant_response`, content
`Name: text`, created_at = session date + one minute per turn, one thread per
session, one user per conversation), then, for every question of categories
1-4, runs one ranking statement per variant and packs the ranked turns into
the memory budget. Score as in bin/eval-memory: a question scores when every
evidence turn's text (lowercased letters and digits only) appears in the
packed memory block ("all"), or at least one ("any").

Tokens are counted as the project's estimate (src/stage/tokens.rs, used for
the offline provider and every non-OpenAI model): ceil(UTF-8 bytes / 3), per
line `Name (YYYY-MM-DD): text` plus its newline.

    pip install 'psycopg[binary]'
    python3 benches/retrieval_research.py --db postgresql://postgres@127.0.0.1:5432/postgres \
        path/to/locomo-dev/*.json [--budget 2000] [--only NAME,...] [--extra] [--proposed] [--json]

The database needs the contrib extension btree_gin (Debian: postgresql-contrib).
The schema `memres` is dropped and made again on every run; nothing else is touched.
"""

import argparse
import json
import re
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta

import psycopg

CONFIGS = ["simple", "english", "russian"]

# (hits, window, records) runs of the proposed statement.
PROPOSED = [(40, 2, 0), (40, 2, 1), (40, 1, 0)]


# ---------------------------------------------------------------- data


def norm(text):
    return "".join(c for c in text.lower() if c.isalnum())


def parse_date(s):
    # "1:56 pm on 8 May, 2023"
    return datetime.strptime(s.strip(), "%I:%M %p on %d %B, %Y")


def evidence_ids(raw):
    """LoCoMo evidence entries, normalised: 'D8:6; D9:17' is two ids,
    'D:11:26' is D11:26, a bare 'D' is junk and dropped."""
    out = []
    for e in raw:
        for part in re.split(r"[;,\s]+", e):
            m = re.fullmatch(r"D:?(\d+):(\d+)", part)
            if m:
                out.append(f"D{m.group(1)}:{m.group(2)}")
    return out


def load(files):
    """Users (turns) and questions. A question is kept when it is of
    category 1-4 and every evidence id names a turn that exists (759 on the
    five dev conversations)."""
    users, questions = [], []
    for path in files:
        with open(path, encoding="utf-8") as f:
            conv = json.load(f)
        user = uuid.uuid4()
        first = conv["speaker_a"]
        turns = []
        n = 1
        while f"session_{n}" in conv:
            thread = uuid.uuid4()
            start = parse_date(conv[f"session_{n}_date_time"])
            for i, t in enumerate(conv[f"session_{n}"]):
                turns.append(
                    {
                        "dia": t["dia_id"],
                        "thread": thread,
                        "session": n,
                        "speaker": t["speaker"],
                        "text": t["text"],
                        "type": "user_query" if t["speaker"] == first else "assistant_response",
                        "at": start + timedelta(minutes=i),
                    }
                )
            n += 1
        by_dia = {t["dia"]: t for t in turns}
        users.append({"id": user, "file": path, "turns": turns, "by_dia": by_dia})
        for q in conv["qa"]:
            if q.get("category") not in (1, 2, 3, 4):
                continue
            ev = evidence_ids(q.get("evidence", []))
            if not ev or any(e not in by_dia for e in ev):
                continue
            questions.append(
                {"user": user, "q": q["question"], "cat": q["category"], "ev": [norm(by_dia[e]["text"]) for e in ev]}
            )
    return users, questions


SCHEMA = """
DROP SCHEMA IF EXISTS memres CASCADE;
CREATE SCHEMA memres;
CREATE EXTENSION IF NOT EXISTS btree_gin;
CREATE TABLE memres.turns (
    id           bigint PRIMARY KEY,
    user_id      uuid   NOT NULL,
    thread_id    uuid   NOT NULL,
    user_seq     bigint NOT NULL,
    message_type text   NOT NULL,
    content      text   NOT NULL,
    created_at   timestamptz NOT NULL,
    tsv_simple   tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED,
    tsv_english  tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    tsv_russian  tsvector GENERATED ALWAYS AS (to_tsvector('russian', content)) STORED,
    tsv_both     tsvector GENERATED ALWAYS AS (to_tsvector('russian', content) || to_tsvector('simple', content)) STORED
);
CREATE INDEX ON memres.turns USING gin (user_id, tsv_simple);
CREATE INDEX ON memres.turns USING gin (user_id, tsv_english);
CREATE INDEX ON memres.turns USING gin (user_id, tsv_russian);
CREATE INDEX ON memres.turns USING gin (user_id, tsv_both);
CREATE UNIQUE INDEX ON memres.turns (user_id, user_seq);
"""


def setup(conn, users):
    conn.execute(SCHEMA)
    rows, ident = [], 0
    for u in users:
        for seq, t in enumerate(u["turns"], 1):
            ident += 1
            t["id"] = ident
            t["seq"] = seq
            rows.append(
                (ident, u["id"], t["thread"], seq, t["type"], f"{t['speaker']}: {t['text']}", t["at"])
            )
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO memres.turns (id, user_id, thread_id, user_seq, message_type, content, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            rows,
        )
    conn.execute("ANALYZE memres.turns")
    conn.commit()


# ------------------------------------------------------------ ranking

# The query: tsquery text built from the question in SQL ($q), for config c.
QUERY = {
    # AND of the lexemes
    "and": "plainto_tsquery('{c}', %(q)s)",
    # websearch syntax (AND, quotes, -not); for a plain question the same as AND
    "web": "websearch_to_tsquery('{c}', %(q)s)",
    # OR of the lexemes (no re-stemming: the AND query's text with | for & and <->)
    "or": "replace(replace(plainto_tsquery('{c}', %(q)s)::text, '<->', '|'), '&', '|')::tsquery",
}

# Rankers over the matching turns of the user. {tsv} the column, {tq} the query.
RANK = {
    "ts_rank": "ts_rank(t.{tsv}, {tq})",
    "ts_rank/1": "ts_rank(t.{tsv}, {tq}, 1)",
    "ts_rank/32": "ts_rank(t.{tsv}, {tq}, 32)",
    "ts_rank_cd": "ts_rank_cd(t.{tsv}, {tq})",
    "ts_rank_cd/1": "ts_rank_cd(t.{tsv}, {tq}, 1)",
}


def rank_sql(col, cfg, query, rank, limit=200):
    tq = QUERY[query].format(c=cfg)
    r = RANK[rank].format(tsv=col, tq="q.tq")
    return f"""
        SELECT t.id, {r} AS score
        FROM (SELECT {tq} AS tq) q, memres.turns t
        WHERE t.user_id = %(u)s AND t.{col} @@ q.tq
        ORDER BY score DESC, t.created_at DESC
        LIMIT {limit}"""


def bm25_sql(col, cfg, limit=200, k1=1.2, b=0.75, recency=False):
    """BM25 in one statement: idf per query lexeme from the user's own
    document frequencies (each a GIN lookup on (user_id, tsv)), term
    frequency from the tsvector's positions, length = number of positions.
    Every scan is filtered by user_id."""
    order = "score DESC, t_created DESC" if recency else "score DESC, id"
    return f"""
        WITH ql AS (
            SELECT DISTINCT l.lexeme
            FROM unnest(to_tsvector('{cfg}', %(q)s)) l
        ), n AS (
            SELECT count(*)::float8 AS docs FROM memres.turns WHERE user_id = %(u)s
        ), df AS (
            SELECT ql.lexeme,
                   (SELECT count(*) FROM memres.turns t
                    WHERE t.user_id = %(u)s AND t.{col} @@ quote_literal(ql.lexeme)::tsquery)::float8 AS df
            FROM ql
        ), w AS (
            SELECT df.lexeme, ln(1 + (n.docs - df.df + 0.5) / (df.df + 0.5)) AS idf
            FROM df, n WHERE df.df > 0
        ), hits AS (
            SELECT t.id, t.created_at AS t_created, t.{col} AS tsv
            FROM memres.turns t
            WHERE t.user_id = %(u)s
              AND t.{col} @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM w)
        )
        SELECT h.id,
               sum(w.idf * (array_length(x.positions, 1) * ({k1} + 1))
                   / (array_length(x.positions, 1)
                      + {k1} * (1 - {b} + {b} * h.len / 12.0))) AS score
        FROM (SELECT hits.*, (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 1)
                              FROM unnest(hits.tsv) u) AS len
              FROM hits) h
        CROSS JOIN LATERAL unnest(h.tsv) x
        JOIN w ON w.lexeme = x.lexeme
        GROUP BY h.id, h.t_created
        ORDER BY {order}
        LIMIT {limit}"""


# ------------------------------------------------------------ packing


def tokens(text):
    return -(-len(text.encode("utf-8")) // 3)


def line_of(t):
    return f"{t['speaker']} ({t['at']:%Y-%m-%d}): {t['text']}"


def pack(user, ranked, budget, neighbours=0, order="rank", before=None, after=None, compact=False):
    """Greedy: take hits in rank order; each hit brings the turns of its
    window (`before` turns before it and `after` after it, same thread;
    `neighbours` sets both); a turn already taken is not taken again; a turn
    that does not fit is skipped (smaller ones later may fit) - never cut.

    Line format: `Name (YYYY-MM-DD): text` per turn; with `compact`, each
    run of consecutive turns of one thread is one item: a `(YYYY-MM-DD)`
    line, then `Name: text` lines (the date once per item)."""
    before = neighbours if before is None else before
    after = neighbours if after is None else after
    turns = user["turns"]
    by_id = user["by_id"]
    used, taken, chosen = 0, set(), []

    def cost(j):
        t = turns[j]
        if not compact:
            return tokens(line_of(t)) + 1
        c = tokens(f"{t['speaker']}: {t['text']}") + 1
        if (j - 1) not in taken or turns[j - 1]["thread"] != t["thread"]:
            c += 5  # the item's date line "(YYYY-MM-DD)\n" (approximately)
        return c

    for tid in ranked:
        t = by_id[tid]
        idx = t["idx"]
        group = [idx]
        for d in range(1, max(before, after) + 1):
            if d <= before and idx - d >= 0 and turns[idx - d]["thread"] == t["thread"]:
                group.append(idx - d)
            if d <= after and idx + d < len(turns) and turns[idx + d]["thread"] == t["thread"]:
                group.append(idx + d)
        for j in sorted(group) if compact else group:
            if j in taken:
                continue
            c = cost(j)
            if used + c > budget:
                continue
            used += c
            taken.add(j)
            chosen.append(j)
        if used >= budget - 8:
            break
    if order == "time" or compact:
        chosen.sort()
    if not compact:
        return "\n".join(line_of(turns[j]) for j in chosen)
    out, prev = [], None
    for j in chosen:
        t = turns[j]
        if prev is None or prev != j - 1 or turns[prev]["thread"] != t["thread"]:
            out.append(f"({t['at']:%Y-%m-%d})")
        out.append(f"{t['speaker']}: {t['text']}")
        prev = j
    return "\n".join(out)


def boost_sessions(user, scored, beta):
    """score + beta * (sum of the other hits' scores in the same thread) /
    (the best score): hits in a thread with many hits move up."""
    if not scored or beta == 0:
        return [i for i, _ in scored]
    by_id = user["by_id"]
    top = max(sc for _, sc in scored) or 1.0
    per_thread = {}
    for i, sc in scored:
        per_thread[by_id[i]["thread"]] = per_thread.get(by_id[i]["thread"], 0.0) + sc
    boosted = [(i, sc + beta * (per_thread[by_id[i]["thread"]] - sc) / top) for i, sc in scored]
    boosted.sort(key=lambda x: -x[1])
    return [i for i, _ in boosted]


# ------------------------------------------------------------ runs


CACHE = {}


def ranking(conn, sql, q):
    key = (sql, q["q"], q["user"])
    if key not in CACHE:
        CACHE[key] = [(r[0], float(r[1])) for r in conn.execute(sql, {"u": q["user"], "q": q["q"]}).fetchall()]
    return CACHE[key]


def score(name, questions, blocks, millis=None):
    """The figures of one variant: `blocks[i]` is the memory block packed
    for `questions[i]`; a question scores when every (all) or one (any) of
    its evidence turns is in its block."""
    all_hit = any_hit = 0
    per_cat, sizes = {}, []
    for q, block in zip(questions, blocks):
        sizes.append(tokens(block))
        text = norm(block)
        found = [e in text for e in q["ev"]]
        all_hit += all(found)
        any_hit += any(found)
        c = per_cat.setdefault(q["cat"], [0, 0])
        c[0] += all(found)
        c[1] += 1
    n = len(questions)
    return {
        "variant": name,
        "all": round(all_hit / n, 3),
        "any": round(any_hit / n, 3),
        "per_category": {str(k): round(v[0] / v[1], 3) for k, v in sorted(per_cat.items())},
        "memory_tokens_p50": int(statistics.median(sizes)),
        "memory_tokens_max": max(sizes),
        "sql_ms_p50": round(statistics.median(millis), 2) if millis else 0.0,
    }


def evaluate(conn, users, questions, variant, budget):
    by_user = {u["id"]: u for u in users}
    sql = variant["sql"]
    blocks, millis = [], []
    for q in questions:
        u = by_user[q["user"]]
        t0 = time.perf_counter()
        scored = ranking(conn, sql, q)
        millis.append((time.perf_counter() - t0) * 1000)
        ids = boost_sessions(u, scored, variant.get("beta", 0.0))
        blocks.append(pack(
            u,
            ids,
            variant.get("budget", budget),
            variant.get("neighbours", 0),
            before=variant.get("before"),
            after=variant.get("after"),
            compact=variant.get("compact", False),
        ))
    return score(variant["name"], questions, blocks, millis)


def variants():
    v = []
    # 1. configuration x query form, plain ts_rank, single turns
    for cfg in CONFIGS:
        for query in ("and", "web", "or"):
            v.append({"name": f"{cfg} {query} ts_rank", "sql": rank_sql(f"tsv_{cfg}", cfg, query, "ts_rank")})
    # 2. rankers over OR queries
    for cfg in ("simple", "english"):
        for rank in ("ts_rank/1", "ts_rank/32", "ts_rank_cd", "ts_rank_cd/1"):
            v.append({"name": f"{cfg} or {rank}", "sql": rank_sql(f"tsv_{cfg}", cfg, "or", rank)})
    # 3. BM25 (user-local idf) over each configuration
    for cfg in CONFIGS:
        v.append({"name": f"{cfg} bm25", "sql": bm25_sql(f"tsv_{cfg}", cfg)})
    v.append({"name": "russian+simple bm25", "sql": bm25_sql("tsv_both", "russian")})
    # 4. neighbours
    for cfg in ("english", "russian"):
        for k in (1, 2):
            v.append({"name": f"{cfg} bm25 ±{k}", "sql": bm25_sql(f"tsv_{cfg}", cfg), "neighbours": k})
        v.append({"name": f"{cfg} or ts_rank ±1", "sql": rank_sql(f"tsv_{cfg}", cfg, "or", "ts_rank"), "neighbours": 1})
    v.append({"name": "russian bm25 ±1 recency ties", "sql": bm25_sql("tsv_russian", "russian", recency=True), "neighbours": 1})
    # 5. window shapes, session boost and the compact format over russian BM25
    best = bm25_sql("tsv_russian", "russian")
    for b_, a_ in ((1, 2), (2, 3), (3, 3), (1, 3)):
        v.append({"name": f"russian bm25 -{b_}+{a_}", "sql": best, "before": b_, "after": a_})
    for k in (1, 2, 3):
        v.append({"name": f"russian bm25 ±{k} compact", "sql": best, "neighbours": k, "compact": True})
    for beta in (0.1, 0.25, 0.5, 1.0):
        v.append({"name": f"russian bm25 ±2 boost {beta}", "sql": best, "neighbours": 2, "beta": beta})
        v.append({"name": f"russian bm25 ±2 compact boost {beta}", "sql": best, "neighbours": 2, "compact": True, "beta": beta})
    return v


# ------------------------------------------------ the proposed SQL, verbatim

REAL = """
DROP SCHEMA IF EXISTS memprop CASCADE;
CREATE SCHEMA memprop;
SET search_path = memprop, public;
CREATE TABLE raw_logs (
    id bigint PRIMARY KEY, user_id uuid NOT NULL, request_id uuid, thread_id uuid,
    message_type text NOT NULL, content text NOT NULL, created_at timestamptz NOT NULL, user_seq bigint NOT NULL);
CREATE UNIQUE INDEX raw_logs_user_seq_idx ON raw_logs (user_id, user_seq);
CREATE INDEX raw_logs_user_idx ON raw_logs (user_id, id);
CREATE TABLE archive_marks (user_id uuid PRIMARY KEY, logged_seq bigint NOT NULL);
CREATE TABLE lsm_storage (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, user_id uuid NOT NULL,
    time_bucket_start timestamptz NOT NULL, time_bucket_end timestamptz NOT NULL,
    tags text[] NOT NULL DEFAULT '{}', summary text NOT NULL, raw_log_ids bigint[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX lsm_storage_user_idx ON lsm_storage (user_id, time_bucket_start DESC);
-- (the migration also gives requests their context_sources column)
CREATE TABLE pipeline_runs (id uuid PRIMARY KEY);
"""

STOP = {"about", "after", "also", "been", "from", "have", "just", "like", "that", "their", "them", "then",
        "there", "they", "this", "what", "when", "where", "which", "with", "would", "your", "really", "that's"}


def offline_summary(turns):
    """About what the offline archivist writes for one thread (src/llm/offline.rs):
    the five most frequent words of four letters or more, and 200 characters."""
    prose = "\n".join(t["text"] for t in turns)
    counts = {}
    for w in re.findall(r"\w+", prose.lower()):
        if len(w) >= 4 and w not in STOP and not w.isdigit():
            counts[w] = counts.get(w, 0) + 1
    tags = [w for w, _ in sorted(counts.items(), key=lambda kv: -kv[1])[:5]]
    excerpt = " ".join(prose.split())[:200]
    return tags, f'[offline] Conversation about {", ".join(tags)}: "{excerpt}"'


def setup_proposed(conn, users, migration):
    conn.execute(REAL)
    with conn.cursor() as cur:
        for u in users:
            cur.executemany(
                "INSERT INTO raw_logs (id, user_id, thread_id, message_type, content, created_at, user_seq)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [(t["id"], u["id"], t["thread"], t["type"], f"{t['speaker']}: {t['text']}", t["at"], t["seq"])
                 for t in u["turns"]],
            )
            cur.execute("INSERT INTO archive_marks VALUES (%s, %s)", (u["id"], len(u["turns"])))
            sessions = {}
            for t in u["turns"]:
                sessions.setdefault(t["thread"], []).append(t)
            for ts in sessions.values():
                tags, summary = offline_summary(ts)
                cur.execute(
                    "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, tags, summary, raw_log_ids)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    (u["id"], ts[0]["at"], ts[-1]["at"], tags, summary, [t["id"] for t in ts]),
                )
    conn.execute(migration)
    conn.execute("ANALYZE raw_logs; ANALYZE lsm_storage")
    conn.commit()


def pack_rows(rows, budget):
    """The packing rule proposed for the assembler: rows in the statement's
    order; each is one line, `Name (YYYY-MM-DD): text` for a turn whose
    content is `Name: text` (else the message type's speaker), `Record
    (YYYY-MM-DD): summary` for a record; a line that does not fit is skipped,
    never cut; the block is then shown most relevant first."""
    used, lines, seen = 0, [], set()
    for kind, rid, _why, _hit, _score, _thread, mtype, content, at, _end in rows:
        if (kind, rid) in seen:
            continue
        seen.add((kind, rid))
        if kind == "record":
            line = f"Record ({at:%Y-%m-%d}): {content}"
        else:
            m = re.match(r"([^:\n]{1,40}): (.*)", content, re.S)
            name, text = (m.group(1), m.group(2)) if m else ("User" if mtype == "user_query" else "Assistant", content)
            line = f"{name} ({at:%Y-%m-%d}): {text}"
        cost = tokens(line) + 1
        if used + cost > budget:
            continue
        used += cost
        lines.append(line)
    return "\n".join(lines)


# The statement leaves a request's own turns out; the research asks as no request.
NO_REQUEST = "00000000-0000-0000-0000-000000000000"


def evaluate_proposed(conn, questions, query, budget, hits, window, records):
    conn.execute("SET search_path = memprop, public")
    sql = re.sub(r"\$(\d)", lambda m: "%(p" + m.group(1) + ")s", query)
    blocks, millis = [], []
    for q in questions:
        t0 = time.perf_counter()
        rows = conn.execute(sql, {"p1": q["user"], "p2": q["q"], "p3": hits, "p4": window, "p5": records,
                                  "p6": None, "p7": 0, "p8": NO_REQUEST}).fetchall()
        millis.append((time.perf_counter() - t0) * 1000)
        blocks.append(pack_rows(rows, budget))
    return score(f"proposed: memory_search.sql hits {hits} window ±{window} records {records}", questions, blocks, millis)


# ------------------------------------------------ further packing experiments


def extras(conn, users, questions, budget, report):
    """Rank-dependent and question-aware windows, BM25 parameters, larger
    budgets and passage scoring, over russian BM25 (BENCHMARKS.md)."""
    import math

    by_user = {u["id"]: u for u in users}

    def run(name, rankings, packer):
        blocks = [packer(by_user[q["user"]], sc) for q, sc in zip(questions, rankings)]
        report(score(name, questions, blocks))

    def windows(u, ids, schedule, size=budget, question_aware=None):
        """schedule: [(up to rank, ±window)]; question_aware: ((before, after)
        for a hit ending in '?', (before, after) otherwise)."""
        turns = u["turns"]
        used, taken, chosen = 0, set(), []
        for r, tid in enumerate(ids):
            t = u["by_id"][tid]
            idx = t["idx"]
            if question_aware:
                b, a = question_aware[0] if t["text"].rstrip().endswith("?") else question_aware[1]
            else:
                b = a = next((w for upto, w in schedule if r < upto), schedule[-1][1])
            group = [idx] + [
                j for d in range(1, max(a, b) + 1) for j, ok in ((idx - d, d <= b), (idx + d, d <= a))
                if ok and 0 <= j < len(turns) and turns[j]["thread"] == t["thread"]
            ]
            for j in group:
                if j in taken:
                    continue
                c = tokens(line_of(turns[j])) + 1
                if used + c > size:
                    continue
                used += c
                taken.add(j)
                chosen.append(j)
            if used >= size - 8:
                break
        return "\n".join(line_of(turns[j]) for j in chosen)

    sql = bm25_sql("tsv_russian", "russian")
    base = [[i for i, _ in ranking(conn, sql, q)] for q in questions]
    for k in (3, 5, 8, 12):
        for w in (1, 0):
            run(f"±2 for the best {k} hits, then ±{w}", base, lambda u, ids, k=k, w=w: windows(u, ids, [(k, 2), (10**9, w)]))
    for qa, st in (((0, 2), (1, 1)), ((1, 2), (1, 1)), ((0, 2), (2, 1)), ((0, 1), (1, 0)), ((0, 2), (1, 0)), ((0, 3), (1, 1))):
        run(f"question-aware: '?' -{qa[0]}+{qa[1]}, else -{st[0]}+{st[1]}", base,
            lambda u, ids, qa=qa, st=st: windows(u, ids, [], question_aware=(qa, st)))
    for gamma in (0.1, 0.2, 0.35, 0.5):
        # Thread diversity: each further hit of an already chosen thread
        # counts (1 - gamma) times less, chosen greedily.
        def diverse(u, ids, sc_all, gamma=gamma):
            rem = list(sc_all[:200])
            picked, per = [], {}
            while rem and len(picked) < 60:
                k = max(range(len(rem)), key=lambda k: rem[k][1] * (1 - gamma) ** per.get(u["by_id"][rem[k][0]]["thread"], 0))
                i, _ = rem.pop(k)
                picked.append(i)
                th = u["by_id"][i]["thread"]
                per[th] = per.get(th, 0) + 1
            return picked
        scored = [ranking(conn, sql, q) for q in questions]
        div = [diverse(by_user[q["user"]], None, sc) for q, sc in zip(questions, scored)]
        run(f"±2, thread diversity gamma {gamma}", div, lambda u, ids: windows(u, ids, [(10**9, 2)]))
    for size in (2500, 2640, 3000):
        run(f"±2 at a {size}-token budget", base, lambda u, ids, size=size: windows(u, ids, [(10**9, 2)], size))
    for k1, b in ((1.2, 0.3), (1.2, 1.0), (0.8, 0.75), (2.0, 0.75)):
        sql2 = bm25_sql("tsv_russian", "russian", k1=k1, b=b)
        r2 = [[i for i, _ in ranking(conn, sql2, q)] for q in questions]
        run(f"BM25 k1 {k1} b {b} ±2", r2, lambda u, ids: windows(u, ids, [(10**9, 2)]))

    # Passages: a hit scored by the query lexemes present in its window.
    lex = {}
    for u in users:
        rows = conn.execute("SELECT id, array(SELECT lexeme FROM unnest(tsv_russian)) FROM memres.turns WHERE user_id = %s",
                            (u["id"],)).fetchall()
        lex.update({i: set(ls) for i, ls in rows})
        df = {}
        for t in u["turns"]:
            for lx in lex[t["id"]]:
                df[lx] = df.get(lx, 0) + 1
        n = len(u["turns"])
        u["idf"] = {lx: math.log(1 + (n - d + 0.5) / (d + 0.5)) for lx, d in df.items()}
    qlex = [set(r[0]) for r in conn.execute(
        "SELECT array(SELECT lexeme FROM unnest(to_tsvector('russian', x))) FROM unnest(%s::text[]) x",
        ([q["q"] for q in questions],)).fetchall()]
    for w, own in ((1, 0.0), (1, 0.5), (1, 1.0), (2, 0.0), (2, 0.5), (2, 1.0)):
        rankings = []
        for q, ql in zip(questions, qlex):
            u = by_user[q["user"]]
            turns, idf = u["turns"], u["idf"]
            s = [sum(idf[lx] for lx in (ql & lex[t["id"]])) for t in turns]
            out = []
            for i, t in enumerate(turns):
                if s[i] == 0:
                    continue
                seen = set(lex[t["id"]])
                for d in range(1, w + 1):
                    for j in (i - d, i + d):
                        if 0 <= j < len(turns) and turns[j]["thread"] == t["thread"]:
                            seen |= lex[turns[j]["id"]]
                out.append((sum(idf[lx] for lx in (ql & seen)) + own * s[i], t["id"]))
            out.sort(key=lambda x: -x[0])
            rankings.append([i for _, i in out[:200]])
        run(f"passages ±{w} (+{own} × own score), packed ±2", rankings, lambda u, ids: windows(u, ids, [(10**9, 2)]))

    # Pseudo-relevance feedback: the `terms` highest-idf lexemes of the best
    # `k` hits join the query with weight `alpha` (binary term frequency).
    for k, terms, alpha in ((3, 5, 0.2), (5, 8, 0.3), (5, 8, 0.15), (10, 10, 0.2)):
        rankings = []
        for q, ql in zip(questions, qlex):
            u = by_user[q["user"]]
            turns, idf = u["turns"], u["idf"]
            s = [sum(idf[lx] for lx in (ql & lex[t["id"]])) for t in turns]
            order = sorted((i for i in range(len(s)) if s[i] > 0), key=lambda i: -s[i])
            fb = {}
            for i in order[:k]:
                for lx in lex[turns[i]["id"]] - ql:
                    fb[lx] = fb.get(lx, 0) + idf[lx]
            extra = {lx for lx, _ in sorted(fb.items(), key=lambda kv: -kv[1])[:terms]}
            s2 = [s[i] + alpha * sum(idf[lx] for lx in (lex[turns[i]["id"]] & extra)) for i in range(len(turns))]
            order2 = sorted((i for i in range(len(s2)) if s2[i] > 0), key=lambda i: -s2[i])
            rankings.append([turns[i]["id"] for i in order2[:200]])
        run(f"feedback: {terms} lexemes of the best {k} hits, weight {alpha}, packed ±2", rankings,
            lambda u, ids: windows(u, ids, [(10**9, 2)]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="PostgreSQL URL (a scratch schema memres is made there)")
    ap.add_argument("--budget", type=int, default=2000, help="memory budget in estimated tokens")
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--extra", action="store_true",
                    help="also the further packing experiments (windows by rank or by question, budgets, passages)")
    ap.add_argument("--proposed", action="store_true",
                    help="also run the full-text memory search (sql/queries/memory_search*.sql) verbatim on the draft migration (schema memprop)")
    ap.add_argument("--skip", default="", help="comma-separated name prefixes to leave out")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    users, questions = load(args.files)
    for u in users:
        u["by_id"] = {}
    with psycopg.connect(args.db) as conn:
        setup(conn, users)
        for u in users:
            for i, t in enumerate(u["turns"]):
                t["idx"] = i
                u["by_id"][t["id"]] = t
        print(f"{len(users)} users, {sum(len(u['turns']) for u in users)} turns, {len(questions)} questions", file=sys.stderr)
        only = {s.strip() for s in args.only.split(",") if s.strip()}
        results = []
        for var in variants():
            if only and var["name"] not in only:
                continue
            if any(var["name"].startswith(p) for p in args.skip.split(",") if p):
                continue
            r = evaluate(conn, users, questions, var, args.budget)
            results.append(r)
            if not args.json:
                print(
                    f"{r['variant']:<34} all {r['all']:.3f}  any {r['any']:.3f}  "
                    f"mem p50 {r['memory_tokens_p50']:>5} max {r['memory_tokens_max']:>5}  "
                    f"cat {r['per_category']}  sql p50 {r['sql_ms_p50']} ms",
                    flush=True,
                )
        if args.extra:
            def report(r):
                results.append(r)
                if not args.json:
                    print(
                        f"{r['variant']:<34} all {r['all']:.3f}  any {r['any']:.3f}  "
                        f"mem p50 {r['memory_tokens_p50']:>5} max {r['memory_tokens_max']:>5}  "
                        f"cat {r['per_category']}",
                        flush=True,
                    )
            extras(conn, users, questions, args.budget, report)
        if args.proposed:
            root = __file__.rsplit("/benches/", 1)[0]
            with open(f"{root}/sql/0008_memory_search.sql", encoding="utf-8") as f:
                migration = f.read()
            # The full-text statement, as src/repo/memory.rs puts it together.
            query = ""
            for part in ("memory_search", "memory_search_fulltext", "memory_search_items"):
                with open(f"{root}/sql/queries/{part}.sql", encoding="utf-8") as f:
                    query += f.read()
            setup_proposed(conn, users, migration)
            for hits, window, records in PROPOSED:
                r = evaluate_proposed(conn, questions, query, args.budget, hits, window, records)
                results.append(r)
                if not args.json:
                    print(
                        f"{r['variant']:<34} all {r['all']:.3f}  any {r['any']:.3f}  "
                        f"mem p50 {r['memory_tokens_p50']:>5} max {r['memory_tokens_max']:>5}  "
                        f"cat {r['per_category']}  sql p50 {r['sql_ms_p50']} ms",
                        flush=True,
                    )
        if args.json:
            print(json.dumps(results))


if __name__ == "__main__":
    main()
