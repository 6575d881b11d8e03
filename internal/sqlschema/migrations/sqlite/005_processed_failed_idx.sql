-- The failed records (state 3: failed for good) of each consumer, newest
-- first, for the operator's list of them (idem failed, the console's
-- failed page): a partial index, so a page reads its limit of failed
-- records however rare they are, and a record that completes never has
-- an entry.
CREATE INDEX IF NOT EXISTS {{.Name}}_failed_idx ON {{.Table}} (consumer, processed_at, message_id) WHERE state = 3;
