"""E3's Ray Serve application: an ingress that walks each request through the splits, one deployment per split.

- **Ingress** (one replica): for each request it calls the split holding the request's next layer, waits for
  that split's answer (an exit, a drop, or the survivors' activations as an object reference) and calls the
  next split with the reference, so activations move between the splits' nodes through Ray's object store and
  no split holds a request open while a later split works on it. Before each hop it drops a request that can
  no longer return by its deadline (now + the rest of the plan at full batches > arrival + SLO, the
  simulator's ``drop="budget"`` rule); a split whose queue is full (``max_queued_requests``) refuses the call
  and the request is dropped there.
- **Splits** (``split0``, ``split1``, ...): each replica holds the whole model and runs the layer range each
  request asks for (normally its split's; during a re-plan a request that entered under the old plan asks for
  the rest of its old stretch), batched by ``@serve.batch``. A batch leaves when it is full or when the slack
  of the request that opened it runs out: each request carries the time by which it must be dispatched
  (arrival + SLO x (1 - slack) - the rest of the plan), and the batch wait is set from it before the request
  joins the queue. At dispatch, requests past their drop time are answered as dropped, not computed.
- **Re-plans in place.** Plans reach the replicas as ``user_config`` (a lightweight reconfigure: batch size,
  layers, waits change without restarting a replica); replica counts scale; a split whose GPU type changes is
  restarted on nodes holding the new type (its Ray resource is part of its actor options).
- **Stragglers** (§3.3): the ingress sees every batch's compute time; a replica whose mean time over its
  batches exceeds its split peers' median at the same batch size by more than the tolerance, after at least
  ``exclude_after`` batches, is excluded: the split's request router no longer sends it work (never the
  split's last replica), mirroring the simulator's ``exclude_stragglers_after``.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict, deque
from typing import Any

import numpy as np
import torch

from ray import serve
from ray.serve.request_router import FIFOMixin, RequestRouter

REPLICA_THREADS = 1
"""Torch threads per split replica (the layer profiles are measured with the same single thread)."""
REPLICA_CPUS = 0.25
"""Ray CPUs each split replica asks for: 8 replicas fit on a 2-core local cluster (placement only)."""
INGRESS_CPUS = 0.1
EWMA = 0.3
"""Weight of the newest measurement in the ingress's running estimates of compute and hop times."""
MAX_RETRIES = 3
"""Times the ingress runs a request again when the replica serving it went away (a re-plan scaled it down)."""
STRAGGLER_MEMORY = 32
"""Batches per replica the straggler rule looks at (the most recent)."""

_EXCLUDED: set[str] = set()
"""Replica ids the ingress has excluded as stragglers; read by :class:`ExcludingRouter` in the same process."""


def excluded() -> set[str]:
    """The one exclusion set of this process: looked up through the imported module, since Serve may ship a
    deployment's class by value, with its own copy of this module's globals."""
    import workbench.earlyexit.serveapp as module

    return module._EXCLUDED


def split_name(i: int) -> str:
    return f"split{i}"


class ExcludingRouter(FIFOMixin, RequestRouter):
    """Serve's request router for a split's callers: two random replicas not excluded as stragglers (all of
    them when every one is), of which Serve takes the one with the shorter queue."""

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        out = excluded()
        keep = [r for r in candidate_replicas if r.replica_id.unique_id not in out] or list(candidate_replicas)
        if len(keep) > 2:
            keep = random.sample(keep, 2)
        else:
            random.shuffle(keep)
        return [keep] if keep else []


def _replica_identity() -> dict:
    import os

    import ray

    ctx = serve.get_replica_context()
    rank = getattr(ctx, "rank", None)
    rank = getattr(rank, "rank", rank)
    return {"replica": int(rank) if rank is not None else 0, "rid": ctx.replica_id.unique_id,
            "node": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid()}


