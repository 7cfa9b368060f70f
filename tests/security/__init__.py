"""Security suites: bad input, fuzzing, tenant isolation and log hygiene over a real server."""
