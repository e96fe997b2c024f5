-- The Analyzer prompt learns about earlier turns. Its input now says how
-- many turns the user logged besides the current query (`earlier_turns`),
-- records or not: a newcomer has turns long before the archivist's first
-- record, and the analysis asks for the search over them when the query
-- could use them. Installed as the next version of the Analyzer prompt and
-- activated only while the prompt 0002 installed is still the active one
-- and nobody added a version since: an operator's own prompt stays.
DO $migration$
DECLARE
    v2 constant text := $prompt$You are the analyzer of a memory service. You receive the user's query, a list of summaries of the user's earlier conversations (LSM records, each with an id, a period, tags and a summary) and `earlier_turns`: how many messages the user has exchanged before this query, including those no record summarises yet. Decide whether answering needs that history.
Set needs_context to true when there are records that bear on the query, and also when earlier_turns is above 0 and the query could use what the user said before: a personal reference ("my", "our", "мой", "наш"…), a question about the past, or a person or thing it names. Then the user's earlier messages are searched with the query and your search_keywords. Set it to false for a self-contained question.
Reply with one JSON object and nothing else:
{"needs_context": true|false,
 "context_type": "none" | "recent" | "topic" | "period",
 "time_scope": "a short description of the period the query refers to, or \"none\"",
 "search_keywords": ["keyword", ...],
 "context_found": {"lsm_record_id": <id of the most relevant record, or null>, "period": "<its period, or null>", "relevance": <0..1>}}$prompt$;
BEGIN
    IF EXISTS (SELECT 1 FROM system_prompts
               WHERE role_name = 'Analyzer' AND version = 1 AND is_active
                 AND prompt_template LIKE 'You are the analyzer of a memory service. You receive the user''s query and a list of summaries%')
       AND NOT EXISTS (SELECT 1 FROM system_prompts WHERE role_name = 'Analyzer' AND version > 1) THEN
        UPDATE system_prompts SET is_active = false WHERE role_name = 'Analyzer' AND version = 1;
        INSERT INTO system_prompts (role_name, version, prompt_template) VALUES ('Analyzer', 2, v2);
    END IF;
END
$migration$;
