-- Optuna's study names are unique (Augur's own are not): an Optuna study keeps its name in
-- optuna_name too, under a unique index, so two processes creating one name at once make
-- one study (the other's insert conflicts). Studies made before this keep the oldest of a name.
ALTER TABLE studies ADD COLUMN optuna_name TEXT;
UPDATE studies SET optuna_name = name WHERE id IN (
    SELECT MIN(id) FROM studies
    WHERE spec -> 'parameters' -> 0 ->> 'id' = 'optuna_storage'
      AND spec -> 'parameters' -> 1 IS NULL
    GROUP BY name);
CREATE UNIQUE INDEX studies_optuna_name_idx ON studies (optuna_name);
-- A study's first trial holding a user attribute of a name (Optuna's first distribution of a
-- parameter, the reference its later distributions must be compatible with) in one seek.
CREATE INDEX user_attrs_study_name_idx ON user_attrs (study_id, name, trial_id);
