-- Reminders keyed by (user_id, reminder_id), like every other row. A reminder id is the
-- host's (by default uuid5(event_id, 'reminder')): two users' events with one id named one
-- reminder, so the second user's was never stored and resolving it was refused as unknown. A
-- store written before this brings such reminders back by a replay of the commands projection.
ALTER TABLE reminders DROP CONSTRAINT reminders_pkey, ADD PRIMARY KEY (user_id, reminder_id);
