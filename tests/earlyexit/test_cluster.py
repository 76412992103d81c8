"""Ray across machines, with the README's commands: two network namespaces of this host stand for two machines
(a veth pair, private addresses only inside them, no default route, the hostname resolving to 127.0.0.1 as on
Debian), each machine with a token left by an earlier local run (different ones). The head holds the GPU type
v100, the worker p100; a 2-split plan of those types is served from the head, and every replica must have run
on the node of its type, the outputs must equal the one-process model, and no Serve controller may outlive the
run, nor any raylet the teardown. Needs root and `ip`; skipped otherwise."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
IP = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin")
THRESHOLD = 0.6905
N, T = 16, 24
STEP_S = 240          # any one command or wait; the whole test ends by itself within a few of these

pytestmark = [
    pytest.mark.alone,                 # serves to deadlines on Ray: run with no other test beside it
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                       reason="network namespaces need root"),
    pytest.mark.skipif(IP is None, reason="no `ip` command (iproute2) to make network namespaces"),
]


def readme_commands() -> dict[str, str]:
    """The README's cluster commands: the token, the head's and every other machine's `ray start`."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("The same serving runs on a Ray cluster"):]
    block = block[block.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    found = {}
    for line in block.splitlines():
        line = line.split("  #")[0].strip()
        if line.startswith("#") or not line:
            continue
        for key, needle in (("token", "ray get-auth-token"), ("head", "ray start --head"),
                            ("worker", "ray start --address="), ("serve", "earlyexit serve --address")):
            if needle in line:
                found[key] = line
    assert set(found) == {"token", "head", "worker", "serve"}, f"README cluster block lacks commands: {found}"
    return found


def with_resources(command: str, resources: dict) -> str:
    """The README's command with this test's GPU-type resources instead of its example's."""
    out, n = re.subn(r"--resources='[^']*'", f"--resources='{json.dumps(resources)}'", command)
    assert n == 1, command
    return out


class Machines:
    """Two network namespaces joined by a veth pair, with private addresses only inside them."""

    def __init__(self):
        tag = uuid.uuid4().hex[:5]
        self.ns = (f"e3a{tag}", f"e3b{tag}")
        self.veth = (f"e3a{tag}v", f"e3b{tag}v")
        net = 16 + int(tag, 16) % 200
        self.ip = (f"10.{net}.77.1", f"10.{net}.77.2")

    def up(self) -> None:
        run = [IP, "netns", "add", self.ns[0]], [IP, "netns", "add", self.ns[1]], \
            [IP, "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1]]
        for cmd in run:
            subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        for ns, veth, ip in zip(self.ns, self.veth, self.ip):
            for cmd in ([IP, "link", "set", veth, "netns", ns],
                        [IP, "-n", ns, "addr", "add", f"{ip}/24", "dev", veth],
                        [IP, "-n", ns, "link", "set", veth, "up"],
                        [IP, "-n", ns, "link", "set", "lo", "up"]):
                subprocess.run(cmd, check=True, capture_output=True, timeout=30)

    def down(self) -> None:
        for ns in self.ns:
            subprocess.run([IP, "netns", "delete", ns], capture_output=True, timeout=30)
        subprocess.run([IP, "link", "delete", self.veth[0]], capture_output=True, timeout=30)

    def exists(self) -> bool:
        listed = subprocess.run([IP, "netns", "list"], capture_output=True, text=True, timeout=30).stdout
        return any(ns in listed for ns in self.ns)


def in_ns(ns: str, command: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([IP, "netns", "exec", ns, "bash", "-c", command], env=env, capture_output=True,
                          text=True, timeout=STEP_S, **kw)


def ray_processes(marker: str) -> list[int]:
    """Pids of processes whose command line mentions ``marker`` (this test's temp dirs)."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                pids.append(proc.info["pid"])
        except psutil.Error:
            continue
    return pids


def stop(procs: list[subprocess.Popen], marker: str) -> None:
    """End the nodes this test started: SIGTERM to each `ray start --block` group, then SIGKILL to whatever
    of theirs is left (found by this test's temp dir, never by name)."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    limit = time.time() + 10
    while time.time() < limit and ray_processes(marker):
        time.sleep(0.5)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in ray_processes(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


WAIT_FOR_HEAD = textwrap.dedent('''
    import socket, sys, time
    limit = time.time() + %d
    while True:
        try:
            socket.create_connection((sys.argv[1], 6379), 1).close()
            break
        except OSError:
            if time.time() > limit:
                raise SystemExit("the head never listened")
            time.sleep(1)
''' % STEP_S)

DRIVER = textwrap.dedent('''
    import json, sys, time
    from types import SimpleNamespace
    import torch
    from workbench.earlyexit.raycluster import check_head
    from workbench.earlyexit.serve import ModelSpec, Workload, serve_plan

    address, data, out = sys.argv[1], sys.argv[2], sys.argv[3]
    limit = time.time() + 90
    while len(check_head(address)) < 2:          # the worker has joined
        if time.time() > limit:
            raise SystemExit("the worker node never joined")
        time.sleep(1)
    tokens = torch.load(data)
    work = Workload(tokens["ids"], tokens["mask"], tokens["arrival_s"].numpy())
    plan = SimpleNamespace(splits=[(0, 3), (3, 6)], replicas=[2, 1], batch_sizes=[4, 4], gpu_types=["v100", "p100"])
    run = serve_plan(ModelSpec.untrained(num_classes=2, seed=0, threshold=%r), plan, work, slo_s=30.0,
                     batch_wait_s=0.5, address=address)
    spans = [(s.meta["split"], s.meta["replica"], s.meta["ip"], s.meta["node"]) for s in run.timeline.of_kind("compute")]
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    nodes = {n["NodeID"]: [n["NodeManagerAddress"], n["Resources"]] for n in ray.nodes() if n["Alive"]}
    ray.shutdown()
    json.dump({"exit_layers": run.exit_layers.tolist(), "labels": run.labels.tolist(),
               "logits": run.logits.tolist(), "dropped": run.dropped, "spans": spans, "nodes": nodes,
               "controller_left": SERVE_CONTROLLER_NAME in actors, "actors": actors}, open(out, "w"))
''' % THRESHOLD)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The README's commands on two namespaces: yields (machines, env of the head machine, run dir, nodes)."""
    tmp = tmp_path_factory.mktemp("cluster")
    short = Path(f"/tmp/e3c{uuid.uuid4().hex[:6]}")       # Ray's socket paths must stay short
    short.mkdir()
    machines = Machines()
    try:
        machines.up()
    except (subprocess.CalledProcessError, OSError) as err:
        machines.down()
        pytest.skip(f"cannot make network namespaces here: {getattr(err, 'stderr', b'') or err}")
    commands = readme_commands()
    homes = (tmp / "head-home", tmp / "worker-home")
    for home in homes:                      # each machine keeps a token from an earlier local run
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    from workbench.cache import cache_dir

    base.update(PATH=f"{BIN}:{base.get('PATH', '')}", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO),
                WORKBENCH_CACHE=str(cache_dir(create=False)))          # the prepared models, whatever HOME says
    env_a, env_b = dict(base, HOME=str(homes[0])), dict(base, HOME=str(homes[1]))
    head, procs = machines.ip[0], []
    try:
        got = in_ns(machines.ns[0], commands["token"], env_a)
        assert got.returncode == 0, got.stderr
        token = got.stdout.strip().splitlines()[-1]
        assert token == (homes[0] / ".ray" / "auth_token").read_text().strip(), "the head reuses the token it has"
        extra = f" --block --num-cpus=1 --include-dashboard=false --temp-dir={short}/a"
        cmd = with_resources(commands["head"], {"gpu_type_v100": 2, "gpu_type_host": 1}).replace("HEAD", head) + extra
        procs.append(subprocess.Popen([IP, "netns", "exec", machines.ns[0], "bash", "-c", cmd], env=env_a,
                                      stdout=open(tmp / "head.log", "w"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        (tmp / "wait.py").write_text(WAIT_FOR_HEAD)
        waited = in_ns(machines.ns[0], f"{sys.executable} {tmp / 'wait.py'} {head}", env_a)
        assert waited.returncode == 0, (tmp / "head.log").read_text()[-3000:]
        cmd = with_resources(commands["worker"], {"gpu_type_p100": 1, "gpu_type_host": 1}).replace("HEAD", head)
        cmd = cmd.replace("RAY_AUTH_TOKEN=TOKEN", f"RAY_AUTH_TOKEN={token}")
        cmd += f" --block --num-cpus=1 --temp-dir={short}/b"
        procs.append(subprocess.Popen([IP, "netns", "exec", machines.ns[1], "bash", "-c", cmd], env=env_b,
                                      stdout=open(tmp / "worker.log", "w"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        yield machines, env_a, env_b, tmp, commands
    finally:
        stop(procs, str(short))
        left = ray_processes(str(short))
        machines.down()
        shutil.rmtree(short, ignore_errors=True)
        assert not left, f"Ray processes left after the teardown: {left}"
        assert not machines.exists(), "the test's network namespaces were not removed"


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, T + 1, (N,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1000, 30522, (N, T), generator=g) * mask
    return ids, mask


@pytest.mark.integration
def test_two_machines_serve_a_two_type_plan_from_the_readme(cluster, tokens, tmp_path):
    from workbench.earlyexit.serve import ModelSpec

    machines, env_a, env_b, tmp, _ = cluster
    ids, mask = tokens
    data = tmp_path / "tokens.pt"
    torch.save({"ids": ids, "mask": mask, "arrival_s": torch.arange(N, dtype=torch.float64) * 0.05}, data)
    (tmp_path / "driver.py").write_text(DRIVER)
    got = in_ns(machines.ns[0], f"{sys.executable} {tmp_path / 'driver.py'} {machines.ip[0]}:6379 {data} "
                                f"{tmp_path / 'out.json'}", env_a)
    assert got.returncode == 0, got.stderr[-3000:] + (tmp / "head.log").read_text()[-2000:] \
        + (tmp / "worker.log").read_text()[-2000:]
    out = json.loads((tmp_path / "out.json").read_text())

    reference = ModelSpec.untrained(num_classes=2, seed=0, threshold=THRESHOLD).build()(ids, mask)
    assert out["dropped"] == 0
    np.testing.assert_array_equal(out["exit_layers"], reference.exit_layers)
    np.testing.assert_array_equal(out["labels"], reference.labels)
    torch.testing.assert_close(torch.tensor(out["logits"]), reference.logits, atol=1e-4, rtol=0)
    assert int((np.asarray(reference.exit_layers) >= 3).sum()) > 0, "some requests must reach the second split"

    nodes = out["nodes"]
    assert len(nodes) == 2
    by_ip = {ip: res for ip, res in nodes.values()}
    assert by_ip[machines.ip[0]].get("gpu_type_v100") == 2 and by_ip[machines.ip[1]].get("gpu_type_p100") == 1
    placed = {(split, replica): ip for split, replica, ip, _ in out["spans"]}
    assert {ip for (split, _), ip in placed.items() if split == 0} == {machines.ip[0]}, placed
    assert {ip for (split, _), ip in placed.items() if split == 1} == {machines.ip[1]}, placed
    assert {(s, r) for s, r in placed} == {(0, 0), (0, 1), (1, 0)}, "every replica of the plan served"
    assert not out["controller_left"], f"a Serve controller outlived the run: {out['actors']}"


@pytest.mark.integration
def test_a_refused_token_is_named_in_one_line(cluster):
    """The worker machine's own stale token, without the head's: the CLI says so, in one line, before any model
    is loaded."""
    machines, env_a, env_b, tmp, commands = cluster
    command = commands["serve"].replace("HEAD", machines.ip[0]) + " --preset quick --requests 4"
    got = in_ns(machines.ns[1], command, env_b)
    errors = [line for line in (got.stdout + got.stderr).splitlines() if "error" in line.lower()]
    assert got.returncode == 2, got.stdout + got.stderr
    assert len(errors) == 1 and "Ray authentication failed" in errors[0] and "RAY_AUTH_TOKEN" in errors[0], \
        got.stdout + got.stderr


@pytest.mark.integration
def test_the_readme_serve_command_runs_on_the_cluster(cluster, prepared):
    """`workbench earlyexit serve --address HEAD:6379` as the README writes it (fewer replicas and requests): the
    trained model's plan for CPU replicas, one on each machine (each holds one unit of gpu_type_host), served,
    simulated and equal to the model run in one process."""
    machines, env_a, env_b, tmp, commands = cluster
    command = commands["serve"].replace("HEAD", machines.ip[0]) + " --replicas 2 --requests 8 --rate 8 --preset quick"
    got = in_ns(machines.ns[0], command, env_a)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "outputs equal the model run in one process" in got.stdout, got.stdout
