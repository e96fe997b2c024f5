-- Every role's prompts: versions, the active one, and the newest.
SELECT role_name,
       count(*)::int8 AS versions,
       max(version) FILTER (WHERE is_active) AS active_version,
       max(version) AS latest_version,
       max(created_at) FILTER (WHERE is_active) AS active_since,
       length(max(prompt_template) FILTER (WHERE is_active)) AS active_chars
FROM system_prompts
GROUP BY role_name
ORDER BY role_name
