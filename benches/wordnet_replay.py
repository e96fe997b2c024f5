#!/usr/bin/env python3
"""WordNet query expansion on top of the replay's russian BM25 (±2, compact).

Re-uses load/setup/pack/score from retrieval_research.py beside it.
The ranking is the replay's bm25_sql recomputed in Python (same lexemes from
tsv_russian, tf = number of positions, len = number of positions, k1 1.2,
b 0.75, avgdl 12, idf from the user's own turns, order score desc then id,
200 hits); checked against the SQL ranking (identical order required).

Expansion: content words of the question (letters only, not in PostgreSQL's
english.stop, not a speaker's name, >= 3 letters); for each, WordNet synsets
of the word (sense order by the lemma's tagged count, cntlist), per synset:
single-word synonyms, derivationally related forms of the synset's lemmas,
optionally the first lemma of direct hypernyms/hyponyms. Terms -> lexemes via
to_tsvector('russian', term) in PostgreSQL. New lexemes only (not already in
the question), capped per word and in total. An expansion lexeme scores
weight * idf * the same tf/length factor.

    apt-get install wordnet-base; pip install 'psycopg[binary]' nltk
    python3 benches/wordnet_replay.py --db URL ../shared/datasets/locomo-dev/*.json

WordNet is read from Debian's wordnet-base (/usr/share/wordnet, or
--wordnet DIR), copied into a scratch nltk layout with the list of
lexicographer files nltk expects (wordnet-base does not ship it).
Measured 2026-11-25: BENCHMARKS.md, session 7.
"""

import argparse
import os
import shutil
import subprocess
import tempfile
import math
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import retrieval_research as rr  # noqa: E402
import psycopg  # noqa: E402

LEXNAMES = """00	adj.all	3
01	adj.pert	3
02	adv.all	4
03	noun.Tops	1
04	noun.act	1
05	noun.animal	1
06	noun.artifact	1
07	noun.attribute	1
08	noun.body	1
09	noun.cognition	1
10	noun.communication	1
11	noun.event	1
12	noun.feeling	1
13	noun.food	1
14	noun.group	1
15	noun.location	1
16	noun.motive	1
17	noun.object	1
18	noun.person	1
19	noun.phenomenon	1
20	noun.plant	1
21	noun.possession	1
22	noun.process	1
23	noun.quantity	1
24	noun.relation	1
25	noun.shape	1
26	noun.state	1
27	noun.substance	1
28	noun.time	1
29	verb.body	2
30	verb.change	2
31	verb.cognition	2
32	verb.communication	2
33	verb.competition	2
34	verb.consumption	2
35	verb.contact	2
36	verb.creation	2
37	verb.emotion	2
38	verb.motion	2
39	verb.perception	2
40	verb.possession	2
41	verb.social	2
42	verb.stative	2
43	verb.weather	2
44	adj.ppl	3
"""


def _wordnet_dir():
    """An nltk data folder holding wordnet-base's files and LEXNAMES."""
    src = "/usr/share/wordnet"
    for i, a in enumerate(sys.argv):
        if a == "--wordnet" and i + 1 < len(sys.argv):
            src = sys.argv[i + 1]
    root = tempfile.mkdtemp(prefix="wordnet-replay-")
    dst = os.path.join(root, "corpora", "wordnet")
    os.makedirs(dst)
    for f in os.listdir(src):
        if os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    with open(os.path.join(dst, "lexnames"), "w") as out:
        out.write(LEXNAMES)
    return root


os.environ["NLTK_DATA"] = _wordnet_dir()
from nltk.corpus.reader import wordnet as W  # noqa: E402

W.WordNetCorpusReader.map_wn = lambda self, version="wordnet": None  # no index.sense in wordnet-base
from nltk.corpus import wordnet as wn  # noqa: E402

K1, B = 1.2, 0.75
SHAREDIR = subprocess.run(["pg_config", "--sharedir"], capture_output=True, text=True).stdout.strip()
STOP = set(open(os.path.join(SHAREDIR, "tsearch_data", "english.stop")).read().split())
STOP |= {"did", "does", "whose", "kind", "kinds", "type", "types", "many", "much", "likely", "would", "might"}


