-- Studies, trials, measurements and API tokens. JSON documents are jsonb; times timestamptz.
CREATE TABLE studies (
    id              BIGSERIAL PRIMARY KEY,
    name            TEXT NOT NULL,
    state           TEXT NOT NULL,
    -- the normalized study spec (defaults filled in), as the API shows it
    spec            JSONB NOT NULL,
    -- per-study trial counter: the next trial gets this id (never COUNT(*))
    next_trial_id   BIGINT NOT NULL DEFAULT 1,
    -- why the study ended, when it did not complete normally
    state_reason    TEXT,
    -- opaque designer state (e.g. GP hyperparameters) to warm-start the next suggestion
    designer_state  JSONB,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX studies_state_idx ON studies (state, id);

CREATE TABLE trials (
    study_id           BIGINT NOT NULL REFERENCES studies (id) ON DELETE CASCADE,
    id                 BIGINT NOT NULL,
    state              TEXT NOT NULL,
    parameters         JSONB NOT NULL,
    client_id          TEXT,
    -- {"step", "elapsed_secs", "metrics": {...}}: one entry per metric, ready for several
    final_measurement  JSONB,
    -- value of the study's first metric in final_measurement, for ordering by best
    objective          DOUBLE PRECISION,
    infeasible_reason  TEXT,
    fail_reason        TEXT,
    early_stopped      BOOLEAN NOT NULL DEFAULT FALSE,
    -- kept, shown, but not given to the optimizer
    excluded           BOOLEAN NOT NULL DEFAULT FALSE,
    lease_expires_at   TIMESTAMPTZ,
    created_at         TIMESTAMPTZ NOT NULL,
    started_at         TIMESTAMPTZ,
    completed_at       TIMESTAMPTZ,
    PRIMARY KEY (study_id, id)
);
-- filtered on by state in every suggest (unfinished trials) and in list ?state=
CREATE INDEX trials_study_state_idx ON trials (study_id, state, id);
-- client_id idempotency looks up a worker's unfinished trials
CREATE INDEX trials_study_client_idx ON trials (study_id, client_id) WHERE client_id IS NOT NULL;
-- best trial of a single-metric study
CREATE INDEX trials_study_objective_idx ON trials (study_id, objective) WHERE objective IS NOT NULL;

CREATE TABLE measurements (
    study_id      BIGINT NOT NULL,
    trial_id      BIGINT NOT NULL,
    step          BIGINT NOT NULL,
    elapsed_secs  DOUBLE PRECISION,
    metrics       JSONB NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (study_id, trial_id, step),
    FOREIGN KEY (study_id, trial_id) REFERENCES trials (study_id, id) ON DELETE CASCADE
);

CREATE TABLE api_tokens (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    -- hex SHA-256 of the bearer token; the token itself is never stored
    token_hash  TEXT NOT NULL UNIQUE,
    -- a token scoped to one trial may only report to that trial
    study_id    BIGINT REFERENCES studies (id) ON DELETE CASCADE,
    trial_id    BIGINT,
    created_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX api_tokens_study_idx ON api_tokens (study_id) WHERE study_id IS NOT NULL;
