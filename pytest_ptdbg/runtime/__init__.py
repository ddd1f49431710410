"""What the debugger runs on: configuration validation, devices, seeding, worker processes, and the
process utilities every stage may use (the collector paused, a progress bar, numbers as text)."""
