-- Trial directories gained the study: <output_dir>/study-<id>-<created>/<trial> (two studies
-- sharing an output_dir shared checkpoints and logs before, and study ids restart in a new
-- database). Studies from before keep the directories their trials already have:
-- `output_layout: trial` (<output_dir>/<trial>) for those with an output_dir, and
-- `output_layout: study_id` (<runs base>/augur-runs/study-<id>/<trial>) for the others.
UPDATE studies
SET spec = jsonb_set(spec, '{trial_job,output_layout}', '"trial"')
WHERE spec -> 'trial_job' ->> 'output_dir' IS NOT NULL
  AND spec -> 'trial_job' -> 'output_layout' IS NULL;
UPDATE studies
SET spec = jsonb_set(spec, '{trial_job,output_layout}', '"study_id"')
WHERE jsonb_typeof(spec -> 'trial_job') = 'object'
  AND spec -> 'trial_job' ->> 'output_dir' IS NULL
  AND spec -> 'trial_job' -> 'output_layout' IS NULL;
