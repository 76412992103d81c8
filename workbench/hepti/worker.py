"""A Hepti rank: ``python -m workbench.hepti.worker --control SOCKET``, started by the workbench's group
(:class:`workbench.hepti.run.HeptiGroup`) on 127.0.0.1 or in network namespaces with shaped links.

Each job is one request: the primary (rank 0) embeds it from the model's file and hands the input out, every
rank cuts its slice of each layer's weights at each decision (:mod:`workbench.hepti.weights`) and walks the
layers (:func:`workbench.hepti.execute.execute_hepti`), deciding each layer's mode at its start; after a fault
the primary resumes from the layer checkpoint in its own storage.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict

from workbench.distributed.execute import Comm
from workbench.distributed.wire import encode_array
from workbench.distributed.worker import Runner


class HeptiRunner(Runner):
    """One Hepti rank of the group, kept between jobs."""

    def run(self, spec: dict, progress=lambda i, label, extra=None: None) -> dict:
        """A Hepti job: the model's layers, each layer's mode decided at its start; resuming after a fault, from
        the layer checkpoint the primary keeps in ``checkpoint_dir`` (its own storage)."""
        import math

        import torch.distributed as dist

        from workbench.devices import DeviceProfile
        from workbench.hepti.execute import execute_hepti
        from workbench.hepti.weights import PrimaryEnds, SliceStore
        from workbench.models.split import NUM_CLASSES

        devices = [DeviceProfile.from_dict(d) for d in spec["devices"]]
        if len(devices) != self.world:
            raise RuntimeError(f"the job has {len(devices)} devices but this group {self.world} ranks")
        store = SliceStore(spec["weights"])
        ends = PrimaryEnds(store, NUM_CLASSES) if self.rank == 0 else None
        inputs = {"x": None, "mask": None, "bias": None}
        if ends is not None:
            inputs = ends.inputs(ends.token_ids(spec["seq_len"], spec.get("seed", 0)))
        primary_dir = spec.get("checkpoint_dir")
        start_layer, inputs["x"] = self._hand_out(primary_dir, inputs["x"], bool(spec.get("resume")))
        falls = {name: (int(layer), float(nbytes)) for name, (layer, nbytes) in spec.get("memory_falls", {}).items()}
        import scipy.optimize  # noqa: F401  (loaded before the clock starts: the first decision would pay for it)
        deadline = spec.get("deadline_s")
        dist.barrier()
        started = time.perf_counter()

        def report(layer, label, extra):
            message_extra = {}
            if extra and "checkpoint" in extra and primary_dir:
                from workbench.hepti.run import save_checkpoint

                save_checkpoint(primary_dir, *extra["checkpoint"])
            if extra and "decision" in extra:
                message_extra["report"] = {"decision": asdict(extra["decision"])}
            progress(layer, label, message_extra)

        result, decisions = execute_hepti(devices, store, inputs, Comm(self.rank, self.world, self.groups), ends=ends,
                                          emulate=spec.get("emulate", True), memory_falls=falls,
                                          deadline_s=math.inf if deadline is None else float(deadline),
                                          start_layer=start_layer, link=spec.get("link", "emulated"),
                                          mode=spec.get("mode"), adapt=spec.get("adapt", True),
                                          fixed_shares=spec.get("shares"), progress=report,
                                          network=spec.get("network", "shared"),
                                          limited=bool(spec.get("limited", False)),
                                          stalls={int(k): float(v) for k, v in
                                                  spec.get("stalls", {}).get(devices[self.rank].name, {}).items()})
        return {"rank": self.rank, "device": result.device, "t0": result.t0 if result.t0 is not None else started,
                "timeline": result.timeline().to_dict(), "counts": [asdict(c) for c in result.counts],
                "wall_s": result.wall_s, "decisions": [asdict(d) for d in decisions], "memory": result.memory,
                "hidden": encode_array(result.hidden) if result.hidden is not None else None,
                "logits": encode_array(result.logits) if result.logits is not None else None}

    def _hand_out(self, primary_dir: str, x, resume: bool):
        """The primary hands every rank the request's input (a secondary holds nothing of the request): the
        embedded input at layer 0, or, resuming after a fault, the last layer checkpoint from its own storage."""
        import torch
        import torch.distributed as dist

        from workbench.hepti.run import load_checkpoint

        meta = torch.zeros(4, dtype=torch.int64)
        if self.rank == 0:
            layer = 0
            if resume:
                layer, saved = load_checkpoint(primary_dir)
                x = torch.from_numpy(saved)
            meta = torch.tensor([layer, *x.shape], dtype=torch.int64)
        dist.broadcast(meta, 0)
        if self.rank != 0:
            x = torch.empty(tuple(int(v) for v in meta[1:]), dtype=torch.float32)
        dist.broadcast(x, 0)
        return int(meta[0]), x


def main(argv=None) -> int:
    from workbench.distributed.worker import serve

    parser = argparse.ArgumentParser(prog="python -m workbench.hepti.worker",
                                     description="a Hepti rank (started by the workbench)")
    parser.add_argument("--control", required=True, help="the parent's control socket (set by the workbench)")
    args = parser.parse_args(argv)
    return serve(args.control, HeptiRunner)


if __name__ == "__main__":
    sys.exit(main())
