"""Bounds shared by the job spec (:mod:`elasticps.manager.spec`), the runtime's
:class:`~elasticps.runtime.config.JobConfig` and the CLI: one place, no import cycle."""

#: Most PS shards, workers or standby workers one job may ask for.
MAX_TASKS = 1024
