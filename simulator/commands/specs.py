"""``clustersim specs list|show``: the catalog of accelerators, nodes, fabrics, models (decoder
transformers), networks (CNNs, ViTs, U-Net, LSTMs, BERT: ``workloads/models/networks``) and framework
profiles (``training.framework``: hardware_specs/frameworks)."""

from __future__ import annotations

import json

from simulator.errors import ConfigError, did_you_mean

KINDS = ("accelerator", "fabric", "framework", "model", "network", "node")


def _catalogs() -> dict:
    """The catalogs by kind (imported when a sub-command runs: ``--help`` stays fast)."""
    from hardware_specs.catalog import ACCELERATORS, FABRICS, NODES
    from hardware_specs.framework import FRAMEWORKS
    from workloads.catalog import MODELS
    from workloads.networks.catalog import NETWORKS

    return {"accelerator": ACCELERATORS, "node": NODES, "fabric": FABRICS, "model": MODELS, "network": NETWORKS,
            "framework": FRAMEWORKS}


def register(subparsers) -> None:
    p = subparsers.add_parser("specs", help="list or show catalog entries (hardware and models)")
    sub = p.add_subparsers(dest="specs_command", metavar="ACTION")
    lst = sub.add_parser("list", help="list catalog entries")
    lst.add_argument("--kind", choices=KINDS, help="only this kind")
    lst.add_argument("--json", action="store_true", help="print every entry's name and summary as JSON")
    lst.set_defaults(handler=run_list)
    show = sub.add_parser("show", help="show one entry as YAML")
    show.add_argument("name", help="a catalog name from `clustersim specs list`, e.g. h100-sxm-80g or llama3-8b")
    show.add_argument("--kind", choices=KINDS, help="when a name exists in several catalogs")
    show.add_argument("--json", action="store_true", help="print the entry as JSON instead of YAML")
    show.set_defaults(handler=run_show)
    p.set_defaults(handler=lambda args: (p.print_help(), 0)[1])


def _summary(kind: str, spec) -> str:
    if kind == "accelerator":
        precision = next(p for p in ("bf16", "fp16", "fp32", "fp64") if p in spec.peak_tflops)  # the training peak
        return f"{spec.peak_tflops[precision]:g} TFLOP/s {precision}, {spec.hbm_gib:g} GiB"
    if kind == "node":
        return (f"{spec.gpus_per_node}x {spec.accelerator if isinstance(spec.accelerator, str) else spec.accelerator.name}, "
                f"{spec.intra_node.kind}, {spec.nics_per_node}x {spec.nic_bandwidth_gbit_per_s:g} Gb/s"
                + (f", NVLink domain of {spec.nvlink_domain_gpus}" if spec.nvlink_domain_gpus else ""))
    if kind == "framework":  # where its factors were fitted (elsewhere they are carried over or assumed)
        fitted = ", ".join(f"{e.accelerator} {'/'.join(e.precisions)}"
                           + (f" ({'/'.join(e.fp8_recipes)})" if e.fp8_recipes else "") for e in spec.entries)
        return f"fitted on: {fitted}"
    if kind == "fabric" and spec.topology == "wan":
        places = (f"{len(spec.regions)} regions" if spec.regions else f"{len(spec.pair_matrices()[0])} nodes")
        delays = [d for i, row in enumerate(spec.pair_matrices()[0]) for j, d in enumerate(row) if i != j]
        return f"wan, {places}, one-way delay {min(delays):g}-{max(delays):g} ms"
    if kind == "fabric":
        shape = (f"units of {spec.rail_group_nodes} nodes" if spec.topology == "rail-optimized"
                 else f"{spec.levels} tiers")
        return f"{spec.topology}, {shape}, oversubscription {spec.oversubscription:g}"
    from workloads.counting import total_params
    from workloads.graph import ShardShape

    if kind == "network":
        graph = spec.root.layer_graph(ShardShape(micro_batch=1, seq_length=1))
        return f"{spec.root.family}, {graph.total_params() / 1e6:.1f} M params, {graph.forward_flops() / 2e9:.2f} GMAC/sample"
    return f"{total_params(spec) / 1e9:.1f} B params, {spec.num_layers} layers, h={spec.hidden_size}"


def _default_framework() -> dict:
    """``training.framework``'s default, which has no profile file (so ``specs list`` lists none for it): the
    catalog constants alone. The WARNING of a run that names no framework says "priced as megatron-core", and
    ``specs show megatron-core`` says what that is instead of "no catalog entry"."""
    from hardware_specs.framework import DEFAULT_FRAMEWORK
    from simulator.cost.default_framework import DEFAULT_MEANING

    return {"name": DEFAULT_FRAMEWORK, "default": True, "description": DEFAULT_MEANING,
            "source": "simulator/cost/framework.py; how far it was from held-out runs of named frameworks: "
                      "hardware_specs/frameworks/default_heldout.csv"}


def run_list(args) -> int:
    CATALOGS = _catalogs()  # noqa: N806
    kinds = [args.kind] if args.kind else list(CATALOGS)
    rows = [{"kind": k, "name": n, "summary": _summary(k, CATALOGS[k].get(n))} for k in kinds for n in CATALOGS[k].names()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for kind in kinds:
        print(f"{kind}s:")
        width = max((len(row["name"]) for row in rows if row["kind"] == kind), default=0)  # one column per kind
        for row in rows:
            if row["kind"] == kind:
                print(f"  {row['name']:<{width}}  {row['summary']}")
    return 0


def run_show(args) -> int:
    import yaml

    CATALOGS = _catalogs()  # noqa: N806
    kinds = [args.kind] if args.kind else list(CATALOGS)
    found = [(k, CATALOGS[k].get(args.name)) for k in kinds if args.name in CATALOGS[k].names()]
    default = _default_framework()
    if not found and args.name == default["name"] and "framework" in kinds:
        print(json.dumps(default, indent=2) if args.json else "# framework\n" + yaml.safe_dump(default, sort_keys=False))
        return 0
    if not found:
        names = [name for k in kinds for name in CATALOGS[k].names()]
        raise ConfigError("name", f"no catalog entry {args.name!r}{did_you_mean(args.name, names)} "
                                  "(see `clustersim specs list`)")
    kind, spec = found[0]
    data = spec.model_dump(mode="json", exclude_none=True)
    print(json.dumps(data, indent=2) if args.json else f"# {kind}\n" + yaml.safe_dump(data, sort_keys=False))
    return 0
