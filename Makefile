# Two commands for a fresh machine: `make run` and `make test`.
.PHONY: setup run test lint fmt

setup:
	scripts/setup.sh

## Start the service on the memory backend (not durable) on 127.0.0.1:50051, metrics on :9464.
run: setup
	.venv/bin/message-committer serve --backend memory --grpc-address 127.0.0.1:50051 --http-address 127.0.0.1:9464

## Run every check and test (starts its own redis-server and CQL node).
test:
	scripts/test.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy

fmt:
	.venv/bin/ruff check --fix . && .venv/bin/ruff format .
