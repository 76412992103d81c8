"""The distributed runtime knows no mechanism: nothing in workbench.distributed imports one, and the mechanisms'
runtimes are built on it."""
import ast
from pathlib import Path

import workbench.distributed as distributed

MECHANISMS = ("workbench.partition", "workbench.earlyexit", "workbench.elastic", "workbench.kvcache",
              "workbench.hepti", "workbench.ui", "workbench.viz")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_module_of_the_distributed_runtime_imports_a_mechanism():
    files = sorted(Path(distributed.__file__).parent.glob("*.py"))
    assert {f.stem for f in files} >= {"cpulimit", "ranks", "shaping", "wire", "worker", "execute", "steps", "shares"}
    for path in files:
        bad = [m for m in imported_modules(path) if m.startswith(MECHANISMS)]
        assert not bad, f"{path.name} imports {bad}"


def test_the_partition_runtime_is_a_rank_group():
    from workbench.distributed.ranks import RankGroup, RunFailed
    from workbench.partition import runtime

    assert issubclass(runtime.PartitionRuntime, RankGroup) and runtime.RunFailed is RunFailed
    group = runtime.PartitionRuntime(2)
    assert group.worker == "workbench.partition.worker" and group.group is None      # nothing started yet


def test_hepti_runs_on_a_rank_group_of_its_own_workers():
    from workbench.distributed.ranks import RankGroup
    from workbench.distributed.worker import Runner
    from workbench.hepti import worker
    from workbench.hepti.run import HeptiGroup

    group = HeptiGroup(3)
    assert isinstance(group, RankGroup) and group.worker == "workbench.hepti.worker" and group.group is None
    assert issubclass(worker.HeptiRunner, Runner)