class SplitReplica:
    """One replica of one split: the whole model, run over the layer range each request asks for."""

    def __init__(self, spec, index: int):
        torch.set_num_threads(REPLICA_THREADS)
        self.model = spec.build()
        self.index = int(index)
        self.me = _replica_identity()
        self.cfg: dict = {}
        self.slowdown = 1.0
        self.served = 0

    def reconfigure(self, cfg: dict) -> None:
        self.cfg = dict(cfg)
        self.run_batch.set_max_batch_size(int(cfg["batch"]))
        fixed = cfg.get("fixed_wait")
        self.run_batch.set_batch_wait_timeout_s(float(fixed) if fixed is not None else float(cfg["wait_cap"]))
        self.slowdown = float(cfg.get("slowdown", {}).get(str(self.me["replica"]), 1.0))

    async def __call__(self, item: dict) -> dict:
        now = time.time()
        item["entered"] = now
        if self.cfg.get("fixed_wait") is None and item.get("dispatch_by") is not None:
            # The batch this request opens (if it opens one) leaves when its slack runs out.
            wait = min(max(item["dispatch_by"] - now, 0.0), float(self.cfg["wait_cap"]))
            self.run_batch.set_batch_wait_timeout_s(wait)
        return await self.run_batch(item)

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def run_batch(self, items: list[dict]) -> list[dict]:
        began = time.time()
        answers: list[Any] = [None] * len(items)
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for j, it in enumerate(items):
            if it.get("drop_after") is not None and began > it["drop_after"]:
                answers[j] = {"id": it["id"], "dropped": True, "split": self.index, "at": began,
                              "reason": "deadline", "entered": it["entered"]}
            else:
                groups[tuple(it["layers"])].append(j)
        for (start, end), rows in groups.items():
            await self._run_group(items, rows, start, end, answers)
        return answers

    async def _run_group(self, items, rows, start, end, answers) -> None:
        group = [items[j] for j in rows]
        began = time.time()
        if start == 0:
            ids = torch.stack([it["ids"] for it in group])
            mask = torch.stack([it["mask"] for it in group])
            hidden = None
        else:
            fetched = await self._fetch(group)
            lost = [k for k, it in enumerate(group) if it["hidden"].hex() not in fetched]
            for k in lost:          # its replica stopped (a re-plan scaled it away): the ingress runs it again
                answers[rows[k]] = {"id": group[k]["id"], "lost": True, "entered": group[k]["entered"]}
            keep = [k for k in range(len(group)) if k not in set(lost)]
            if not keep:
                return
            group, rows = [group[k] for k in keep], [rows[k] for k in keep]
            hidden = torch.stack([fetched[it["hidden"].hex()][0][it["row"]] for it in group])
            mask = torch.stack([fetched[it["hidden"].hex()][1][it["row"]] for it in group])
            ids = None
        out = await asyncio.to_thread(self._compute, ids, hidden, mask, start, end)
        took = time.time() - began
        if self.slowdown != 1.0:        # an emulated slower GPU: the replica stays busy for longer
            await asyncio.sleep(max(self.slowdown - 1.0, 0.0) * took)
        ended = time.time()
        record = {"split": self.index, **self.me, "index": self.served, "size": len(group),
                  "layers": [start, end], "queued": min(it["entered"] for it in group), "start": began,
                  "entered": [it["entered"] for it in group],
                  "end": ended, "ids": [it["id"] for it in group], "rows": list(out.layer_rows),
                  "gen": max(int(it.get("gen", 0)) for it in group)}
        self.served += 1
        for k, row in enumerate(out.exited):
            it = group[row]
            answers[rows[row]] = {"id": it["id"], "exit_layer": int(out.exit_layers[k]), "label": int(out.labels[k]),
                                  "logits": out.logits[k].clone(), "exited": ended, "entered": it["entered"],
                                  "trace": record}
        if len(out.survivors):
            import ray

            ref = ray.put((out.hidden.clone(), out.mask.clone()))
            for k, row in enumerate(out.survivors):
                it = group[row]
                answers[rows[row]] = {"id": it["id"], "hidden": ref, "row": k, "entered": it["entered"],
                                      "trace": record}

    @staticmethod
    async def _fetch(group) -> dict:
        """The survivors' activations by reference id; a reference whose owner is gone is left out."""
        refs = {}
        for it in group:
            refs.setdefault(it["hidden"].hex(), it["hidden"])
        try:
            return dict(zip(refs, await asyncio.gather(*refs.values())))
        except Exception:  # noqa: BLE001 - fetch one by one to keep what can be had
            got = {}
            for key, ref in refs.items():
                try:
                    got[key] = await ref
                except Exception:  # noqa: BLE001 - lost with its owner
                    pass
            return got

    def _compute(self, ids, hidden, mask, start, end):
        with torch.no_grad():
            if hidden is None:
                hidden = self.model.embed(ids, mask)
            return self.model.run_split(hidden, mask, start, end)


