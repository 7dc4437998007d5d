-- One dispatcher runs a study at a time, across replicas: it holds this lease row and renews
-- it; another replica takes the study over only once the lease has expired.
CREATE TABLE study_runners (
    study_id    BIGINT PRIMARY KEY REFERENCES studies (id) ON DELETE CASCADE,
    owner       TEXT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);
