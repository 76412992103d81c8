"""PyTorch's own tensor parallelism over the encoder layer, in real gloo processes: the plain layer's output on every
rank, two all-reduces of B*T*d*4 bytes per layer and their ring bytes, and bad sizes refused before any collective."""
import json
import sys
from pathlib import Path

import pytest

from workbench.workers import WorkerGroup

REPO = Path(__file__).resolve().parents[2]
B, T = 2, 8
SMALL = dict(hidden=64, num_heads=4, ffn=128)
MINILM = dict(hidden=384, num_heads=12, ffn=1536)
MINILM_T = 32

SCRIPT = r'''
import hashlib, json, os, sys
import torch
import torch.distributed as dist
from dataclasses import asdict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from workbench.errors import WorkbenchError
from workbench.models.encoder import EncoderConfig, EncoderLayer
from workbench.partition.torch_tp import TorchTPLayer, counted_forward, tp_stack

torch.set_num_threads(1)
rank, K = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out, spec = sys.argv[1], json.loads(sys.argv[2])
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (K,))


def layer(seed, **shape):
    torch.manual_seed(seed)
    made = EncoderLayer(EncoderConfig(**shape))
    with torch.no_grad():
        for p in made.parameters():
            p.normal_(0.0, 0.1)
    return made


def compare(tp, plain, x, bias):
    got, counts = counted_forward(tp, x, bias)
    want = x
    for p in (plain if isinstance(plain, list) else [plain]):
        want = p(want, bias)
    return {"max_abs_diff": (got - want).abs().max().item(), "is_plain": type(got) is torch.Tensor,
            "sha256": hashlib.sha256(got.contiguous().numpy().tobytes()).hexdigest(),
            "collectives": [asdict(c) for c in counts]}


found = {}
with torch.no_grad():
    B, T = spec["B"], spec["T"]
    torch.manual_seed(1)
    x = torch.randn(B, T, spec["small"]["hidden"])                       # (B, T, d)
    mask = torch.ones(B, T)
    mask[1, T // 2:] = 0
    padding = (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min  # (B, 1, 1, T)
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]      # (1, 1, T, T)
    plain = [layer(10 + i, **spec["small"]) for i in range(2)]
    with CommDebugMode() as setup:
        stack = tp_stack(plain, mesh)
    found["setup_collectives"] = setup.get_total_counts()
    with CommDebugMode() as debug:
        stack[0](x, padding)
    found["comm_debug_counts"] = {str(op): n for op, n in debug.get_comm_counts().items()}
    found["comm_debug_module_counts"] = {
        name: {str(op): n for op, n in counts["forward"].items()}
        for name, counts in debug.comm_module_counts.items() if counts["forward"]}
    found["padding"] = compare(stack[0], plain[0], x, padding)
    found["causal"] = compare(stack[0], plain[0], x, causal)
    found["none"] = compare(stack[0], plain[0], x, None)
    found["stack"] = compare(stack, plain, x, padding)
    if "minilm" in spec:
        torch.manual_seed(2)
        big = layer(20, **spec["minilm"])
        xb = torch.randn(1, spec["minilm_T"], spec["minilm"]["hidden"])
        found["minilm"] = compare(TorchTPLayer.from_layer(big, mesh), big, xb, None)
    if "bad" in spec:
        found["bad"] = []
        for shape in spec["bad"]:
            with CommDebugMode() as debug:
                try:
                    tp_stack([plain[0], layer(0, **shape)], mesh)
                    found["bad"].append({"error": None})
                except WorkbenchError as e:
                    found["bad"].append({"error": str(e), "collectives": debug.get_total_counts()})
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(found, f)
dist.destroy_process_group()
'''

BAD = [dict(hidden=48, num_heads=3, ffn=96), dict(hidden=64, num_heads=4, ffn=127)]


def run_ranks(folder: Path, world_size: int, spec: dict) -> list[dict]:
    command = [sys.executable, "-c", SCRIPT, str(folder), json.dumps(spec)]
    with WorkerGroup(command, size=world_size, name=f"tp{world_size}", logs=folder, cwd=REPO) as group:
        assert group.wait(timeout=120)
    assert [e.returncode for e in group.exits] == [0] * world_size
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world_size)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each world size's per-rank results (K=2 also runs the MiniLM shape and the bad sizes)."""
    return {2: run_ranks(tmp_path_factory.mktemp("tp2"), 2,
                         {"B": B, "T": T, "small": SMALL, "minilm": MINILM, "minilm_T": MINILM_T, "bad": BAD}),
            4: run_ranks(tmp_path_factory.mktemp("tp4"), 4, {"B": B, "T": T, "small": SMALL})}


def ring_all_reduce_bytes(world_size: int, tensor_bytes: int) -> int:
    return 2 * (world_size - 1) * tensor_bytes // world_size


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("case", ["padding", "causal", "none"])
@pytest.mark.integration
def test_the_tp_layer_computes_the_plain_layer_on_every_rank(ranks, world_size, case):
    results = [r[case] for r in ranks[world_size]]
    assert all(r["is_plain"] for r in results)
    assert max(r["max_abs_diff"] for r in results) < 1e-5
    assert len({r["sha256"] for r in results}) == 1


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.integration
def test_each_layer_issues_two_all_reduces_of_the_activations(ranks, world_size):
    tensor_bytes = B * T * SMALL["hidden"] * 4
    for r in ranks[world_size]:
        collectives = r["padding"]["collectives"]
        assert [(c["op"], c["tensor_bytes"]) for c in collectives] == [("all_reduce", tensor_bytes)] * 2
        assert [c["module"] for c in collectives] == ["TorchTPLayer.attn_out", "TorchTPLayer.ffn2"]
        assert sum(c["sent_bytes"] for c in collectives) == 2 * ring_all_reduce_bytes(world_size, tensor_bytes)
        assert sum(c["received_bytes"] for c in collectives) == 2 * ring_all_reduce_bytes(world_size, tensor_bytes)
        assert [c["op"] for c in r["stack"]["collectives"]] == ["all_reduce"] * 4


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.integration
def test_comm_debug_mode_agrees_and_names_the_row_wise_modules(ranks, world_size):
    for r in ranks[world_size]:
        assert r["comm_debug_counts"] == {"c10d_functional.all_reduce": 2}
        modules = r["comm_debug_module_counts"]
        assert modules["TorchTPLayer.attn_out"] == modules["TorchTPLayer.ffn2"] == {"c10d_functional.all_reduce": 1}
        assert r["setup_collectives"] == 0       # each rank cuts its shards from its own copy: nothing is sent


@pytest.mark.integration
def test_a_minilm_shaped_layer_matches_on_two_ranks(ranks):
    results = [r["minilm"] for r in ranks[2]]
    assert max(r["max_abs_diff"] for r in results) < 1e-5
    assert len({r["sha256"] for r in results}) == 1
    tensor_bytes = MINILM_T * MINILM["hidden"] * 4
    for r in results:
        assert [(c["op"], c["tensor_bytes"], c["sent_bytes"]) for c in r["collectives"]] == \
            [("all_reduce", tensor_bytes, ring_all_reduce_bytes(2, tensor_bytes))] * 2


@pytest.mark.integration
def test_sizes_that_do_not_divide_are_refused_before_any_collective(ranks):
    for r in ranks[2]:
        heads, ffn = r["bad"]
        assert heads["collectives"] == ffn["collectives"] == 0
        assert "num_heads=3" in heads["error"] and "2 ranks" in heads["error"]
        assert "ffn=127" in ffn["error"] and "2 ranks" in ffn["error"]
