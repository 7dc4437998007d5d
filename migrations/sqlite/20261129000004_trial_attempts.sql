-- Launches of a dispatched trial's job charged against its `max_retries + 1`: counted here,
-- before each launch, so a restarted service does not give a trial its retries again.
ALTER TABLE trials ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
