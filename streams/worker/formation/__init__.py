"""Formation: events in, decisions out. Decides once what is not deterministic."""
