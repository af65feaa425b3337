"""The contract every other part of memstream shares: events, decisions and read models.

Imports nothing of ours. Wire format is JSON (see ``jsonschema/``), decoded with msgspec.
"""
from memstream.schemas.errors import InvalidEvent, UnknownEventType
from memstream.schemas.events import (
    Decision,
    AliasAdded,
    EdgeClosed,
    EdgeOpened,
    EntityCreated,
    EpisodeRecorded,
    Event,
    Passage,
    ExpertIdentityDeleted,
    ExpertIdentityUpserted,
    PersonIdentitySet,
    ReminderResolved,
    ReminderScheduled,
    SYSTEM_USER,
    GraphDecision,
    FactAdded,
    FactChangeDeferred,
    FactRefused,
    FactArchived,
    FactRestored,
    DecaySwept,
    MemoriesUsed,
    SweptFact,
    ReflectionCluster,
    ReflectRequested,
    ReflectionRecorded,
    FactDecision,
    FactDeleted,
    FactReinforced,
    FactUpdated,
    EdgeForgotten,
    EpisodeForgotten,
    FactCorrected,
    FactForgotten,
    LogPosition,
    MemoryForgotten,
    UserForgotten,
    NothingDecided,
    TurnRecorded,
    new_event_id,
)
from memstream.schemas.codec import decode_decision, decode_event, encode

__all__ = [
    "ExpertIdentityDeleted", "ExpertIdentityUpserted", "PersonIdentitySet", "ReminderResolved",
    "ReminderScheduled", "SYSTEM_USER",
    "AliasAdded", "EdgeClosed", "EdgeOpened", "EntityCreated", "GraphDecision",
    "Decision", "EpisodeRecorded", "Passage", "FactAdded", "FactChangeDeferred", "FactRefused", "FactDecision", "FactDeleted",
    "FactReinforced", "FactUpdated", "Event", "InvalidEvent", "LogPosition", "NothingDecided", "TurnRecorded", "EdgeForgotten", "EpisodeForgotten", "FactCorrected",
    "FactForgotten", "MemoryForgotten", "UserForgotten", "FactArchived", "FactRestored", "DecaySwept", "MemoriesUsed",
    "SweptFact", "ReflectionCluster", "ReflectRequested", "ReflectionRecorded",
    "UnknownEventType", "decode_decision", "decode_event", "encode", "new_event_id",
]
