"""Errors raised to hosts at the producer edge."""


class BrokerUnavailable(ConnectionError):
    """Kafka could not be reached (or did not acknowledge) within the configured timeout."""
