"""Envs-FORGE: frontier-aware synthesis of executable terminal-task bundles (seeds/001)."""
