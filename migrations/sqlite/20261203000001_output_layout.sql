-- Trial directories gained the study: <output_dir>/study-<id>/<trial> (two studies sharing an
-- output_dir shared checkpoints and logs before). Studies from before keep the directories
-- their trials already have: `output_layout: trial` (<output_dir>/<trial>). Studies with no
-- output_dir always had <runs base>/augur-runs/study-<id>/<trial>, which does not change.
UPDATE studies
SET spec = json_set(spec, '$.trial_job.output_layout', 'trial')
WHERE json_extract(spec, '$.trial_job.output_dir') IS NOT NULL
  AND json_extract(spec, '$.trial_job.output_layout') IS NULL;
