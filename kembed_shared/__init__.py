"""The layer the worker, the sink and the SDK share: Kafka plumbing, settings, observability."""
