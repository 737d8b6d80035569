"""Cost terms: pure functions of one configuration returning seconds, bytes or FLOPs."""