class Ingress:
    """Walks each request through the splits (see the module docstring); one replica per application."""

    def __init__(self, *splits):
        self.cfg: dict = {}
        self.handles: dict[str, Any] = {}
        self.compute_s: dict[tuple[int, int], float] = {}
        self.back_s: float | None = None
        self.times: dict[tuple, deque] = defaultdict(lambda: deque(maxlen=STRAGGLER_MEMORY))
        self.replica_of: dict[str, tuple[int, int, str]] = {}
        self.exclusions: list[dict] = []
        self.generations: list[tuple[float, int]] = []

    def reconfigure(self, cfg: dict) -> None:
        self.cfg = dict(cfg)
        self.generations.append((time.time(), int(cfg["gen"])))

    def report(self) -> dict:
        """What the ingress decided during the run: exclusions and when each plan took over."""
        return {"exclusions": list(self.exclusions), "generations": list(self.generations)}

    def generation(self) -> int:
        return int(self.cfg.get("gen", -1))

    def _handle(self, i: int):
        name = split_name(i)
        if name not in self.handles:
            self.handles[name] = serve.get_deployment_handle(name, app_name=self.cfg["app"])
        return self.handles[name]

    def _rest(self, cfg: dict, i: int) -> float:
        """Seconds from dispatch at split ``i`` to the answer, at full batches, through the rest of the plan."""
        total = 0.0
        hop = 2.0 * (self.back_s or 0.0)
        for j in range(i, len(cfg["splits"])):
            key = tuple(cfg["splits"][j])
            measured = self.compute_s.get(key)
            profiled = cfg["service_s"][j] if cfg.get("service_s") else 0.0
            total += (measured if measured is not None else profiled) + hop
        return total

    async def __call__(self, req: dict) -> dict:
        from ray.exceptions import ActorUnavailableError, RayActorError
        from ray.serve.exceptions import BackPressureError

        cfg = self.cfg
        slo, slack = float(cfg["slo_s"]), float(cfg["slack"])
        deadline = req["arrival"] + slo
        budget_end = req["arrival"] + slo * (1.0 - slack)
        pos, trace = 0, []
        payload = {"ids": req["ids"], "mask": req["mask"]}
        entered_gen = int(cfg["gen"])
        retries = 0
        while True:
            cfg = self.cfg                   # the plan now in force: a re-plan takes over mid-request
            splits = cfg["splits"]
            i = next(k for k, (a, b) in enumerate(splits) if a <= pos < b)
            end = int(splits[i][1])
            rest = self._rest(cfg, i)
            now = time.time()
            if cfg["drop"] and now + rest > deadline:
                return {"id": req["id"], "dropped": True, "split": i, "at": now, "reason": "deadline",
                        "trace": trace, "gen": entered_gen}
            item = dict(payload, id=req["id"], layers=[pos, end], gen=int(cfg["gen"]),
                        drop_after=(deadline - rest) if cfg["drop"] else None,
                        dispatch_by=None if cfg.get("fixed_wait") is not None else budget_end - rest)
            sent = time.time()
            try:
                answer = await self._handle(i).remote(item)
            except BackPressureError:
                return {"id": req["id"], "dropped": True, "split": i, "at": time.time(), "reason": "queue full",
                        "trace": trace, "gen": entered_gen}
            except (RayActorError, ActorUnavailableError):
                # the replica went away under the request (a re-plan scaled it down): run it again from layer 0
                # on the replicas in force, as when its activations are lost; a few times at most
                retries += 1
                if retries > MAX_RETRIES:
                    return {"id": req["id"], "dropped": True, "split": i, "at": time.time(),
                            "reason": "replica lost", "trace": trace, "gen": entered_gen}
                payload, pos = {"ids": req["ids"], "mask": req["mask"]}, 0
                continue
            back = time.time()
            record = answer.get("trace")
            if record is not None:
                trace.append(record)
                self._learn(cfg, i, record, back)
            if answer.get("dropped"):
                return dict(answer, trace=trace, gen=entered_gen)
            if answer.get("lost"):
                payload, pos = {"ids": req["ids"], "mask": req["mask"]}, 0
                continue
            if "exit_layer" in answer:
                return dict(answer, trace=trace, gen=entered_gen, sent=sent)
            payload = {"hidden": answer["hidden"], "row": answer["row"]}
            pos = end

    def _learn(self, cfg: dict, i: int, record: dict, back: float) -> None:
        key = tuple(record["layers"])
        took = record["end"] - record["start"]
        old = self.compute_s.get(key)
        self.compute_s[key] = took if old is None else (1 - EWMA) * old + EWMA * took
        ret = max(back - record["end"], 0.0)
        self.back_s = ret if self.back_s is None else (1 - EWMA) * self.back_s + EWMA * ret
        if not cfg.get("exclude_after"):
            return
        rid = record["rid"]
        self.replica_of[rid] = (record["split"], record["replica"], record.get("node", ""))
        self.times[(key, rid)].append((record["size"], took, record["start"]))
        self._check_straggler(cfg, i, key, rid)

    def _check_straggler(self, cfg: dict, i: int, key: tuple, rid: str) -> None:
        """The simulator's rule on measured times: after ``exclude_after`` batches, a replica whose mean
        slowdown (its time / its peers' median at the same batch size) exceeds 1 + tolerance stops taking work,
        unless it is the last replica of its split."""
        mine = self.times[(key, rid)]
        out = excluded()
        if rid in out or len(mine) < int(cfg["exclude_after"]):
            return
        peers = [r for (k, r) in self.times if k == key and r != rid and r not in out]
        by_size: dict[int, list[float]] = defaultdict(list)
        for r in peers:
            per_size: dict[int, list[float]] = defaultdict(list)
            for size, took, _ in self.times[(key, r)]:
                per_size[size].append(took)
            for size, values in per_size.items():
                by_size[size].append(float(np.median(values)))
        ratios = [took / float(np.median(by_size[size])) for size, took, _ in mine
                  if by_size.get(size) and np.median(by_size[size]) > 0]
        if len(ratios) < int(cfg["exclude_after"]):
            return
        slowdown = float(np.mean(ratios))
        active = int(cfg["replicas"][i]) - sum(1 for e in self.exclusions if e["split"] == i
                                               and tuple(e["layers"]) == key)
        if slowdown > 1.0 + float(cfg["tolerance"]) and active > 1:
            out.add(rid)
            split, replica, node = self.replica_of[rid]
            self.exclusions.append({"at": time.time(), "split": split, "replica": replica, "rid": rid, "node": node,
                                    "layers": list(key), "slowdown": slowdown, "batches": len(ratios)})


