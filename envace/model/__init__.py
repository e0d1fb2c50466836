"""envace.model: the model side — chat format, model loading, generation backends, the rollout
engine, test-time rehearsal and world-model simulators (local and served)."""
