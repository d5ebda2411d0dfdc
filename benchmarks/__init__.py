"""Side-by-side benchmarks of resilience and its peers; ``make bench`` runs them all."""
