"""The benchmark harness: workloads, a driver, targets, engines and reports (`hiveroute bench`)."""