# -- building the application ------------------------------------------------------------------------

def build_app(spec, cfg: dict, split_cfgs: list[dict], version: str):
    """The application for one plan generation: ``split_cfgs`` (one per split deployment to keep, the plan's
    first, then any the previous plan still needs while it drains) and the ingress configured with ``cfg``."""
    from ray.serve.config import RequestRouterConfig

    bound = []
    for sc in split_cfgs:
        i, b = int(sc["index"]), int(sc["batch"])
        resources = {sc["resource"]: 1.0} if sc.get("resource") else {}
        deployment = serve.deployment(
            SplitReplica, name=split_name(i), num_replicas=int(sc["replicas"]),
            max_ongoing_requests=2 * b, max_queued_requests=int(sc["max_queued"]),
            graceful_shutdown_timeout_s=max(float(cfg["slo_s"]), 1.0), graceful_shutdown_wait_loop_s=0.1,
            health_check_period_s=2.0,
            ray_actor_options={"num_cpus": REPLICA_CPUS, "resources": resources},
            request_router_config=RequestRouterConfig(request_router_class=ExcludingRouter))
        bound.append(deployment.options(user_config=sc, version=version, _internal=True).bind(spec, i))
    ingress = serve.deployment(Ingress, name="ingress", num_replicas=1,
                               max_ongoing_requests=int(cfg["max_ongoing"]),
                               max_queued_requests=int(cfg["max_queued"]),
                               graceful_shutdown_timeout_s=max(2.0 * float(cfg["slo_s"]), 1.0),
                               graceful_shutdown_wait_loop_s=0.1,
                               ray_actor_options={"num_cpus": INGRESS_CPUS})
    return ingress.options(user_config=cfg, version=version, _internal=True).bind(*bound)
