"""Kafka's wire protocol as a second front door (docs/pages/http-api.md, "Kafka protocol"): a
listener in every service process whose handlers translate Kafka's requests onto the same domain
services."""