def content_words(q, names):
    out = []
    for w in re.findall(r"[A-Za-z]+", q):
        lw = w.lower()
        if len(lw) < 3 or lw in STOP or lw in names or lw in out:
            continue
        out.append(lw)
    return out


def synsets_ordered(word):
    ss = wn.synsets(word)
    lem = wn.morphy(word) or word

    def cnt(s):
        c = 0
        for l in s.lemmas():
            if l.name().lower() in (word, lem):
                c = max(c, l.count())
        return c

    return [s for _, _, s in sorted(((-cnt(s), i, s) for i, s in enumerate(ss)), key=lambda x: (x[0], x[1]))]


def candidates(word, rel):
    """Ordered candidate terms for one word."""
    out = []

    def add(name):
        if "_" in name or "-" in name:
            return
        n = name.lower()
        if n != word and n not in out:
            out.append(n)

    for s in synsets_ordered(word):
        for l in s.lemmas():
            add(l.name())
        for l in s.lemmas():
            for d in l.derivationally_related_forms():
                add(d.name())
        if rel == "hyp":
            for h in s.hypernyms()[:3] + s.hyponyms()[:5]:
                for l in h.lemmas()[:1]:
                    add(l.name())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--budget", type=int, default=2000)
    ap.add_argument("--wordnet", default="/usr/share/wordnet", help="wordnet-base's dict folder")
    ap.add_argument("--big", action="store_true", help="only the larger caps (per word 24, total 60)")
    ap.add_argument("--diag", action="store_true", help="coverage diagnostics instead of the grid")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    users, questions = rr.load(args.files)
    by_user = {u["id"]: u for u in users}
    for u in users:
        u["by_id"] = {}
    conn = psycopg.connect(args.db)
    rr.setup(conn, users)
    for u in users:
        for i, t in enumerate(u["turns"]):
            t["idx"] = i
            u["by_id"][t["id"]] = t
        u["names"] = {t["speaker"].lower() for t in u["turns"]}
        rows = conn.execute(
            "SELECT id, array(SELECT lexeme FROM unnest(tsv_russian)),"
            " array(SELECT coalesce(array_length(positions, 1), 1) FROM unnest(tsv_russian))"
            " FROM memres.turns WHERE user_id = %s ORDER BY id", (u["id"],)).fetchall()
        u["tf"] = {i: dict(zip(ls, ns)) for i, ls, ns in rows}
        u["len"] = {i: max(1, sum(ns)) for i, _, ns in rows}
        df, post = {}, {}
        for i, ls, _ in rows:
            for lx in ls:
                df[lx] = df.get(lx, 0) + 1
                post.setdefault(lx, []).append(i)
        n = len(rows)
        u["df"], u["post"] = df, post
        u["idf"] = {lx: math.log(1 + (n - d + 0.5) / (d + 0.5)) for lx, d in df.items()}
    qlex = [list(dict.fromkeys(r[0])) for r in conn.execute(
        "SELECT array(SELECT lexeme FROM unnest(to_tsvector('russian', x))) FROM unnest(%s::text[]) x",
        ([q["q"] for q in questions],)).fetchall()]

    def word_lex(words):
        rows = conn.execute(
            "SELECT x, array(SELECT lexeme FROM unnest(to_tsvector('russian', x))) FROM unnest(%s::text[]) x",
            (list(words),)).fetchall()
        return {w: ls for w, ls in rows}

    def rank(u, weights):
        """weights: lexeme -> multiplier of idf."""
        sc = {}
        for lx, wt in weights.items():
            if lx not in u["idf"]:
                continue
            idf = u["idf"][lx] * wt
            for i in u["post"][lx]:
                tf = u["tf"][i][lx]
                sc[i] = sc.get(i, 0.0) + idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * u["len"][i] / 12.0))
        return [i for i, _ in sorted(sc.items(), key=lambda kv: (-kv[1], kv[0]))[:200]]

    def run(name, rankings, out=True):
        blocks = [rr.pack(by_user[q["user"]], ids, args.budget, 2, compact=True) for q, ids in zip(questions, rankings)]
        r = rr.score(name, questions, blocks)
        if out:
            print(f"{name:<58} all {r['all']:.3f}  any {r['any']:.3f}  mem p50 {r['memory_tokens_p50']}  "
                  f"cat {r['per_category']}", flush=True)
        return r

    # Baseline, and the check against the SQL ranking.
    base = [rank(by_user[q["user"]], {lx: 1.0 for lx in ql}) for q, ql in zip(questions, qlex)]
    sql = rr.bm25_sql("tsv_russian", "russian")
    same = sum([i for i, _ in rr.ranking(conn, sql, q)] == b for q, b in zip(questions, base))
    print(f"python ranking == SQL ranking for {same}/{len(questions)} questions", flush=True)
    sql_rank = [[i for i, _ in rr.ranking(conn, sql, q)] for q in questions]
    run("baseline (SQL ranking) ±2 compact", sql_rank)
    run("baseline (python ranking) ±2 compact", base)

    # Candidates per question word (timed: WordNet only, then the PG lexeme call).
    words = [content_words(q["q"], by_user[q["user"]]["names"]) for q in questions]
    cands = {}
    wn.synsets("warmup")
    t_wn = []
    for ws in words:
        t0 = time.perf_counter()
        for w in ws:
            for rel in ("syn", "hyp"):
                if (w, rel) not in cands:
                    cands[(w, rel)] = candidates(w, rel)
        t_wn.append((time.perf_counter() - t0) * 1000)
    allterms = {t for c in cands.values() for t in c} | {w for ws in words for w in ws} | {
        nm for u in users for nm in u["names"]}
    t0 = time.perf_counter()
    lexof = word_lex(sorted(allterms))
    t_all = (time.perf_counter() - t0) * 1000
    # a per-question PG call for timing: the candidate terms of the question's words
    t_pg = []
    for ws in words[:200]:
        terms = sorted({t for w in ws for t in cands[(w, "hyp")]} | set(ws))
        t0 = time.perf_counter()
        word_lex(terms)
        t_pg.append((time.perf_counter() - t0) * 1000)
    print(f"expansion timing: WordNet (both relation sets, cold per word) p50 {statistics.median(t_wn):.2f} ms "
          f"p90 {sorted(t_wn)[int(.9 * len(t_wn))]:.2f} ms max {max(t_wn):.1f} ms; "
          f"to_tsvector of the question's candidate terms p50 {statistics.median(t_pg):.2f} ms "
          f"({len(allterms)} terms in one call: {t_all:.0f} ms)", flush=True)
    nterms = [sum(len(cands[(w, 'syn')]) for w in ws) for ws in words]
    print(f"content words per question p50 {statistics.median(len(ws) for ws in words)}, "
          f"syn+deriv candidates per question p50 {statistics.median(nterms)}", flush=True)

    def expanded(weight, per_word, total, rel, gate=None):
        rankings, nexp = [], []
        for q, ql, ws in zip(questions, qlex, words):
            u = by_user[q["user"]]
            wts = {lx: 1.0 for lx in ql}
            chosen = 0
            for w in ws:
                if gate is not None:
                    own = lexof.get(w) or []
                    d = max((u["df"].get(lx, 0) for lx in own), default=0)
                    if d > gate:
                        continue
                k = 0
                for t in cands[(w, rel)]:
                    if k >= per_word or chosen >= total:
                        break
                    for lx in lexof.get(t) or []:
                        if lx in wts:
                            continue
                        wts[lx] = weight
                        k += 1
                        chosen += 1
            nexp.append(chosen)
            rankings.append(rank(u, wts))
        return rankings, statistics.median(nexp)

    if args.diag:
        diag(questions, qlex, words, by_user, cands, lexof, base, expanded, args.budget)
        return
    if args.big:
        for gate in (None, 5):
            for rel in ("syn", "hyp"):
                for weight in (0.2, 0.35):
                    rk, ne = expanded(weight, 24, 60, rel, gate)
                    run(f"gate {gate} {rel} w {weight} per-word 24 total 60 (p50 {ne})", rk)
        return
    results = []
    for rel in ("syn", "hyp"):
        for per_word in (3, 6, 12):
            for weight in (0.2, 0.35, 0.5):
                rk, ne = expanded(weight, per_word, 30, rel)
                r = run(f"{rel} w {weight} per-word {per_word} total 30 (p50 {ne} lexemes)", rk)
                results.append((r["all"], r["variant"], (weight, per_word, 30, rel, None)))
    # gated by the word's own df in the user's turns
    for gate in (0, 2, 5):
        for rel, per_word in (("syn", 6), ("syn", 12), ("hyp", 12)):
            for weight in (0.35, 0.5):
                rk, ne = expanded(weight, per_word, 30, rel, gate)
                r = run(f"gate df<={gate} {rel} w {weight} per-word {per_word} (p50 {ne})", rk)
                results.append((r["all"], r["variant"], (weight, per_word, 30, rel, gate)))
    results.sort(key=lambda x: -x[0])
    print("best:", results[:3], flush=True)


