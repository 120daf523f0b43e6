"""Client telemetry (KIP-714): what Kafka's clients push of their own metrics, and the
subscriptions that say which metrics, how often and from which clients.

An operator subscribes with Kafka's own tools (`kafka-client-metrics.sh`, or `kafka-configs.sh
--entity-type client-metrics`): a subscription is a config resource of Kafka's CLIENT_METRICS
type, kept in the store (`subscriptions`). A client asks which metrics it should push
(GetTelemetrySubscriptions) and pushes them (PushTelemetry), each at most once per push
interval (`instances`, per process, as Kafka keeps them per broker). The latest push of each
client is kept in the store, so `GET /metrics` of any process shows every client's metrics as
Prometheus samples (`export`)."""
