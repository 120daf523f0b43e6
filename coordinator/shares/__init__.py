"""Share groups (KIP-932, Kafka's queues): records handed to one member at a time, acknowledged
one by one, and delivered again when released or when their lock runs out."""
