"""The API's OpenAPI schema: the error answers every route declares, and the
request bodies (read by hand, as YAML or JSON) put into its components."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from elasticps.manager.api_boundary import BODY_TYPES
from elasticps.manager.models import ErrorOut
from elasticps.manager.spec import JobSpec, LimitsPatch

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 413, 415, 422, 503)
}


#: Request bodies, read by hand (YAML or JSON), declared in the schema.
BODY_MODELS: tuple[type[BaseModel], ...] = (JobSpec, LimitsPatch)


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {t: {"schema": ref} for t in BODY_TYPES}}}


def with_body_models(app: FastAPI) -> None:
    """Put the request-body models (and the models they use) into the schema's
    components, where the bodies refer to them: FastAPI registers only the
    models it reads or answers with itself."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in BODY_MODELS:
                own = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, sub in own.pop("$defs", {}).items():
                    components.setdefault(name, sub)
                components.setdefault(model.__name__, own)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
