"""The pieces of ``elasticps bench chaos`` (:mod:`elasticps.bench.chaos_bench`):
the manager's process, the ledger of what it acknowledged, one module per
family of faults, the job-side programs of the doomed jobs, and the invariants."""
