"""``elasticps export``: a job's trained model, built where the job's code may run.

Building the model imports the job's module and calls its factory: user code,
which must not run in the operator's CLI process (it may hold tokens, and it
writes files as the operator). So a child Python process does it: it loads the
program and the newest usable checkpoint and writes the model's ``state_dict``
and a plain JSON answer (:mod:`elasticps.manager.wire`) to a private temporary
directory. The CLI reads back only tensors (``torch.load(weights_only=True)``,
which builds no other objects) and the checked answer, and writes the file
itself.

Run as ``python -m elasticps.cli.export REQUEST.json`` (the child).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticps.errors import ConfigError

#: The child's output shown when it fails without an answer (the end of it, where the error is).
SHOWN_OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class ExportInfo:
    """What the child says of the checkpoint it exported."""

    name: str
    step: int
    epoch: int
    parameters: int


def export_job(
    program: str, args: dict[str, Any], checkpoint_dir: Path, out: Path, code_paths: list[str] | None = None
) -> dict[str, Any]:
    """Write the ``state_dict`` of ``program``'s model with the parameters of the
    newest usable checkpoint in ``checkpoint_dir`` to ``out``; ``code_paths`` go
    first on the child's ``sys.path`` (a job's shipped code). Returns the
    checkpoint's ``step``, ``epoch``, ``parameters`` and the program's ``name``."""
    import torch

    from elasticps.manager.wire import decode, parse

    with tempfile.TemporaryDirectory(prefix="elasticps-export-") as tmp:  # mode 0700: ours alone
        request = {
            "program": program,
            "args": args,
            "checkpoint_dir": str(checkpoint_dir),
            "state_path": str(Path(tmp, "state.pt")),
            "answer_path": str(Path(tmp, "answer.json")),
            "code_paths": list(code_paths or []),
        }
        Path(tmp, "request.json").write_text(json.dumps(request))
        child = subprocess.run(
            [sys.executable, "-m", "elasticps.cli.export", str(Path(tmp, "request.json"))],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", check=False,
        )  # fmt: skip
        answer = Path(tmp, "answer.json")
        if not answer.exists():
            shown = (child.stderr or child.stdout)[-SHOWN_OUTPUT_CHARS:]
            raise ConfigError(f"building the model failed (exit status {child.returncode}):\n{shown}")
        info = decode(ExportInfo, parse(answer.read_bytes(), "the export's answer"), "export")
        state = torch.load(request["state_path"], weights_only=True)
    if not (isinstance(state, dict) and all(type(k) is str and type(v) is torch.Tensor for k, v in state.items())):
        raise ConfigError("the exported state_dict is not a mapping of names to tensors")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    return {"name": info.name, "step": info.step, "epoch": info.epoch, "parameters": info.parameters}


def _child(request_path: str) -> None:
    """The child's side: user code runs here, and only here."""
    request = json.loads(Path(request_path).read_text())

    def export() -> dict[str, Any]:
        from elasticps.program import load_program
        from elasticps.runtime.export import export_checkpoint

        for path in reversed(request["code_paths"]):
            sys.path.insert(0, path)
        program = load_program(request["program"], request["args"])
        info = export_checkpoint(program, request["checkpoint_dir"], request["state_path"])
        return {"name": program.name, **info}

    from elasticps.manager.wire import answer

    Path(request["answer_path"]).write_bytes(answer(export, "the export"))


if __name__ == "__main__":
    _child(sys.argv[1])
