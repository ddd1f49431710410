"""What the debugger runs on: configuration validation, devices, seeding, worker processes."""
