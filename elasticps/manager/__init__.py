"""The configuration manager (in progress): job specs and the durable store.

The service loop, REST API, CLI and dashboard of issue 6 build on these.
"""

from elasticps.manager.spec import JobSpec, TaskSpec, parse_spec
from elasticps.manager.store import JobRecord, Store

__all__ = ["JobRecord", "JobSpec", "Store", "TaskSpec", "parse_spec"]
