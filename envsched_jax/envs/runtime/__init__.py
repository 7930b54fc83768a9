"""Code that runs inside the sandboxes: the episode state machine, the wire format and the worker
main loop. Standard library only: the jailed workers see this folder (read-only) and nothing else
of the project."""
