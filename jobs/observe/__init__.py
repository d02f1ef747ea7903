"""What a process shows the outside, on the lowest floor so that every package may use it: its Prometheus metrics
(prometheus), its JSON log lines (logs), and its name in the rows it holds (identity: leases, worker sessions and
webhook attempts)."""
