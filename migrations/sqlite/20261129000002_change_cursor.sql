-- A per-study change counter: every committed batch bumps it and stamps the trials it
-- created or changed, so dashboards poll "what changed after N" instead of reloading.
ALTER TABLE studies ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE trials ADD COLUMN change_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX trials_study_change_idx ON trials (study_id, change_seq);
