"""Ready-made training programs: digits (real data) and a ~10M-parameter synthetic model."""
