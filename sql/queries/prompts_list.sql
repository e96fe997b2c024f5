-- Every role's prompts: versions, the active one, and the newest.
SELECT role_name, count(*)::int8,
       max(version) FILTER (WHERE is_active),
       max(version),
       max(created_at) FILTER (WHERE is_active),
       length(max(prompt_template) FILTER (WHERE is_active))
FROM system_prompts
GROUP BY role_name
ORDER BY role_name
