"""``message-committer nemesis --system e2e``: devices, serve and relay replicas, one promise."""
