"""KV-cache knowledge: tokenization, block keys, KV-event subscribers and the global block index."""
