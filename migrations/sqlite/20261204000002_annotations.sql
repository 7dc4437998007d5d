-- Notes and tags of studies (trial_id 0) and trials, and their user attributes (one row per
-- name, so two writers of different names never lose each other's). What people and training
-- code attach: the optimizer never reads them, so they live apart from the trials.
CREATE TABLE annotations (
    study_id    INTEGER NOT NULL REFERENCES studies (id) ON DELETE CASCADE,
    trial_id    INTEGER NOT NULL,
    note        TEXT,
    tags        TEXT NOT NULL DEFAULT '[]',
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (study_id, trial_id)
);
CREATE TABLE user_attrs (
    study_id    INTEGER NOT NULL REFERENCES studies (id) ON DELETE CASCADE,
    trial_id    INTEGER NOT NULL,
    name        TEXT NOT NULL,
    value       TEXT NOT NULL,
    PRIMARY KEY (study_id, trial_id, name)
);
