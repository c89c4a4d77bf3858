"""Job specs as users submit them (YAML or JSON), validated with pydantic.

```yaml
name: digits-1
program: elasticps.examples.digits:program   # a TrainingProgram or a factory of one
args: {epochs: 30}                           # optional: keyword arguments of the factory
mode: sync                                   # or async
ps:      {min: 1, max: 4, cpu: 0.5, memory_gb: 1}
workers: {min: 1, max: 8, cpu: 1, memory_gb: 2}  # a key left out of ps or workers takes that kind's default
objective: goodput                           # optional: goodput | speed | efficiency
checkpoint_every_steps: 100                  # optional: steps between checkpoints (0: at epochs' ends only)
step_timeout_s: 1800                         # optional: a step slower than this is taken for hung (default 600)
standby_workers: 2                           # optional: CPU workers kept started ahead for grows (default 0)
runtime_env:                                 # optional: Ray's runtime_env for the job's processes
  working_dir: /path/to/code                 # a directory on the server's machine, or a URI (s3://, https://...zip)
  py_modules: []                             # more directories or URIs put on sys.path
  pip: []                                    # requirements installed in a virtualenv for the job
  env_vars: {KEY: value}
```

Validation is strict: integers must be integers (``true`` is not 1, ``"3"`` is
not 3) of at most 2**53 in size, numbers must be finite, names must match in full, a PS job has at
least one PS. Every error names its field, and all of a spec's errors come at once (a
:class:`SpecError` lists them; an unknown field says which known one it may mean). Nothing here imports the program:
that happens in a Ray process of the job's own (see :mod:`elasticps.manager.runtime`).
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from elasticps.errors import ConfigError
from elasticps.limits import MAX_TASKS

NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
NAME_RULE = "1-63 lowercase letters, digits or '-', starting and ending alphanumeric"
PROGRAM_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
#: Most a spec may hold: the API refuses larger bodies before parsing them.
MAX_SPEC_BYTES = 64 * 1024
MAX_ARGS = 32
MAX_ARG_CHARS = 1024
#: Integers a spec may carry: what a float (JSON's number, the dashboard's) holds exactly.
MAX_INT = 2**53

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

ArgValue = (
    Annotated[int, Field(strict=True, ge=-MAX_INT, le=MAX_INT)]
    | Annotated[float, Field(strict=True, allow_inf_nan=False)]
    | Annotated[str, Field(max_length=MAX_ARG_CHARS)]
    | bool
)


#: What a job's PS shards are given where its spec does not say (a shard is lighter than a worker).
PS_DEFAULTS: dict[str, Any] = {"min": 1, "max": 4, "cpu": 0.5}


NO_TASKS = "min must be >= 1: a parameter-server job needs at least one PS and one worker"


def min_above_max(low: int, high: int) -> str:
    return f"min ({low}) must be <= max ({high})"


class TaskSpec(BaseModel):
    """How many tasks of one kind, and what each asks for."""

    model_config = _STRICT

    min: int = Field(1, ge=0, le=MAX_TASKS)
    max: int = Field(8, ge=0, le=MAX_TASKS)
    cpu: float = Field(1.0, gt=0, le=1e6)
    memory_gb: float = Field(0.0, ge=0, le=1e9)
    gpu: float = Field(0.0, ge=0, le=1e6)
    cpu_limit: float | None = Field(None, gt=0, le=1e6, description="cores the task may use (a container's CPU limit)")

    @model_validator(mode="after")
    def _min_le_max(self) -> TaskSpec:
        if self.min > self.max:
            raise ValueError(min_above_max(self.min, self.max))
        return self


class RuntimeEnvSpec(BaseModel):
    """The code and environment a job's processes run in: Ray's own ``runtime_env``
    (working_dir and py_modules are uploaded to the Ray cluster by the manager;
    pip packages are installed per job). The manager's ``--allow-programs``
    refuses it: shipped code could shadow an allowed module."""

    model_config = _STRICT

    working_dir: str | None = Field(None, max_length=1024, description="a directory or a URI")
    py_modules: list[Annotated[str, Field(max_length=1024)]] = Field(default_factory=list, max_length=16)
    pip: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=64)
    env_vars: dict[str, Annotated[str, Field(max_length=MAX_ARG_CHARS)]] = Field(default_factory=dict, max_length=64)

    def to_ray(self) -> dict[str, Any]:
        """The dict Ray takes (``.options(runtime_env=...)``); empty parts left out."""
        out: dict[str, Any] = {}
        if self.working_dir:
            out["working_dir"] = self.working_dir
        for key in ("py_modules", "pip", "env_vars"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


class JobSpec(BaseModel):
    model_config = _STRICT

    name: str = Field(description="1-63 lowercase letters, digits or '-', starting and ending alphanumeric")
    program: str = Field(description="'package.module:attr' naming a TrainingProgram or a factory of one")
    args: dict[str, ArgValue] = Field(default_factory=dict, description="keyword arguments of the factory")
    mode: Literal["sync", "async"] = "sync"
    ps: TaskSpec = Field(default_factory=lambda: TaskSpec(**PS_DEFAULTS))
    workers: TaskSpec = Field(default_factory=lambda: TaskSpec(min=1, max=8, cpu=1.0))
    objective: Literal["goodput", "speed", "efficiency"] | None = None
    checkpoint_every_steps: int = Field(100, ge=0, le=10**9)
    step_timeout_s: float | None = Field(
        None, gt=0, le=1e7, description="seconds a step may take before its late tasks are taken for hung"
    )
    standby_workers: int = Field(
        0, ge=0, le=MAX_TASKS, description="CPU worker processes started ahead, for grows to take (no GPUs)"
    )
    runtime_env: RuntimeEnvSpec | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError(f"must be {NAME_RULE}")
        return v

    @field_validator("program")
    @classmethod
    def _program(cls, v: str) -> str:
        if len(v) > 200 or not PROGRAM_RE.fullmatch(v):
            raise ValueError("must look like 'package.module:attr'")
        return v

    @field_validator("args", mode="before")
    @classmethod
    def _int_args_in_range(cls, v: Any) -> Any:
        """An integer beyond 2**53 is refused, not read as the float next to it."""
        if isinstance(v, dict):
            for key, value in v.items():
                if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                    raise ValueError(f"argument {str(key)[:40]!r}: integers must be at most 2**53 in size")
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(v) > MAX_ARGS:
            raise ValueError(f"at most {MAX_ARGS} arguments")
        for key in v:
            if not key.isidentifier():
                raise ValueError(f"{key[:40]!r} is not a keyword argument name")
        return v

    @field_validator("ps", mode="before")
    @classmethod
    def _ps_defaults(cls, v: Any) -> Any:
        """A ``ps`` block's keys left out take the PS defaults (:data:`PS_DEFAULTS`),
        as a spec without the block does, not a worker's; a ``min`` above the
        default ``max`` raises ``max`` to it."""
        if not isinstance(v, dict):
            return v
        filled = {**PS_DEFAULTS, **v}
        if "max" not in v and isinstance(v.get("min"), int) and v["min"] > PS_DEFAULTS["max"]:
            filled["max"] = v["min"]
        return filled

    @field_validator("ps", "workers")
    @classmethod
    def _at_least_one(cls, v: TaskSpec) -> TaskSpec:
        if v.min < 1:
            raise ValueError(NO_TASKS)
        return v

    @classmethod
    def limit_problems(cls, data: dict[str, Any]) -> list[str]:
        """The ``ps`` and ``workers`` blocks' own checks on the spec as given: pydantic
        runs them only on a block whose every field is valid, so a spec with a wrong
        field in a block would have them said only once that field is mended."""
        problems = []
        for kind in ("ps", "workers"):
            block = cls._ps_defaults(data.get(kind)) if kind == "ps" else data.get(kind)
            if not isinstance(block, dict):
                continue
            low, high = block.get("min", 1), block.get("max", 8)
            if type(low) is int and type(high) is int:
                if low > high:
                    problems.append(f"job spec field '{kind}': {min_above_max(low, high)}")
                if low < 1:
                    problems.append(f"job spec field '{kind}': {NO_TASKS}")
        return problems

    @field_validator("standby_workers")
    @classmethod
    def _standby_cpu_only(cls, v: int, info: ValidationInfo) -> int:
        workers = info.data.get("workers")  # validated before it (absent if it was not valid)
        if v and workers is not None and workers.gpu:
            raise ValueError("standby workers are CPU workers only: 'workers' asks for GPUs")
        return v


class Range(BaseModel):
    """New bounds of one kind of task; a bound left out keeps its value."""

    model_config = _STRICT

    min: int | None = Field(None, ge=0, le=MAX_TASKS)
    max: int | None = Field(None, ge=0, le=MAX_TASKS)


class LimitsPatch(BaseModel):
    """``PATCH /jobs/{name}``: ``{"ps": {"min": 1, "max": 2}, "workers": {"max": 4}}``."""

    model_config = _STRICT

    ps: Range | None = None
    workers: Range | None = None


class _NoAliases(yaml.SafeLoader):
    """Safe YAML without anchors and aliases (an alias bomb is small on the wire, huge once expanded)."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases are not allowed", self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        # a key given twice is a mistake (which one was meant?), not "the last one wins"
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, refused where a name is given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key!r} is given twice")
        out[key] = value
    return out


