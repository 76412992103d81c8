"""CPU limits: the quota arithmetic, the files each cgroup interface is given, and (as root, on this machine's
controller) a process under a calibrated quota computing at its target speed."""
import os
import statistics
import subprocess
import sys

import pytest

from workbench.distributed import cpulimit as cl
from workbench.errors import WorkbenchError

pytestmark = pytest.mark.alone         # times work under CPU limits: run with no other test beside it


def test_quota_and_period_for_a_share():
    """A sixth of a core is 1 ms of every 6 ms; below that the 1 ms minimum quota lengthens the period."""
    assert cl.quota_for(1 / 6) == (1000, 6000)
    assert cl.quota_for(0.5) == (3000, 6000)
    assert cl.quota_for(1.5) == (9000, 6000)
    assert cl.quota_for(0.05) == (1000, 20000)
    assert cl.quota_for(cl.MIN_SHARE) == (1000, 1_000_000)
    for bad in (0, -0.5, cl.MIN_SHARE / 2, float("nan"), float("inf"), "half"):
        with pytest.raises(WorkbenchError, match="fraction of a core >= 0.001"):
            cl.quota_for(bad)


def fake_v2(tmp_path, enabled="cpu io"):
    (tmp_path / "cgroup.controllers").write_text("cpu io memory\n")
    (tmp_path / "cgroup.subtree_control").write_text(enabled + "\n")
    (tmp_path / "cgroup.procs").write_text("")
    return cl.Controller(2, tmp_path)


def test_v2_gets_cpu_max_and_its_group_is_removed(tmp_path):
    c = fake_v2(tmp_path)
    assert cl.find_controller(v1=tmp_path / "none", v2=tmp_path) == c and cl.limit_problem(c) is None
    group = cl.CpuGroup(0.25, controller=c)
    assert group.path.parent == tmp_path and group.path.name.startswith(f"workbench-{os.getpid()}-")
    assert (group.path / "cpu.max").read_text() == "1500 6000" and group.limits() == (1500, 6000)
    group.unlimit()
    assert group.limits() == (-1, 6000)
    (group.path / "cpu.max").unlink()            # a real group's files go with it; the fake's must go first
    group.close()
    assert not group.path.exists()


def test_without_the_controller_or_its_children_enabled_it_says_why(tmp_path):
    assert "not enabled" in cl.limit_problem(fake_v2(tmp_path, enabled="io"))
    assert cl.find_controller(v1=tmp_path / "a", v2=tmp_path / "b") is None
    with pytest.raises(WorkbenchError, match="cannot limit CPU: .*not enabled"):
        cl.CpuGroup(controller=fake_v2(tmp_path, enabled="io"))


@pytest.mark.integration
def test_groups_left_by_dead_processes_are_swept(tmp_path):
    c = fake_v2(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale, mine, other = (tmp_path / f"workbench-{int(dead.stdout)}-0", tmp_path / f"workbench-{os.getpid()}-99",
                          tmp_path / "someone-else")
    for path in (stale, mine, other):
        path.mkdir()
    assert cl.sweep(c) == [stale.name]
    assert not stale.exists() and mine.exists() and other.exists()


def real_controller():
    problem = cl.limit_problem()
    if problem:
        pytest.skip(f"CPU limits are not available here: {problem}")
    return cl.find_controller()


@pytest.mark.slow
@pytest.mark.integration
def test_a_process_under_a_calibrated_quota_computes_at_its_target_speed():
    """The group is calibrated to a sixth of what the probe computes unlimited (a device at a sixth of a core);
    then a fresh process, put in the group afterwards as a rank would be, computes within the tolerance (15 %)
    of the target. This 2-vCPU VM's own speed drifts by up to a quarter between half-seconds under the full
    suite, so a miss is followed by a recalibration (which starts from the share found) and a new fresh process,
    three attempts at most: a limit that really holds passes at the first or second, while a share left
    unlimited, taken from the unlimited speed the wrong way, or off by the period (1 ms of 6) misses all three."""
    c = real_controller()
    errors = []
    with cl.CpuGroup() as group, cl.Probe() as probe:
        group.add(probe.pid)
        probe.measure(0.1)
        free = statistics.median(probe.measure() for _ in range(cl.MEASURES))
        target = free / 6
        for _ in range(3):
            calibration = cl.calibrate(group, target, probe=probe)
            assert calibration.share is not None and calibration.share < 0.5
            quota, period = group.limits()
            assert quota / period == pytest.approx(calibration.share)
            assert probe.pid not in group.pids()                    # the probe went back to the root
            with cl.Probe() as rank:
                group.add(rank.pid)
                assert rank.pid in group.pids()
                rank.measure(0.1)                                   # its first products warm up
                got = statistics.median(rank.measure() for _ in range(cl.MEASURES))   # as the calibration does
            errors.append(got / target - 1)
            assert got <= free / 3, (got, target, free, calibration)
            if abs(errors[-1]) <= cl.TOLERANCE:
                break
        assert abs(errors[-1]) <= cl.TOLERANCE, (errors, target, free)
        path = group.path
    assert not path.exists() and not [p for p in c.root.glob(f"workbench-{os.getpid()}-*")]


@pytest.mark.slow
@pytest.mark.integration
def test_a_device_faster_than_this_host_stays_unlimited():
    real_controller()
    with cl.CpuGroup() as group:
        calibration = cl.calibrate(group, 1e6, seconds=0.1)
        assert calibration.share is None and group.limits()[0] == -1
        assert "not below this host's" in calibration.describe()
