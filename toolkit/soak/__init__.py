"""``message-committer delivery-soak``: delivery under failovers and skewed clocks."""
