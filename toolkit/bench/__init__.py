"""``message-committer bench``: throughput, latency and cost of the service over real gRPC.

Modules:

* ``cli``: the command (``main(argv) -> int``), one backend after another;
* ``runner``: the phases of one backend, in rounds;
* ``environment``: the server and backend under test (started here or targeted);
* ``workloads``: the workloads and the requests they send;
* ``driver``: the client processes that drive the server;
* ``floors``: the gRPC floor (health Check) and the storage floor (store calls);
* ``report``: statistics, the printed table, ratios and the JSON file;
* ``targets``: the performance targets, pass or fail.
"""
