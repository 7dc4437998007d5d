-- Each study's trials by state, kept by every batch that changes them, so that `/metrics`
-- and the studies list read one row per study instead of counting every trial.
ALTER TABLE studies ADD COLUMN n_requested BIGINT NOT NULL DEFAULT 0;
ALTER TABLE studies ADD COLUMN n_active BIGINT NOT NULL DEFAULT 0;
ALTER TABLE studies ADD COLUMN n_stopping BIGINT NOT NULL DEFAULT 0;
ALTER TABLE studies ADD COLUMN n_completed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE studies ADD COLUMN n_infeasible BIGINT NOT NULL DEFAULT 0;
ALTER TABLE studies ADD COLUMN n_failed BIGINT NOT NULL DEFAULT 0;
UPDATE studies SET
    n_requested = (SELECT count(*) FROM trials t WHERE t.study_id = studies.id AND t.state = 'requested'),
    n_active = (SELECT count(*) FROM trials t WHERE t.study_id = studies.id AND t.state = 'active'),
    n_stopping = (SELECT count(*) FROM trials t WHERE t.study_id = studies.id AND t.state = 'stopping'),
    n_completed = (SELECT count(*) FROM trials t WHERE t.study_id = studies.id AND t.state = 'completed'),
    n_infeasible = (SELECT count(*) FROM trials t WHERE t.study_id = studies.id AND t.state = 'infeasible'),
    n_failed = (SELECT count(*) FROM trials t WHERE t.study_id = studies.id AND t.state = 'failed');
