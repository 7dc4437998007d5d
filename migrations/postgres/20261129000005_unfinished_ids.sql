-- The ids of a study's unfinished trials, kept on the study row by every batch, which reads
-- those trials by primary key under the study's lock. An index on `state` would do it too,
-- but every completed trial leaves a dead entry in it until VACUUM, and on a fast-growing
-- study each batch came to read one heap page per completed trial.
ALTER TABLE studies ADD COLUMN unfinished_ids BIGINT[] NOT NULL DEFAULT '{}';
UPDATE studies s SET unfinished_ids = ARRAY(
    SELECT t.id FROM trials t
    WHERE t.study_id = s.id AND t.state IN ('requested', 'active', 'stopping')
    ORDER BY t.id);
