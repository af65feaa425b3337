-- Ids are not unique across users (a host may give two users' turns one event id, so the same
-- derived ids): rows are keyed and loaded by (user_id, id) — 0006's and 0007's notes that ids
-- are unique, and loaded by id alone, no longer hold. Only the control plane still looks an id
-- up alone, to tell an unknown id from another user's: for episodes, as memory_facts_fact_id
-- and memory_edges_edge_id do for facts and edges, an index instead of a scan of every partition.
CREATE INDEX episodes_episode_id ON episodes (episode_id);
