"""kembed worker: consumes embedding requests from Kafka and publishes vectors."""
