"""The worker runtime: ranks and logs, readiness, a failed worker reported, Cancel, and nothing left behind."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workbench.workers import NotReady, WorkerFailed, WorkerGroup

DEAF = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
"""Makes a worker ignore SIGTERM, so only SIGKILL after the grace period ends it."""


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_gone(pids, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.mark.integration
def test_every_worker_sees_its_rank_and_the_rendezvous_and_its_clock_offset_is_measured(tmp_path):
    code = ("import os, time\nfrom workbench.workers import ready\n"
            "ready(clock=lambda: time.perf_counter() + 100.0 * int(os.environ['RANK']))\n"
            "print(*(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')))\n")
    with WorkerGroup(python(code), 3, name="env", logs=tmp_path, ready="signal") as group:
        assert group.wait(timeout=30)
    assert [e.returncode for e in group.exits] == [0, 0, 0]
    seen = [(tmp_path / f"env-{rank}.log").read_text().split() for rank in range(3)]
    assert [s[:4] for s in seen] == [[str(r), "3", str(r), "127.0.0.1"] for r in range(3)]
    assert len({s[4] for s in seen}) == 1 and int(seen[0][4]) > 0
    assert len(group.clock_offsets_s) == 3                 # rank r's clock runs 100 r s ahead of the parent's
    assert all(abs(offset + 100.0 * r) < 0.05 for r, offset in enumerate(group.clock_offsets_s))


@pytest.mark.parametrize("death, why", [("sys.exit(3)", "exited with status 3"),
                                         ("os.kill(os.getpid(), signal.SIGKILL)", "was killed by SIGKILL")])
@pytest.mark.integration
def test_a_worker_that_dies_is_named_with_why_and_its_log(death, why):
    code = ("import os, signal, sys, time\nfrom workbench.workers import ready\nready()\n"
            "if os.environ['RANK'] == '1':\n    print('rank one gives up here', flush=True)\n"
            f"    {death}\ntime.sleep(60)\n")
    with WorkerGroup(python(code), 3, name="dying", ready="signal", grace_s=2) as group:
        with pytest.raises(WorkerFailed) as failed:
            group.wait(timeout=30)
        pids = [w.pid for w in group.workers]
    message = str(failed.value)
    assert message.startswith(f"dying rank 1 of 3 (pid {pids[1]}) {why}")
    assert "rank one gives up here" in message
    exits = failed.value.exits
    assert exits[1].failed and not exits[0].failed and exits[0].stopped and exits[2].stopped
    assert wait_gone(pids, 1) == []


@pytest.mark.integration
def test_a_worker_that_dies_before_it_is_ready_is_named():
    code = "import os, sys\nif os.environ['RANK'] == '2':\n    sys.exit('no model here')\nimport time; time.sleep(60)\n"
    with pytest.raises(WorkerFailed, match=r"(?s)early rank 2 of 3 .* exited with status 1 before it was ready.*"
                                           r"no model here"):
        with WorkerGroup(python(code), 3, name="early", ready="signal", ready_timeout_s=30):
            pass


@pytest.mark.integration
def test_ready_timeout_names_the_rank_that_was_not_ready():
    code = ("import os, time\nfrom workbench.workers import ready\n"
            "if os.environ['RANK'] == '2':\n    print('stuck loading', flush=True)\n    time.sleep(60)\n"
            "ready()\ntime.sleep(60)\n")
    group = WorkerGroup(python(code), 3, name="slow", ready="signal", ready_timeout_s=2, grace_s=1)
    t0 = time.monotonic()
    with pytest.raises(NotReady) as late:
        group.start()
    assert time.monotonic() - t0 < 6
    assert late.value.ranks == [2]
    assert "slow: rank 2 of 3 not ready within 2 s" in str(late.value) and "stuck loading" in str(late.value)
    assert wait_gone([w.pid for w in group.workers], 1) == []


@pytest.mark.integration
def test_a_ready_line_in_the_log_and_a_check_of_the_callers_both_wait():
    code = "import time\ntime.sleep(0.5)\nprint('serving on somewhere', flush=True)\ntime.sleep(60)\n"
    t0 = time.monotonic()
    with WorkerGroup(python(code), 2, ready=r"^serving on ") as group:
        assert time.monotonic() - t0 >= 0.5 and group.poll() == [None, None]
    flag = threading.Event()
    threading.Timer(0.5, flag.set).start()
    with WorkerGroup(python("import time; time.sleep(60)"), ready=lambda worker: flag.is_set()) as group:
        assert flag.is_set()
    assert group.exits[0].stopped and group.exits[0].returncode == -signal.SIGTERM


@pytest.mark.integration
def test_cancel_from_a_page_ends_the_run_within_two_seconds():
    from workbench.ui.base import BackgroundRun, Panel

    pids, ended = [], {}

    def work(handle):
        with WorkerGroup(python(DEAF + "import time\nfrom workbench.workers import ready\nready()\ntime.sleep(60)"),
                         2, name="cancelled", ready="signal", grace_s=30, should_stop=handle.should_stop) as group:
            pids.extend(w.pid for w in group.workers)
            threading.Timer(0.3, run.cancel).start()
            t0 = time.monotonic()
            group.wait()
            ended["after_s"] = time.monotonic() - t0
        return group

    run = BackgroundRun(Panel(), "Run", work, lambda group, cancelled: ended.update(group=group, cancelled=cancelled))
    run.start()
    assert ended["cancelled"] and ended["group"].cancelled
    assert ended["after_s"] < 2.0 + 0.3
    assert [e.stopped for e in ended["group"].exits] == [True, True]
    assert [p for p in pids if alive(p)] == []


@pytest.mark.integration
def test_cancel_from_another_thread_stops_workers_the_owner_is_not_waiting_for():
    group = WorkerGroup(python(DEAF + "import time\nfrom workbench.workers import ready\nready()\ntime.sleep(60)"), 2,
                        name="busy", ready="signal", grace_s=30)
    with group:
        pids = [w.pid for w in group.workers]
        t0 = time.monotonic()
        threading.Thread(target=group.cancel).start()
        assert wait_gone(pids, 2.0) == [], "cancel left workers running"
        assert time.monotonic() - t0 < 2.0


PARENT = """
import sys, time
from workbench.workers import WorkerGroup
deaf = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
child = "import subprocess, time; print(subprocess.Popen(['sleep', '60']).pid, flush=True); time.sleep(60)"
group = WorkerGroup(lambda r: [sys.executable, '-c', (deaf if r == 0 else '') + child], 2, name='orphan',
                    logs=sys.argv[1], ready=r'^\\d+$', grace_s=1.0)
group.start()
print(*(w.pid for w in group.workers), flush=True)
time.sleep(60)
"""


@pytest.mark.integration
def test_sigkill_of_the_parent_leaves_no_worker_alive(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    workers, grandchildren = [], []
    try:
        workers = [int(p) for p in parent.stdout.readline().split()]
        assert len(workers) == 2, "the parent did not start its workers"
        grandchildren = [int((tmp_path / f"orphan-{r}.log").read_text().split()[0]) for r in range(2)]
        assert all(alive(p) for p in workers + grandchildren)
        parent.kill()
        parent.wait()
        assert wait_gone(workers + grandchildren, 5.0) == [], "processes outlived their parent's SIGKILL"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in [p for p in workers + grandchildren if alive(p)]:
            os.kill(pid, signal.SIGKILL)
