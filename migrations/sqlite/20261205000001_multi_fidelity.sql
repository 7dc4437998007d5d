-- Multi-fidelity studies: the budget of a trial's latest attempt (NULL: the full budget),
-- and the count of trials paused at a rung (waiting for a promotion, holding no slot).
ALTER TABLE trials ADD COLUMN budget REAL;
ALTER TABLE studies ADD COLUMN n_paused BIGINT NOT NULL DEFAULT 0;
