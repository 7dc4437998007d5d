-- The unfinished trials of a study, read under the study's lock by every batch. This partial
-- index holds only them, in id order: the per-batch read stays O(unfinished) as the study
-- grows, and it wins the planner's choice even when the statistics are stale (on a study
-- growing faster than autovacuum analyzes, the planner used to pick a scan of the whole
-- study by `trials_study_change_idx`).
CREATE INDEX trials_unfinished_idx ON trials (study_id, id)
    WHERE state IN ('requested', 'active', 'stopping');
