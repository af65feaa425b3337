-- The users an inspector or a tenant's key may list: episodes' user ids in byte order (COLLATE
-- "C"), so the users under one prefix ('<tenant>:') are one range of the index whatever the
-- database's collation (under a linguistic one, 'acme:b' can sort after 'acmea'), walked one
-- distinct id at a time (read_client.memories.users).
CREATE INDEX episodes_user_bytes ON episodes ((user_id COLLATE "C"));
