-- Roles on tokens: reader < writer < operator < admin. Tokens from before roles (the
-- configured AUGUR_TOKEN, `augur token create`) were all-powerful: they stay admin. A
-- trial-scoped token's role is not read (its scope decides what it may do).
ALTER TABLE api_tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'admin';
-- After this the token is refused; NULL: never.
ALTER TABLE api_tokens ADD COLUMN expires_at TEXT;
-- When the token was last seen, to within a minute (written at most once a minute).
ALTER TABLE api_tokens ADD COLUMN last_used_at TEXT;
-- The name of the token that created the study (`open` in open mode): writers and operators
-- may change, stop or delete their own studies only. NULL for studies from before: admins'.
ALTER TABLE studies ADD COLUMN created_by TEXT;
-- Who did what: studies created, changed, stopped, deleted; trials added or excluded; tokens
-- created or revoked. Kept when the study goes (no foreign key).
CREATE TABLE audit_events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        TEXT NOT NULL,
    actor     TEXT NOT NULL,
    action    TEXT NOT NULL,
    study_id  INTEGER,
    trial_id  INTEGER,
    detail    TEXT
);
