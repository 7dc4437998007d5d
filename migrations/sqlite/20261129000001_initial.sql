-- Studies, trials, measurements and API tokens. JSON documents are TEXT; times RFC 3339 TEXT.
CREATE TABLE studies (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT NOT NULL,
    state           TEXT NOT NULL,
    spec            TEXT NOT NULL,
    next_trial_id   INTEGER NOT NULL DEFAULT 1,
    state_reason    TEXT,
    designer_state  TEXT,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE INDEX studies_state_idx ON studies (state, id);

CREATE TABLE trials (
    study_id           INTEGER NOT NULL REFERENCES studies (id) ON DELETE CASCADE,
    id                 INTEGER NOT NULL,
    state              TEXT NOT NULL,
    parameters         TEXT NOT NULL,
    client_id          TEXT,
    final_measurement  TEXT,
    objective          REAL,
    infeasible_reason  TEXT,
    fail_reason        TEXT,
    early_stopped      INTEGER NOT NULL DEFAULT 0,
    excluded           INTEGER NOT NULL DEFAULT 0,
    lease_expires_at   TEXT,
    created_at         TEXT NOT NULL,
    started_at         TEXT,
    completed_at       TEXT,
    PRIMARY KEY (study_id, id)
) WITHOUT ROWID;
CREATE INDEX trials_study_state_idx ON trials (study_id, state, id);
CREATE INDEX trials_study_client_idx ON trials (study_id, client_id) WHERE client_id IS NOT NULL;
CREATE INDEX trials_study_objective_idx ON trials (study_id, objective) WHERE objective IS NOT NULL;

CREATE TABLE measurements (
    study_id      INTEGER NOT NULL,
    trial_id      INTEGER NOT NULL,
    step          INTEGER NOT NULL,
    elapsed_secs  REAL,
    metrics       TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (study_id, trial_id, step),
    FOREIGN KEY (study_id, trial_id) REFERENCES trials (study_id, id) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE TABLE api_tokens (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,
    token_hash  TEXT NOT NULL UNIQUE,
    study_id    INTEGER REFERENCES studies (id) ON DELETE CASCADE,
    trial_id    INTEGER,
    created_at  TEXT NOT NULL
);
CREATE INDEX api_tokens_study_idx ON api_tokens (study_id) WHERE study_id IS NOT NULL;
