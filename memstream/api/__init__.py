"""``memstream serve``: memstream over HTTP for hosts in any language (``memstream.api.app``),
with API keys scoped to a tenant (``memstream.api.keys``). It calls the library — ``TurnLog``,
``MemoryReader``, the control requests — and holds no state of its own."""
