"""Kafka clients for kembed: consumer source, publisher, security, admin, group status."""
