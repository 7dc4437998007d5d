-- Worker pools (`augur worker --pool NAME`): one row per worker that joined a pool. A pool
-- exists while a study or a worker names it; nothing else is stored of it. Each row holds
-- what the worker last reported (host, slots, GPUs, busy slots, when) and its busy and idle
-- slot-seconds so far, which the server adds at each report (utilisation: what the pool
-- costs while idle). Times are Unix milliseconds, so that both backends do the sums alike.
CREATE TABLE pool_workers (
    pool              TEXT NOT NULL,
    worker            TEXT NOT NULL,
    host              TEXT NOT NULL,
    slots             INTEGER NOT NULL,
    -- JSON array of the GPU ids the worker hands to trials.
    gpus              TEXT NOT NULL,
    busy              INTEGER NOT NULL,
    registered_at_ms  INTEGER NOT NULL,
    last_seen_ms      INTEGER NOT NULL,
    busy_slot_secs    REAL NOT NULL DEFAULT 0,
    idle_slot_secs    REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (pool, worker)
);
-- Utilisation over time: each pool's busy and idle slot-seconds per minute (the minute's
-- start), added to at each worker's report.
CREATE TABLE pool_usage (
    pool              TEXT NOT NULL,
    minute_ms         INTEGER NOT NULL,
    busy_slot_secs    REAL NOT NULL,
    idle_slot_secs    REAL NOT NULL,
    PRIMARY KEY (pool, minute_ms)
);
