"""Sealing for crypto-shredding: each user's personal content is sealed with a data key of their
own (AES-256-GCM), data keys are kept wrapped by a key-encryption key, and forgetting a user
destroys their data key — every record sealed with it, on any log or backup, is then noise.

Built so far: the key-encryption keys (``kek``) and the per-user data keys with sealing and
opening (``keys``). Not yet wired into the codec and the topics (docs/erasure.md says how it
will be)."""
