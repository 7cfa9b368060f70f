"""``message-committer fault-campaign`` and the invariant checker of DESIGN §7.

* ``invariants``: reads a backend back and reports violations of §7;
* ``faulty``: wrappers that make a real store or outbox fail, hang or lose replies;
* ``scenario``: one seed draws a workload and a fault schedule and runs it;
* ``cli``: the command.
"""
