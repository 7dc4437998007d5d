-- PBT: a trial's values over its segments, the trial each segment copied its checkpoint
-- from, and the copy still to be made before its next attempt (JSON; NULL: none).
ALTER TABLE trials ADD COLUMN lineage JSONB;
