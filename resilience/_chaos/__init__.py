"""Private implementation of :mod:`resilience.chaos` (fault injection)."""
