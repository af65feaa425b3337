-- The turns whose episodes were forgotten (EpisodeForgotten), by id only: the same turn on the
-- log again after its forget (a retried dead letter, a host's retried append, a crash between
-- sealing and storing the ingress position) is not recorded anew. A user's go with the user.
CREATE TABLE forgotten_episodes (
    user_id text NOT NULL,
    episode_id uuid NOT NULL,
    PRIMARY KEY (user_id, episode_id)
);
