"""A job's own output log (elasticps.runtime.output): bounded, followed by
offset, told what was dropped; a process's streams teed into tagged lines."""

from __future__ import annotations

import sys

from elasticps.runtime.output import JobLog, _Lines, _Tee


def test_the_log_keeps_the_newest_output_within_its_bound_and_says_what_it_dropped(tmp_path):
    log = JobLog(tmp_path / "out", max_bytes=4096)
    lines = [f"[worker-{i % 3}] line {i:05d} " + "x" * 40 for i in range(1000)]  # ~60 KB in all
    for i in range(0, 1000, 10):
        log.write(lines[i : i + 10])
    kept = sum(p.stat().st_size for p in (tmp_path / "out").iterdir())
    assert 2048 < kept <= 4096 + 2 * 10 * 63  # two files, each at most half the bound and one write
    text, end, dropped = log.read(0)
    assert dropped > 0 and text.splitlines()[-1] == lines[-1]
    assert end == sum(len(line) + 1 for line in lines)  # offsets count every byte ever written
    assert text.splitlines() == lines[-len(text.splitlines()) :]  # whole lines, in order, nothing skipped
    assert log.read(end) == ("", end, 0)  # a follower at the end reads nothing new
    log.write(["[driver] done"])
    assert log.read(end) == ("[driver] done\n", end + 14, 0)
    assert oct((tmp_path / "out").stat().st_mode & 0o777) == "0o700"


def test_a_processes_streams_become_tagged_lines_and_still_reach_the_original(capsys):
    got: list[str] = []
    lines = _Lines("worker-1", got.extend, every_s=None)
    tee = _Tee(sys.stdout, lines, "stdout")
    tee.write("half a ")
    assert got == []  # a line is sent once it is whole
    tee.write("line\nand two\nmore\n")
    assert got == ["[worker-1] half a line", "[worker-1] and two", "[worker-1] more"]
    assert capsys.readouterr().out == "half a line\nand two\nmore\n"


def test_a_tasks_last_lines_reach_the_driver_before_it_is_stopped_or_its_job_ends(ray_local):
    import ray

    from elasticps.runtime import tasks
    from elasticps.runtime.output import TaskOutput

    @ray.remote(num_cpus=0)
    class Driver:  # what a job's driver does with its tasks' lines: keeps them
        def __init__(self) -> None:
            self.lines: list[str] = []

        def write_output(self, lines: list[str]) -> None:
            self.lines += lines

        def kept(self) -> list[str]:
            return self.lines

    class Task:
        def say(self, text: str) -> None:
            print(text)

        def close(self) -> None:
            pass

    driver = Driver.remote()
    teed = ray.remote(num_cpus=0)(tasks._with_output(Task))
    ended, stopped = (teed.remote(output=TaskOutput(driver, name)) for name in ("worker-0", "worker-1"))
    ray.get([ended.say.remote("Test set: Average loss 0.1"), stopped.say.remote("last words")])
    tasks.flush_output([ended])  # the job is about to be reported ended
    assert "[worker-0] Test set: Average loss 0.1" in ray.get(driver.kept.remote())
    tasks.retire([stopped])  # closed, then killed: its line is sent first
    assert "[worker-1] last words" in ray.get(driver.kept.remote())
    tasks.kill(ended)


def test_a_jobs_folders_are_its_owners_alone_under_a_clusters_umask_too(tmp_path):
    """A driver on a Ray cluster the manager did not start runs under that
    cluster's umask (022): the job's folder, made as the parent of its output or
    checkpoints, is 0700 all the same, as is every folder made on the way."""
    import os

    from elasticps.runtime.checkpoint import CheckpointStore

    old = os.umask(0o022)
    try:
        JobLog(tmp_path / "jobs.d" / "a" / "output").write(["[driver] hello"])
        CheckpointStore(tmp_path / "jobs.d" / "b" / "checkpoints")
    finally:
        os.umask(old)
    from elasticps.private_dir import private_dir

    (tmp_path / "open").mkdir(mode=0o755)
    private_dir(tmp_path / "open" / "x" / ".." / "y")  # makes open/y alone, and leaves open as it was
    assert oct((tmp_path / "open").stat().st_mode & 0o777) == "0o755"
    assert sorted(p.name for p in (tmp_path / "open").iterdir()) == ["y"]
    made = [tmp_path / "jobs.d", *(tmp_path / "jobs.d" / n for n in ("a", "a/output", "b", "b/checkpoints"))]
    made.append(tmp_path / "open" / "y")
    assert {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in made} == {
        str(p.relative_to(tmp_path)): "0o700" for p in made
    }
