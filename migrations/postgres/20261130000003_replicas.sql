-- Replicas sharing this database (`augur serve --replica-url`): each renews its row every
-- few seconds; a row past its expiry is a replica gone. A study's changes are routed to one
-- live replica (src/api/forward.rs), so that its commands share that replica's commits.
CREATE TABLE replicas (
    id          TEXT PRIMARY KEY,
    url         TEXT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);

-- What a replica shows when it forwards a request to another: made by the first replica to
-- start, read by the others. Whoever can read this table can already change every study.
CREATE TABLE replica_secret (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    secret  TEXT NOT NULL
);