def diag(questions, qlex, words, by_user, cands, lexof, base, expanded, budget):
    """Missing evidence turns of the baseline: do they share a non-name
    lexeme with the question, an expansion lexeme (syn+deriv uncapped /
    + hypernyms and hyponyms uncapped)? And churn of the best variant."""
    def blocks(rankings):
        return [norm_set(rr.pack(by_user[q["user"]], ids, budget, 2, compact=True)) for q, ids in zip(questions, rankings)]

    def norm_set(b):
        return rr.norm(b)

    bb = blocks(base)
    miss = []  # (question index, evidence turn)
    for k, (q, b) in enumerate(zip(questions, bb)):
        u = by_user[q["user"]]
        ntext = {rr.norm(t["text"]): t for t in u["turns"]}
        for e in q["ev"]:
            if e not in b:
                miss.append((k, ntext.get(e)))
    namelex = {}
    for u in by_user.values():
        namelex[u["id"]] = set()
        for nm in u["names"]:
            namelex[u["id"]] |= set(lexof.get(nm) or [])
    import psycopg as _p  # noqa
    n_over = n_syn = n_hyp = n_syn12 = 0
    for k, t in miss:
        q = questions[k]
        u = by_user[q["user"]]
        tl = set(u["tf"][t["id"]])
        ql = set(qlex[k]) - namelex[u["id"]]
        if tl & ql:
            n_over += 1
            continue
        syn = {lx for w in words[k] for c in cands[(w, "syn")] for lx in (lexof.get(c) or [])}
        hyp = {lx for w in words[k] for c in cands[(w, "hyp")] for lx in (lexof.get(c) or [])}
        syn12 = {lx for w in words[k] for c in cands[(w, "syn")][:12] for lx in (lexof.get(c) or [])}
        n_syn += bool(tl & syn)
        n_hyp += bool(tl & hyp)
        n_syn12 += bool(tl & syn12)
    nov = len(miss) - n_over
    print(f"baseline: {len(miss)} missing evidence turns; {n_over} share a non-name lexeme with the question; "
          f"of the other {nov}: {n_syn12} share a lexeme with the first 12 syn+deriv terms per word, "
          f"{n_syn} with all syn+deriv terms, {n_hyp} with all syn+deriv+hypernym/hyponym terms", flush=True)
    rk, _ = expanded(0.35, 12, 30, "syn", 5)
    eb = blocks(rk)
    ok_b = [all(e in b for e in q["ev"]) for q, b in zip(questions, bb)]
    ok_e = [all(e in b for e in q["ev"]) for q, b in zip(questions, eb)]
    gain = sum(e and not b for b, e in zip(ok_b, ok_e))
    loss = sum(b and not e for b, e in zip(ok_b, ok_e))
    print(f"best variant vs baseline: +{gain} questions, -{loss} questions", flush=True)


if __name__ == "__main__":
    main()
