"""The worker's only aiokafka users: the request source and the result publisher."""
