-- Identities are replaced in log order, whatever order their statements are applied in: each
-- row keeps the events-partition offset of the statement it holds (one user's, or the host-wide
-- key's, records share one partition), an older one applied again changes nothing, and a
-- deleted expert identity leaves a tombstone (its text blanked) that reads skip.
ALTER TABLE person_identities ADD COLUMN source_offset bigint NOT NULL DEFAULT -1;
ALTER TABLE expert_identities ADD COLUMN source_offset bigint NOT NULL DEFAULT -1,
                              ADD COLUMN deleted boolean NOT NULL DEFAULT false;
