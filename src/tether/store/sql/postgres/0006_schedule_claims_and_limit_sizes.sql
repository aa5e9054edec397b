-- A worker takes its share of the due schedules and holds them until a time, so workers
-- side by side start different schedules (see queries.claim_schedules).
ALTER TABLE schedules ADD COLUMN claimed_until DOUBLE PRECISION;
-- Each limit's size as its workers define it (JSON), so operators see it without the app.
ALTER TABLE limit_locks ADD COLUMN size TEXT;
