"""A study's finished cells packed into cells.tar.xz (read in place by the report and a resumed
study), aliases of training code that only moved, and the any-code report of a shared run."""

import json
import tarfile

from click.testing import CliRunner

from asyncrl.analysis import study as study_mod
from asyncrl.analysis.study import Runner, load_study
from asyncrl.analysis.study_record import DIAGNOSTICS
from asyncrl.analysis.study_store import CellStore
from asyncrl.cli import main

STUDY = """name = "s"
total_env_steps = 2048
seeds = [1, 2]
envs = ["asyncrl/Corridor-v0"]
[[arm]]
presets = ["vaco", "ppo"]
conditions = ["none"]
[[arm]]
name = "delta"
presets = ["vaco"]
conditions = ["none"]
sweep = {"algo.tv_threshold" = [0.2, 0.1]}
"""


def _study(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(STUDY)
    return path, load_study(path)


def _record(cell, key, fingerprint, final, started="2026-12-01T09:00"):
    return {
        "label": cell.label,
        "env": cell.env,
        "preset": cell.preset,
        "condition": cell.condition,
        "seed": cell.seed,
        "mode": cell.mode,
        "overrides": list(cell.overrides),
        "total_env_steps": cell.total_env_steps,
        "key": key,
        "code_fingerprint": fingerprint,
        "status": "ok",
        "final_return": final,
        "auc": final,
        "started": started,
        "diagnostics": {k: {"mean": 0.1, "last": 0.1} for k in DIAGNOSTICS},
        "curve": [[0, 0.0, None], [2048, 1.0, final]],
        "commit": "c",
        "machine": {},
        "load_start": 1.0,
        "load_end": 1.0,
    }


def _finish(runner, cells, final=1.0):
    for i, c in enumerate(cells):
        p = runner.record_path(c)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(_record(c, runner.keys[c], runner.fingerprint, final + i)))


def test_packed_cells_are_read_in_place_and_a_resumed_study_skips_them(tmp_path):
    path, st = _study(tmp_path)
    out = tmp_path / "out"
    runner = Runner(st, out, echo=lambda *_: None)
    half = runner.pending()[:3]
    _finish(runner, half)
    (out / "cells" / runner.keys[half[0]] / "run").mkdir()  # a local study's run directory stays
    before = runner.finished_records()
    pending = runner.pending()
    assert CellStore(out).pack() == (3, 3)
    assert (out / "cells.tar.xz").exists() and not list(out.glob("cells/*/cell.json"))
    assert (out / "cells" / runner.keys[half[0]] / "run").is_dir()
    again = Runner(st, out, echo=lambda *_: None)
    assert again.finished_records() == before and again.pending() == pending
    with tarfile.open(out / "cells.tar.xz") as tar:
        assert sorted(m.name for m in tar) == sorted(f"{runner.keys[c]}/cell.json" for c in half)
    # a cell run after packing is a file again; the file wins over the archive; packing merges both
    _finish(again, pending[:1], final=7.0)
    rerun = again.record_path(half[1])
    rerun.parent.mkdir(parents=True, exist_ok=True)
    rerun.write_text(json.dumps({**_record(half[1], again.keys[half[1]], again.fingerprint, 9.0), "status": "failed"}))
    assert again.finished(half[1])["status"] == "failed"
    assert half[1] in Runner(st, out, echo=lambda *_: None, retry_failed=True).pending()
    data = (out / "cells.tar.xz").read_bytes()
    assert CellStore(out).pack() == (4, 2)
    assert Runner(st, out, echo=lambda *_: None).finished(half[1])["status"] == "failed"
    assert (out / "cells.tar.xz").read_bytes() != data
    data = (out / "cells.tar.xz").read_bytes()
    CellStore(out).pack()  # same records: the same bytes
    assert (out / "cells.tar.xz").read_bytes() == data