class SpecError(ConfigError):
    """A spec (or limits) document that is not valid: ``problems`` lists every one,
    each naming its field; the message is one problem a line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_document(text: str | bytes, fmt: Literal["yaml", "json"], what: str = "job spec") -> Any:
    """Parse one YAML or JSON document; :class:`SpecError` on bad syntax (with its line
    and column), depth or size."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError([f"{what} is larger than {MAX_SPEC_BYTES} bytes"])
    try:
        return yaml.load(text, Loader=_NoAliases) if fmt == "yaml" else json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError as exc:
        raise SpecError([f"{what}: {fmt.upper()} nested too deeply"]) from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpecError([f"{what} is not valid YAML{where}: {exc.problem or exc.context}"]) from exc
    except json.JSONDecodeError as exc:
        raise SpecError([f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"]) from exc
    except (yaml.YAMLError, ValueError) as exc:  # a YAML error without a mark, UnicodeDecodeError
        raise SpecError([f"{what} is not valid {fmt.upper()}: {exc}"]) from exc


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose fields ``loc`` (a field path) names, descending through nested models."""
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
            annotation = next((a for a in typing.get_args(annotation) if a is not type(None)), None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _unknown_field(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """ "unknown field; did you mean 'workers'?" (difflib against the fields where it was found)."""
    known = _model_at(model, loc[:-1])
    if known is None:
        return "unknown field"
    fields = list(known.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), fields, n=1, cutoff=0.7)
    return f"unknown field; did you mean '{close[0]}'?" if close else f"unknown field (fields: {', '.join(fields)})"


def validation_problems(exc: ValidationError, what: str = "job spec", model: type[BaseModel] = BaseModel) -> list[str]:
    """Every error of ``exc``, one line each: ``job spec field 'workers.max': Input should be ...``."""
    problems: list[str] = []
    for error in exc.errors():
        loc, msg = tuple(error["loc"]), error["msg"].removeprefix("Value error, ")
        if loc[:1] == ("args",) and len(loc) > 2:  # a union member's name is no field of the user's
            loc, msg = loc[:2], "must be a finite number, an integer of at most 2**53 in size, a string or a boolean"
        elif error["type"] == "extra_forbidden":
            msg = _unknown_field(model, loc)
        where = ".".join(str(p) for p in loc) or "spec"
        line = f"{what} field '{where}': {msg}"
        if line not in problems:
            problems.append(line)
    return problems


def validate_as(model: type[BaseModel], data: Any, what: str) -> Any:
    if not isinstance(data, dict):
        raise SpecError([f"{what} must be a mapping"])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, what, model)
        if model is JobSpec:  # what pydantic leaves unsaid where a block has another error
            problems += [p for p in JobSpec.limit_problems(data) if p not in problems]
        raise SpecError(problems) from exc
    except RecursionError as exc:
        raise SpecError([f"{what} is nested too deeply"]) from exc


def parse_spec(text: str | bytes, fmt: Literal["yaml", "json"] = "yaml") -> JobSpec:
    """Parse and validate; a :class:`ConfigError` names the bad field."""
    return validate_as(JobSpec, load_document(text, fmt), "job spec")


def parse_limits(text: str | bytes, fmt: Literal["yaml", "json"] = "json") -> LimitsPatch:
    return validate_as(LimitsPatch, load_document(text, fmt, "job limits"), "job limits")
