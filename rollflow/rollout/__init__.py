"""The producer side: staleness-bounded executor, rollout loop, SGLang-protocol client, checkpoint watcher."""
