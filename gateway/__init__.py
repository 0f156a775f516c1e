"""kembed gateway: OpenAI- and text-embeddings-inference-shaped HTTP APIs in front of the
Kafka fleet (docs/gateway.md). Each HTTP request is one kembed request sent through the
producer SDK. Needs the ``gateway`` extra (FastAPI, uvicorn); :mod:`gateway.settings`
alone imports neither, so ``kembed gateway --help`` works without it."""
