-- Notifications: one row per webhook call (an event to one URL), with its attempts so far
-- and how the last one went; written by the background sender after the change it reports
-- committed, shown by GET /v1/studies/{study}/notifications.
CREATE TABLE notification_deliveries (
    id           BIGSERIAL PRIMARY KEY,
    study_id     BIGINT NOT NULL REFERENCES studies (id) ON DELETE CASCADE,
    event        TEXT NOT NULL,
    trial_id     BIGINT,
    -- The study's webhook ('study') or the server's default ('server').
    target       TEXT NOT NULL,
    url          TEXT NOT NULL,
    -- 'pending' (attempts left), 'delivered' (a 2xx), 'failed' (no attempt left, or refused).
    state        TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_status  INTEGER,
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX notification_deliveries_study ON notification_deliveries (study_id, id);
