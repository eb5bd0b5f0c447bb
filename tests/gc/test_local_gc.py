"""``lake gc`` on the local stage: plan, apply, staleness, resume after SIGKILL, tampering.

Every test runs a real Metasrv and runs GC as its own process. Local object
ages are set by backdating modification times (what the inventory reads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lake_core import faults
from lake_core.config import MANAGED_OBJECT_ROOT
from lake_core.errors import DataCorrupted, FailedPrecondition
from lake_core.models import DataLocation
from lake_core.references import ReferenceDelta
from lake_gc import Checkpoint, GcTarget, apply_plan, load_plan
from tests.gc.conftest import EPISODES, HOUR_S, SCRATCH, Lake, SteadyWriter, age, run_gc


def path_of(location: DataLocation) -> Path:
    return Path(location.uri.removeprefix("file://"))


def old(lake: Lake, data: bytes, name: str) -> DataLocation:
    location = lake.upload(data, name)
    age(path_of(location), 2 * HOUR_S)
    return location


def abandoned_partial(lake: Lake) -> Path:
    """What a SIGKILLed uploader leaves: a hidden ``.partial`` beside the objects."""
    directory = lake.stage.tenant_uri("local").removeprefix("file://") + "/objects"
    os.makedirs(directory, exist_ok=True)
    partial = Path(directory) / ".01a2bb00-0000-7000-8000-000000000000.partial"
    partial.write_bytes(b"x" * 4096)
    age(partial, 2 * HOUR_S)
    return partial


def test_orphans_are_planned_then_deleted_and_everything_referenced_survives(
    local_lake: Lake, tmp_path: Path
) -> None:
    lake = local_lake
    lake.create()
    kept = [old(lake, b"a" * 1000, "a"), old(lake, b"b" * 2000, "b")]
    lake.append(kept[:1])
    lake.append(kept[1:])
    lake.admin(lambda c: c.optimize_table(EPISODES))  # a maintenance commit (empty delta)
    never_appended = old(lake, b"o" * 3000, "orphan")
    partial = abandoned_partial(lake)
    lake.create(SCRATCH)
    dropped_only = old(lake, b"d" * 500, "dropped")
    lake.append([dropped_only], SCRATCH)
    lake.admin(lambda c: c.drop_table(SCRATCH))
    young = lake.upload(b"y" * 100, "young")  # in flight: not yet appended

    plan = tmp_path / "plans" / "p1"
    code, reply = lake.gc("--plan", str(plan), "--safety-age-secs", str(HOUR_S))
    assert code == 0, reply
    assert reply["candidates"] == 3
    assert reply["candidate_bytes"] == 3000 + 4096 + 500
    assert reply["candidates_by_kind"] == {"object": 2, "partial": 1}
    assert reply["younger_than_safety_age"] == 1
    assert reply["referenced"] == 2
    # Planning deleted nothing; the manifest is published with its pages.
    for location in [*kept, never_appended, dropped_only, young]:
        assert path_of(location).exists()
    assert partial.exists()
    assert (plan / "manifest.json").exists()

    checkpoint = tmp_path / "plans" / "p1.apply.json"
    code, applied = lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))
    assert code == 0, applied
    assert (applied["deleted"], applied["already_absent"], applied["complete"]) == (3, 0, True)
    assert not path_of(never_appended).exists()
    assert not path_of(dropped_only).exists()
    assert not partial.exists()

    # The in-flight upload commits right after the plan: it was never a candidate.
    lake.append([young])
    for location in lake.retained_locations():
        assert lake.verify(location)  # opens, size and SHA-256 verified at EOF
    assert {loc.uri for loc in lake.retained_locations()} == {
        *(k.uri for k in kept),
        young.uri,
    }
    # Applying the same plan again deletes nothing more (every page is done),
    # though the append above landed after it.
    code, again = lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))
    assert code == 0, again
    assert (again["pages_done"], again["deleted"], again["complete"]) == (1, 3, True)


def test_commits_after_planning_do_not_stop_apply(local_lake: Lake, tmp_path: Path) -> None:
    # Appends, a maintenance commit, a create and a drop after the plan: apply
    # goes on and deletes the plan's garbage (it used to fail closed).
    lake = local_lake
    lake.create()
    orphans = [old(lake, b"o" * 10, f"orphan{i}") for i in range(4)]
    plan, checkpoint = tmp_path / "p", tmp_path / "p.apply.json"
    code, reply = lake.gc("--plan", str(plan), "--safety-age-secs", str(HOUR_S), "--page-size", "2")
    assert (code, reply["candidates"]) == (0, 4), reply
    fresh = lake.upload(b"n", "new")
    lake.append([fresh])
    lake.admin(lambda c: c.create_index(EPISODES, "episode_id"))
    lake.create(SCRATCH)
    lake.append([lake.upload(b"s", "scratch")], SCRATCH)
    lake.admin(lambda c: c.drop_table(SCRATCH))
    code, applied = lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))
    assert code == 0, applied
    assert (applied["deleted"], applied["kept_newly_referenced"], applied["complete"]) == (
        4,
        0,
        True,
    )
    assert not any(path_of(o).exists() for o in orphans)
    assert lake.verify(fresh)


def test_an_object_referenced_after_planning_is_kept(local_lake: Lake, tmp_path: Path) -> None:
    # The safety-age contract says an object past the safety age is never newly
    # referenced; Metasrv does not enforce it (it never reads object ages), so
    # apply checks: whatever a version after the plan adds is taken out of the
    # page, here one commit per page boundary.
    lake = local_lake
    lake.create()
    orphans = [old(lake, bytes([65 + i]) * 10, f"orphan{i}") for i in range(4)]
    plan, checkpoint = tmp_path / "p", tmp_path / "p.apply.json"
    assert lake.plan(plan, HOUR_S, page_size=1).manifest.candidates.entries == 4
    loaded, stage = load_plan(plan), lake.target().stage
    order = [e.uri for page in loaded.manifest.pages for e in loaded.read_page(page, stage)]
    revived = {o.uri: o for o in orphans}[order[2]]
    lake.append([revived])  # breaks the contract: an old object newly referenced
    target = lake.target()
    done = apply_plan(
        load_plan(plan),
        checkpoint,
        roots=target.roots,
        sidecars=target.sidecars,
        stage=target.stage,
    )
    assert done.checkpoint.deleted == 3
    assert done.checkpoint.newly_referenced == 1
    assert lake.verify(revived) == bytes([65 + orphans.index(revived)]) * 10
    assert [path_of(o).exists() for o in orphans] == [o.uri == revived.uri for o in orphans]
    # Resuming from that checkpoint (written with the new field) still checks out.
    assert Checkpoint.read(checkpoint, load_plan(plan)).newly_referenced == 1


def test_a_version_whose_sidecar_changed_after_apply_read_it_in_flight_is_read_again(
    local_lake: Lake, tmp_path: Path
) -> None:
    # A commit attempt that failed after writing its sidecar leaves it past the
    # head; apply reads it as "in flight". The retry of that version writes the
    # version's sidecar again (locally: replaces it; on S3: a second key) with
    # other adds. Once the version is registered apply must read it again, or
    # what the committed version references is deleted.
    lake = local_lake
    lake.create()
    orphans = [old(lake, bytes([65 + i]) * 10, f"orphan{i}") for i in range(2)]
    plan, checkpoint = tmp_path / "p", tmp_path / "p.apply.json"
    assert lake.plan(plan, HOUR_S, page_size=1).manifest.candidates.entries == 2
    loaded, target = load_plan(plan), lake.target()
    order = [e.uri for page in loaded.manifest.pages for e in loaded.read_page(page, target.stage)]
    revived = {o.uri: o for o in orphans}[order[1]]
    assert lake.append([lake.upload(b"n", "new")]) == 1  # the head moved: apply reads on
    incarnation = lake.admin(lambda c: c.describe_table(EPISODES)).entry.descriptor.incarnation
    attempt = ReferenceDelta(table=EPISODES, incarnation=incarnation, version=2, adds=[])
    (lake.data / "sidecars" / incarnation / "2.json").write_text(attempt.model_dump_json())

    def after_page(done: int, total: int) -> None:
        if done == 1:  # between the pages: the retry commits version 2, an old object
            assert lake.append([revived]) == 2

    done = apply_plan(
        loaded,
        checkpoint,
        roots=target.roots,
        sidecars=target.sidecars,
        stage=target.stage,
        progress=after_page,
    )
    assert (done.checkpoint.deleted, done.checkpoint.newly_referenced) == (1, 1)
    assert lake.verify(revived) == bytes([65 + orphans.index(revived)]) * 10


def test_a_version_without_its_sidecar_still_fails_closed(local_lake: Lake, tmp_path: Path) -> None:
    lake = local_lake
    lake.create()
    orphan = old(lake, b"o" * 10, "orphan")
    plan, checkpoint = tmp_path / "p", tmp_path / "p.apply.json"
    assert lake.plan(plan, HOUR_S).manifest.candidates.entries == 1
    version = lake.append([lake.upload(b"n", "new")])
    entry = lake.admin(lambda c: c.describe_table(EPISODES)).entry
    sidecar = lake.data / "sidecars" / entry.descriptor.incarnation / f"{version}.json"
    sidecar.unlink()  # lineage lost: GC cannot know what that version references
    code, reply = lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))
    assert (code, reply["error"]) == (2, "FailedPrecondition"), reply
    assert "no reference-delta sidecar" in reply["message"]
    assert path_of(orphan).exists()
    assert not checkpoint.exists()


def test_gc_given_the_stage_under_another_path_fails_closed(
    local_lake: Lake, tmp_path: Path
) -> None:
    # A symlink to the data directory (or any other spelling of its path) names
    # the same files under other URIs than the ones the tables reference: every
    # referenced object would match no reference and become a candidate.
    lake = local_lake
    lake.create()
    kept = old(lake, b"k" * 1000, "kept")
    lake.append([kept])
    alias = tmp_path / "alias"
    alias.symlink_to(lake.data)
    plan = tmp_path / "p"
    code, reply = run_gc(alias, "--plan", str(plan), "--safety-age-secs", str(HOUR_S))
    assert (code, reply["error"]) == (2, "FailedPrecondition"), reply
    assert "outside the managed stage GC was given" in reply["message"]
    assert "robots.episodes" in reply["message"]
    assert not plan.exists()
    assert lake.verify(kept)
    # Given the path Metasrv uses, the same store plans normally.
    code, reply = lake.gc("--plan", str(plan), "--safety-age-secs", str(HOUR_S))
    assert (code, reply["candidates"], reply["referenced"]) == (0, 0, 1), reply


def test_unusable_plan_or_checkpoint_paths_are_typed_errors_before_any_deletion(
    local_lake: Lake, tmp_path: Path
) -> None:
    lake = local_lake
    lake.create()
    orphan = old(lake, b"o" * 10, "orphan")
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    code, reply = lake.gc("--plan", str(not_a_dir / "p"), "--safety-age-secs", str(HOUR_S))
    assert (code, reply["error"]) == (2, "InvalidArgument"), reply
    assert "Traceback" not in reply["_stderr"]
    plan = tmp_path / "p"
    code, reply = lake.gc("--plan", str(plan), "--safety-age-secs", str(HOUR_S))
    assert (code, reply["candidates"]) == (0, 1), reply
    # A checkpoint in a directory that does not exist: refused before the first
    # page is deleted (it used to delete the page, then crash writing the checkpoint).
    checkpoint = tmp_path / "missing" / "p.apply.json"
    code, reply = lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))
    assert (code, reply["error"]) == (2, "InvalidArgument"), reply
    assert "Traceback" not in reply["_stderr"]
    assert path_of(orphan).exists()


def test_plan_and_apply_under_a_steady_writer(local_lake: Lake, tmp_path: Path) -> None:
    lake = local_lake
    lake.create()
    kept = [old(lake, b"k" * 100, "kept")]
    lake.append(kept)
    orphans = [old(lake, os.urandom(50), f"orphan{i}") for i in range(6)]
    plan, checkpoint = tmp_path / "p", tmp_path / "p.apply.json"
    with SteadyWriter(lake) as writer:
        writer.wait_for_commits(2)
        code, reply = lake.gc(
            "--plan", str(plan), "--safety-age-secs", str(HOUR_S), "--page-size", "2"
        )
        assert code == 0, reply
        assert reply["candidates"] == 6
        writer.wait_for_commits(2)  # commits after the plan, before and during apply
        code, applied = lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))
        assert code == 0, applied
        writer.wait_for_commits(1)
    assert (applied["deleted"], applied["complete"]) == (6, True), applied
    assert not any(path_of(o).exists() for o in orphans)
    assert writer.commits() >= 5
    retained = lake.retained_locations()
    assert {loc.uri for loc in retained} == {loc.uri for loc in [*kept, *writer.appended]}
    for location in retained:
        assert lake.verify(location)


def test_apply_killed_mid_way_resumes_from_its_checkpoint_without_redeleting(
    local_lake: Lake, tmp_path: Path
) -> None:
    lake = local_lake
    lake.create()
    orphans = [old(lake, bytes([i]) * 100, f"o{i}") for i in range(4)]
    plan, checkpoint = tmp_path / "p", tmp_path / "p.apply.json"
    code, reply = lake.gc("--plan", str(plan), "--safety-age-secs", str(HOUR_S), "--page-size", "1")
    assert (code, reply["pages"]) == (0, 4), reply

    killed, _ = lake.gc(
        "--plan",
        str(plan),
        "--apply",
        "--checkpoint",
        str(checkpoint),
        env={faults.FAULTS: faults.GC_AFTER_APPLY_PAGE},
    )
    assert killed == faults.CRASH_EXIT_CODE
    done = json.loads(checkpoint.read_text())["checkpoint"]
    assert done["pages_done"] == 1
    gone = [o for o in orphans if not path_of(o).exists()]
    assert len(gone) == 1
    # Put the first page's object back: a replay of that page would delete it again.
    path_of(gone[0]).write_bytes(b"restored")
    age(path_of(gone[0]), 2 * HOUR_S)

    code, resumed = lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))
    assert code == 0, resumed
    assert resumed["resumed_from_page"] == 1
    assert (resumed["pages_done"], resumed["deleted"], resumed["complete"]) == (4, 4, True)
    assert path_of(gone[0]).read_bytes() == b"restored"
    assert [o for o in orphans if path_of(o).exists()] == gone


def test_a_tampered_plan_or_checkpoint_is_refused_and_nothing_is_deleted(
    local_lake: Lake, tmp_path: Path
) -> None:
    lake = local_lake
    lake.create()
    kept = old(lake, b"k" * 10, "kept")
    lake.append([kept])
    orphan = old(lake, b"o" * 10, "orphan")
    plan, checkpoint = tmp_path / "p", tmp_path / "p.apply.json"
    assert lake.gc("--plan", str(plan), "--safety-age-secs", str(HOUR_S))[1]["candidates"] == 1

    def apply() -> tuple[int, dict[str, object]]:
        return lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))

    # A candidate page edited to name a referenced object.
    (page,) = (plan / "pages").iterdir()
    original = page.read_bytes()
    page.write_bytes(original.replace(orphan.uri.encode(), kept.uri.encode()))
    code, reply = apply()
    assert (code, reply["error"]) == (2, "DataCorrupted"), reply
    page.write_bytes(original)

    # The manifest edited (a shorter safety age claimed, say).
    manifest_path = plan / "manifest.json"
    manifest = manifest_path.read_bytes()
    raw = json.loads(manifest)
    raw["manifest"]["safety_age_secs"] = 1
    manifest_path.write_text(json.dumps(raw))
    with pytest.raises(DataCorrupted, match="does not match its hash"):
        lake.apply(plan, checkpoint)
    manifest_path.write_bytes(manifest)

    # A checkpoint edited to skip work, and one from another plan.
    checkpoint.write_text(
        json.dumps(
            {
                "checkpoint": {
                    "schema_version": 1,
                    "plan_id": "0" * 64,
                    "pages_done": 0,
                    "deleted": 0,
                    "absent": 0,
                },
                "sha256": "0" * 64,
            }
        )
    )
    with pytest.raises(DataCorrupted, match="checkpoint"):
        lake.apply(plan, checkpoint)
    # A well-formed checkpoint of another plan.
    other = lake.plan(tmp_path / "other", HOUR_S)
    Checkpoint(plan_id=other.plan_id, pages_done=0, deleted=0, absent=0).write(checkpoint)
    with pytest.raises(FailedPrecondition, match="belongs to plan"):
        lake.apply(plan, checkpoint)
    assert path_of(orphan).exists()
    assert path_of(kept).exists()

    # A plan binds its stage: another stage's GC refuses it.
    elsewhere = GcTarget.from_env(
        lake.data, {**os.environ, MANAGED_OBJECT_ROOT: str(tmp_path / "elsewhere")}
    )
    with pytest.raises(FailedPrecondition, match="is for stage"):
        apply_plan(
            load_plan(plan),
            tmp_path / "elsewhere.apply.json",
            roots=elsewhere.roots,
            sidecars=elsewhere.sidecars,
            stage=elsewhere.stage,
        )

    # A plan directory is never reused.
    with pytest.raises(FailedPrecondition, match="not empty"):
        lake.plan(plan, HOUR_S)

    # Untampered, it applies.
    checkpoint.unlink()
    code, reply = apply()
    assert (code, reply["deleted"]) == (0, 1), reply
    assert not path_of(orphan).exists()
    assert lake.verify(kept) == b"k" * 10


def test_output_json_is_the_same_document_as_json(local_lake: Lake, tmp_path: Path) -> None:
    """``--output json`` (every lake command's spelling) prints what ``--json`` prints."""
    local_lake.create()
    command = [sys.executable, "-c", "from lake_core.cli import main; main()"]
    base = ["--data-dir", str(local_lake.data), "gc", "--safety-age-secs", "3600"]
    replies = []
    for flag, name in (("--json", "a"), ("--output=json", "b")):
        done = subprocess.run(
            [*command, *base, "--plan", str(tmp_path / name), flag],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        reply = json.loads(done.stdout)
        replies.append({k: v for k, v in reply.items() if "plan" not in k})
    assert replies[0] == replies[1]


def test_a_safety_age_shorter_than_the_append_retention_is_warned_of(
    local_lake: Lake, tmp_path: Path
) -> None:
    # A pending append may be resumed until Metasrv forgets its operation id
    # (7 days by default), and it references objects uploaded before: with a
    # shorter safety age GC may delete them first, and the resumed row would
    # name a deleted object. Planning says so, on stderr and in the JSON reply.
    local_lake.create()
    command = [sys.executable, "-c", "from lake_core.cli import main; main()"]
    base = ["--data-dir", str(local_lake.data), "gc", "--safety-age-secs", str(HOUR_S)]
    env = {**os.environ, **local_lake.env}
    env.pop("LAKE_APPEND_OPERATION_RETENTION_SECS", None)
    done = subprocess.run(
        [*command, *base, "--plan", str(tmp_path / "a"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    (warning,) = json.loads(done.stdout)["warnings"]
    assert "LAKE_APPEND_OPERATION_RETENTION_SECS (604800 s)" in warning
    assert f"warning: {warning}" in done.stderr
    # A safety age covering the retention (here shortened to an hour) plans quietly.
    done = subprocess.run(
        [*command, *base, "--plan", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "LAKE_APPEND_OPERATION_RETENTION_SECS": str(HOUR_S)},
    )
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    # A malformed retention is the operator's configuration error, before any plan.
    code, reply = local_lake.gc(
        "--plan",
        str(tmp_path / "c"),
        "--safety-age-secs",
        str(HOUR_S),
        env={"LAKE_APPEND_OPERATION_RETENTION_SECS": "a week"},
    )
    assert code != 0, reply
    assert "LAKE_APPEND_OPERATION_RETENTION_SECS" in reply["message"], reply
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("content", [b"not a database " * 100, b""])
def test_a_registry_file_that_is_no_lake_registry_is_the_callers_mistake(
    tmp_path: Path, content: bytes
) -> None:
    # Not "Unavailable, retry": retrying never helps a --data-dir of the wrong thing.
    data = tmp_path / "data"
    data.mkdir()
    (data / "registry.sqlite3").write_bytes(content)
    code, reply = run_gc(data, "--plan", str(tmp_path / "p"), "--safety-age-secs", "60")
    assert (code, reply["error"], reply["retryable"]) == (2, "FailedPrecondition", False), reply
    assert "is not a Lake registry" in reply["message"]
    assert not (tmp_path / "p").exists()


def test_planning_again_after_a_planner_was_killed_clears_its_debris(
    local_lake: Lake, tmp_path: Path
) -> None:
    # What `lake gc --plan` SIGKILLed before publishing leaves (no manifest):
    # its sort work dir, a page, a page's temporary file. The same command again
    # plans; it used to refuse ("not empty: a plan is immutable") though no plan exists.
    lake = local_lake
    lake.create()
    orphan = old(lake, b"o" * 10, "orphan")
    plan = tmp_path / "p"
    (plan / ".work-k1ll3d" / "run").mkdir(parents=True)
    (plan / "pages").mkdir()
    (plan / "pages" / f"{'a' * 64}.txt").write_text("half a page")
    (plan / "pages" / f".{'b' * 64}.txt.4242.tmp").write_text("half")
    code, reply = lake.gc("--plan", str(plan), "--safety-age-secs", str(HOUR_S))
    assert (code, reply["candidates"]) == (0, 1), reply
    assert sorted(p.name for p in plan.iterdir()) == ["manifest.json", "pages"]
    assert len(list((plan / "pages").iterdir())) == 1
    assert path_of(orphan).exists()
    # Anything else in the directory is not ours to clear: still refused.
    (plan / "notes.txt").write_text("mine")
    (plan / "manifest.json").unlink()
    code, reply = lake.gc("--plan", str(plan), "--safety-age-secs", str(HOUR_S))
    assert (code, reply["error"]) == (2, "FailedPrecondition"), reply
    assert (plan / "notes.txt").read_text() == "mine"


def test_a_foreign_tree_below_the_objects_directory_is_not_walked(
    local_lake: Lake, tmp_path: Path
) -> None:
    # Only tenants/<tenant>/objects/<name> can be a candidate, so GC need not
    # walk deeper. A foreign tree there deeper than PATH_MAX used to crash
    # planning with an untyped OSError (ENAMETOOLONG) from scandir.
    lake = local_lake
    lake.create()
    orphan = old(lake, b"o" * 10, "orphan")
    fd = os.open(path_of(orphan).parent, os.O_RDONLY)
    try:
        for _ in range(24):  # 24 x 201 bytes: past PATH_MAX (4096)
            os.mkdir("d" * 200, dir_fd=fd)
            deeper = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.close(os.open("foreign.bin", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    code, reply = lake.gc("--plan", str(tmp_path / "p"), "--safety-age-secs", str(HOUR_S))
    assert (code, reply["candidates"]) == (0, 1), reply
