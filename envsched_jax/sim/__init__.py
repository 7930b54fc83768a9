"""Simulated rewards for trying schedulers without an LLM (toy models; the full learning-dynamics
testbed is a separate module)."""
