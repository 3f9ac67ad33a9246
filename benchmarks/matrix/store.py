"""Results kept per cell, one JSON file each, so that the matrix resumes where it stopped.

A file holds the cell's description and one entry per run, keyed ``ROUTER/sSEED``. A run that
failed (a router did not start, say) is kept with its error and tried again next time; a run that
finished is never repeated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def run_key(router: str, seed: int) -> str:
    return f"{router}/s{seed}"


class CellStore:
    """The per-cell JSON files under one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, cell: str) -> Path:
        return self.directory / f"{cell}.json"

    def load(self, cell: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path(cell).read_text())
        except FileNotFoundError:
            return {"cell": cell, "runs": {}}
        data.setdefault("runs", {})
        return data

    def save(self, data: dict[str, Any]) -> None:
        """Write atomically: a run interrupted mid-write leaves the previous file whole."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(data["cell"])
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def done(self, cell: str, router: str, seed: int) -> bool:
        run = self.load(cell)["runs"].get(run_key(router, seed))
        return bool(run) and run.get("status") == "ok"

    def record(self, cell: str, info: dict[str, Any], router: str, seed: int, run: dict) -> None:
        data = self.load(cell)
        data.update(info)
        data["runs"][run_key(router, seed)] = {"router": router, "seed": seed, **run}
        self.save(data)

    def all(self) -> list[dict[str, Any]]:
        if not self.directory.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.directory.glob("*.json"))]


def pending(
    store: CellStore, cells: list[str], plan: dict[str, list[str]], seeds: list[int]
) -> list[tuple[str, str, int]]:
    """(cell, router, seed) still to run, in order: cell by cell, seed by seed."""
    return [
        (cell, router, seed)
        for cell in cells
        for seed in seeds
        for router in plan[cell]
        if not store.done(cell, router, seed)
    ]