def test_cli_archive_then_report_only_gives_the_same_report(tmp_path):
    path, st = _study(tmp_path)
    out = tmp_path / "out"
    runner = Runner(st, out, echo=lambda *_: None)
    _finish(runner, runner.pending())
    cli = CliRunner()
    first = cli.invoke(main, ["study", str(path), "--out", str(out), "--report-only"])
    assert first.exit_code == 0, first.output
    report = {f: (out / f).read_text() for f in ("results.csv", "results.json")}
    packed = cli.invoke(main, ["study", str(path), "--out", str(out), "--archive"])
    assert packed.exit_code == 0 and "packed 6 cell records" in packed.output, packed.output
    dry = cli.invoke(main, ["study", str(path), "--out", str(out), "--dry-run"])
    assert dry.output.count("finished") == len(st.cells) and "pending" not in dry.output
    second = cli.invoke(main, ["study", str(path), "--out", str(out), "--report-only"])
    assert second.exit_code == 0 and "(8 of 8 cells finished)" in second.output, second.output
    assert {f: (out / f).read_text() for f in report} == report


def test_an_aliased_fingerprint_finds_the_cells_of_the_old_one(tmp_path, monkeypatch):
    path, st = _study(tmp_path)
    out = tmp_path / "out"
    monkeypatch.setattr(study_mod, "training_code_fingerprint", lambda: "a" * 16)
    old = Runner(st, out, echo=lambda *_: None)
    _finish(old, old.pending())
    CellStore(out).pack()
    monkeypatch.setattr(study_mod, "training_code_fingerprint", lambda: "b" * 16)
    assert len(Runner(st, out, echo=lambda *_: None).finished_records()) == 0  # a new fingerprint: all run again
    CellStore(out).add_alias({"old": "a" * 16, "new": "c" * 16, "revision": "x"})
    assert len(Runner(st, out, echo=lambda *_: None).pending()) == 6  # an alias to another one
    CellStore(out).add_alias({"old": "c" * 16, "new": "b" * 16, "revision": "y"})  # a chain: a -> c -> b
    new = Runner(st, out, echo=lambda *_: None)
    assert new.pending() == [] and len(new.finished_records()) == len(st.cells)
    assert CellStore(out).equivalent("b" * 16) == ["b" * 16, "c" * 16, "a" * 16]


def test_any_code_gives_a_cell_that_never_ran_as_itself_the_run_it_shared(tmp_path):
    """The delta arm's 0.1 cells resolve to the plain vaco run: under other code they ran once, as
    vaco; a cell with records of its own keeps them."""
    path, st = _study(tmp_path)
    out = tmp_path / "out"
    runner = Runner(st, out, echo=lambda *_: None)
    store = CellStore(out)
    for i, c in enumerate(c for c in st.cells if not c.label.startswith("delta tv_threshold=0.1")):
        p = store.record_path(f"old{i:02d}")
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps(_record(c, f"old{i:02d}", "0" * 16, 100.0 * (i + 1))))
    recs = runner.finished_records(any_code=True)
    assert len(recs) == len(st.cells)
    by = {(r["label"], r["seed"]): r["final_return"] for r in recs}
    for seed in (1, 2):
        assert by[("delta tv_threshold=0.1", seed)] == by[("vaco", seed)]
        assert by[("delta tv_threshold=0.2", seed)] != by[("vaco", seed)]
    assert runner.finished_records() == []


def test_alias_code_command_refuses_what_it_cannot_check(tmp_path):
    """--alias-code with a revision git does not know: one line, exit status 2, nothing recorded (the
    check itself: tests/test_study_code.py)."""
    path, st = _study(tmp_path)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["study", str(path), "--out", str(out), "--alias-code", "no-such-revision"])
    assert res.exit_code == 2 and "is not a commit" in res.output, res.output
    assert not (out / "aliases.json").exists()


def test_report_only_of_a_selection_without_finished_cells_keeps_the_report(tmp_path):
    """--report-only with selection flags no finished cell matches (e.g. the run's were forgotten) is
    one error line, and the report the study wrote stays as it was."""
    path, st = _study(tmp_path)
    out = tmp_path / "out"
    runner = Runner(st, out, echo=lambda *_: None)
    _finish(runner, runner.pending())
    cli = CliRunner()
    assert cli.invoke(main, ["study", str(path), "--out", str(out), "--report-only"]).exit_code == 0
    before = (out / "report.md").read_text()
    other = cli.invoke(main, ["study", str(path), "--out", str(out), "--report-only", "--seeds", "999"])
    assert other.exit_code == 2 and "same --envs/--seeds" in other.output, other.output
    assert (out / "report.md").read_text() == before
