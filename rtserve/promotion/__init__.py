"""Model versions on a running server: the promotion gate, its measurements, rollout and history."""
