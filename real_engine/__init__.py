"""The live torch engine: target model, KV cache, draft trees, verifiers, drafters and the decode loop."""
