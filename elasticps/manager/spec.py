"""Job specs as users submit them (YAML or JSON), validated with pydantic.

```yaml
name: digits-1
program: elasticps.examples.digits:program   # a TrainingProgram or a factory of one
args: {epochs: 30}                           # optional: keyword arguments of the factory
mode: sync                                   # or async
ps:      {min: 1, max: 4, cpu: 0.5, memory_gb: 1}
workers: {min: 1, max: 8, cpu: 1, memory_gb: 2}
objective: goodput                           # optional: goodput | speed | efficiency
checkpoint_every_steps: 100
```
"""

from __future__ import annotations

import json
import re
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from elasticps.errors import ConfigError

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_PROGRAM = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class TaskSpec(BaseModel):
    """How many tasks of one kind, and what each asks for."""

    model_config = ConfigDict(extra="forbid")

    min: int = Field(1, ge=0)
    max: int = Field(8, ge=0)
    cpu: float = Field(1.0, gt=0)
    memory_gb: float = Field(0.0, ge=0)
    gpu: float = Field(0.0, ge=0)
    cpu_limit: float | None = Field(None, gt=0, description="cores the task may use (a container's CPU limit)")

    @model_validator(mode="after")
    def _min_le_max(self) -> TaskSpec:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    program: str
    args: dict[str, int | float | str | bool] = Field(default_factory=dict)  # keyword arguments of a factory
    mode: Literal["sync", "async"] = "sync"
    ps: TaskSpec = Field(default_factory=lambda: TaskSpec(min=1, max=4, cpu=0.5))
    workers: TaskSpec = Field(default_factory=lambda: TaskSpec(min=1, max=8, cpu=1.0))
    objective: Literal["goodput", "speed", "efficiency"] | None = None
    checkpoint_every_steps: int = Field(100, ge=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-63 lowercase letters, digits or '-', starting and ending alphanumeric")
        return v

    @field_validator("program")
    @classmethod
    def _program(cls, v: str) -> str:
        if not _PROGRAM.match(v):
            raise ValueError("must look like 'package.module:attr'")
        return v

    @model_validator(mode="after")
    def _workers(self) -> JobSpec:
        if self.workers.min < 1:
            raise ValueError("workers.min must be >= 1")
        return self


def parse_spec(text: str, fmt: Literal["yaml", "json"] = "yaml") -> JobSpec:
    """Parse and validate; a :class:`ConfigError` names the bad field."""
    try:
        data = yaml.safe_load(text) if fmt == "yaml" else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"job spec is not valid {fmt.upper()}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError("job spec must be a mapping")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "spec"
        raise ConfigError(f"job spec field '{where}': {first['msg']}") from exc
