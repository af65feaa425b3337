-- Redis could not erase what a forget removed (issue 42): the projection's cache moved to a new
-- epoch instead (no reader reads the old keys again), and the old keys are deleted when Redis
-- answers. Set until they are.
ALTER TABLE projection_epochs ADD COLUMN purge_pending boolean NOT NULL DEFAULT false;
