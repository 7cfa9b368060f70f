"""The nemesis: service replicas over a clustered backend, seeded faults, a JSONL
history of every call, and two checkers (the project's own and porcupine). See
``toolkit/nemesis/cli.py``."""
