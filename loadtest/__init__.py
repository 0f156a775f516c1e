"""kembed benchmarks: end-to-end through Kafka against in-process baselines, same run."""
