"""The client campaign (``message-committer client-campaign``): seeded crashes of
client runtimes at every client fault point, with server kills mixed in, checked
for lost and duplicated messages. ``servers`` and ``host`` are also what the
client tests drive."""
