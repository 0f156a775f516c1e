"""kembed sink: results from Kafka upserted into PostgreSQL/pgvector or Milvus.

Never imports torch, transformers or the worker's pipeline: a sink needs no model.
"""
