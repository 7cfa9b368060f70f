"""Black-box A/B of the "bad day" defects (issue 11): release 1 against this tree.

``scripts/ab-bad-days.sh [OLD_REV]`` runs ``python -m tests.ab.bad_days``: the
same probes against two trees (each with its own venv), over public surfaces
only (``serve`` processes, gRPC through grpcurl, grpc-health-probe, the CLI, a
real redis-server, the shared CQL node, raw writes to plant bad data).
"""
