"""Where a study keeps its finished cells, and how a cell is keyed.

A cell's key hashes the study name, the cell's resolved config, its mode and the training-code
fingerprint (:mod:`asyncrl.analysis.study_code`). Its record lives in ``OUT/cells/KEY/cell.json`` (beside the
run directory and log a local study leaves there), or, once packed (``asyncrl study FILE --archive``),
in ``OUT/cells.tar.xz``: one xz-compressed tar of ``KEY/cell.json`` members, read in memory, never
extracted. A record file wins over the archive's record of the same key (a cell run again with
--retry-failed); packing again merges both.

``OUT/aliases.json`` lists code fingerprints that ``asyncrl study FILE --alias-code REV`` proved equal
to a later one but for moved modules: a cell keyed under an aliased fingerprint counts as the same
cell under the new one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path

from asyncrl.analysis.study_file import Cell, Study

ARCHIVE = "cells.tar.xz"
ALIASES = "aliases.json"


def cell_key(study: Study, cell: Cell, fingerprint: str) -> str:
    blob = json.dumps(
        {"study": study.name, "mode": cell.mode, "config": cell.resolved_config(), "code": fingerprint}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def identity(x) -> tuple:
    """What names a cell in its study file (a Cell or a record of one), code aside."""
    get = (lambda k: x[k]) if isinstance(x, dict) else (lambda k: getattr(x, k))
    return (
        get("label"),
        get("env"),
        get("preset"),
        get("condition"),
        get("seed"),
        tuple(get("overrides")),
        get("total_env_steps"),
        get("mode"),
    )


class CellStore:
    """The finished cells of one study directory: record files and the archive, read once."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self._archived: dict[str, dict] | None = None

    @property
    def archive_path(self) -> Path:
        return self.out / ARCHIVE

    def record_path(self, key: str) -> Path:
        return self.out / "cells" / key / "cell.json"

    def archived(self) -> dict[str, dict]:
        """{key: record} of the archive ({} without one)."""
        if self._archived is None:
            self._archived = {k: json.loads(b) for k, b in self._archived_bytes().items()}
        return self._archived

    def _archived_bytes(self) -> dict[str, bytes]:
        out = {}
        if self.archive_path.exists():
            with tarfile.open(self.archive_path, "r:xz") as tar:
                for m in tar:
                    if m.isfile() and m.name.endswith("/cell.json"):
                        out[m.name.split("/")[0]] = tar.extractfile(m).read()
        return out

    def files(self) -> dict[str, Path]:
        """{key: record file} of the cells not packed yet."""
        return {p.parent.name: p for p in sorted((self.out / "cells").glob("*/cell.json"))}

    def get(self, key: str) -> dict | None:
        """The record of ``key``: its file, else the archive's; None if the cell has not finished."""
        p = self.record_path(key)
        if p.exists():
            return json.loads(p.read_text())
        return self.archived().get(key)

    def has(self, key: str) -> bool:
        return self.record_path(key).exists() or key in self.archived()

    def records(self) -> dict[str, dict]:
        """{key: record} of every finished cell, files over the archive."""
        return {**self.archived(), **{k: json.loads(p.read_text()) for k, p in self.files().items()}}

    def pack(self) -> tuple[int, int]:
        """Write every finished record into the archive, byte for byte as written (sorted, fixed
        metadata: the same records give the same archive), then remove the packed record files and any cell directory
        left empty
        (a local study's run directories and logs stay). Returns (records in the archive, files
        packed)."""
        files = self.files()
        records = {**self._archived_bytes(), **{k: p.read_bytes() for k, p in files.items()}}  # as written
        tmp = self.archive_path.with_suffix(".tmp")
        with tarfile.open(tmp, "w:xz", format=tarfile.PAX_FORMAT, preset=9) as tar:
            for key in sorted(records):
                info = tarfile.TarInfo(f"{key}/cell.json")
                info.size, info.mtime, info.mode = len(records[key]), 0, 0o644
                tar.addfile(info, io.BytesIO(records[key]))
        os.replace(tmp, self.archive_path)
        self._archived = None
        for p in files.values():
            p.unlink()
            try:
                p.parent.rmdir()
            except OSError:
                pass  # the run directory and log stay
        try:
            (self.out / "cells").rmdir()
        except OSError:
            pass
        return len(records), len(files)

    # -- aliases ------------------------------------------------------------------------------------

    def aliases(self) -> list[dict]:
        path = self.out / ALIASES
        return json.loads(path.read_text())["aliases"] if path.exists() else []

    def add_alias(self, entry: dict) -> None:
        """Record that fingerprint entry["old"] is entry["new"] with modules moved (checked by
        asyncrl.analysis.study_code.alias_check)."""
        entries = [a for a in self.aliases() if (a["old"], a["new"]) != (entry["old"], entry["new"])]
        entries.append({**entry, "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / ALIASES).write_text(json.dumps({"aliases": entries}, indent=1) + "\n")

    def equivalent(self, fingerprint: str) -> list[str]:
        """``fingerprint`` and every fingerprint aliased to it, directly or through a chain, nearest first."""
        out, frontier = [fingerprint], [fingerprint]
        entries = self.aliases()
        while frontier:
            now = frontier.pop(0)
            for a in entries:
                if a["new"] == now and a["old"] not in out:
                    out.append(a["old"])
                    frontier.append(a["old"])
        return out
