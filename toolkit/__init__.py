"""Operator tools shipped with the service, beside it rather than inside it.

* ``toolkit.bench``: ``message-committer bench``, throughput, latency and cost;
* ``toolkit.campaign``: ``message-committer fault-campaign``, seeded fault
  schedules against a real backend, and the invariant checker every suite uses.

Like ``cassandra-stress`` beside Cassandra: the service never imports these.
"""
