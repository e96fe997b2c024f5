-- Records an operator action that concerns no single run (prompt changes).
INSERT INTO operator_actions (action, actor, reason, detail) VALUES ($1, $2, $3, $4)
