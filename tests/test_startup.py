"""Start-up of ``clustersim simulate``: what a run of the default scenario imports (issue 24: under
0.3 s of CLI overhead). Checked structurally, by the modules loaded in a fresh interpreter, not by
timing (benchmarks/bench_startup.py measures the CPU seconds).

The default scenario is the SPMD kind: it loads neither the other strategy kinds (per_layer and swarm
import numpy) nor numpy, pandas, matplotlib or simpy (the cost model, the engine and the report need none
of them for it: the engine's event loop is its own, simulator/engine/engine.py), and it prints the same
table as a run that loaded every kind first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
HEAVY = ("numpy", "pandas", "matplotlib", "scipy", "torch", "simpy")
OTHER_KINDS = ("simulator.strategies.per_layer.kind", "simulator.strategies.swarm", "simulator.strategies.local_sgd",
               "simulator.strategies.parameter_server", "simulator.strategies.layer_parallel_mgrit",
               "workloads.networks.catalog")
# what a transformer's run without --trace never uses: the network spec and its layer builder, the PyTorch
# import, the Hugging Face reader, the trace writer (workloads/catalog.py, simulator/commands/simulate.py)
UNUSED = ("workloads.networks.spec", "workloads.networks.builder", "workloads.networks.torch_import",
          "workloads.hf_config", "simulator.report.trace")

_RUN_DEFAULT = """
import contextlib, io, json, sys
from simulator.cli import main
with contextlib.redirect_stdout(io.StringIO()) as page:
    code = main(["simulate", "--json"])
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.argv[1:] if m in sys.modules),
                  "result": json.loads(page.getvalue())}))
"""


def _run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, cwd=ROOT,
                         check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_default_simulate_loads_no_numpy_pandas_matplotlib_nor_other_kinds():
    run = _run(_RUN_DEFAULT, *HEAVY, *OTHER_KINDS, *UNUSED, "simulator.strategies.spmd.kind")
    assert run["code"] == 0
    assert run["loaded"] == ["simulator.strategies.spmd.kind"]
    assert run["result"]["step_time_s"] > 0


def test_importing_the_cli_and_the_scenario_loads_no_numpy():
    code = ("import json, sys\nimport simulator.cli, simulator.scenario, hardware_specs.catalog\n"
            "print(json.dumps({'loaded': sorted(m for m in sys.argv[1:] if m in sys.modules)}))")
    assert _run(code, *HEAVY, *OTHER_KINDS, *UNUSED)["loaded"] == []


def test_a_resolved_network_spec_and_torch_references_still_resolve():
    """resolve_model imports the network modules only for a reference that names one: a network's
    catalog name, an already resolved network spec (returned as is) and a bad ``torch:`` mapping (its
    field named) behave as when the modules were imported up front."""
    import pytest

    from simulator.errors import ConfigError
    from workloads.catalog import _NETWORK_FILES, resolve_model

    network = resolve_model(_NETWORK_FILES.names()[0])
    assert resolve_model(network) is network
    with pytest.raises(ConfigError, match="^model"):
        resolve_model({"torch": "no.such.module:build", "input_shape": [3, 8, 8], "bogus": 1})


def test_a_node_validates_the_same_whichever_schema_was_built_first():
    """NODES builds the accelerator's validator before the node's (hardware_specs/catalog.py built_first):
    a node with an inline accelerator validates to the same spec either way round."""
    code = ("import json, sys\nfrom hardware_specs.catalog import NODES, ACCELERATORS\n"
            "from hardware_specs.schema import Accelerator, Node\n"
            "if sys.argv[1] == 'node-first': Node.model_rebuild()\n"
            "accelerator = ACCELERATORS.get('a100-sxm-80g').model_dump()\n"
            "node = NODES.get('dgx-a100-80g').model_dump() | {'accelerator': accelerator}\n"
            "print(json.dumps({'node': NODES.get(node).model_dump(mode='json')}))")
    assert _run(code, "node-first") == _run(code, "accelerator-first")


def test_a_kind_loaded_alone_gives_the_same_result_as_every_kind_loaded():
    """get_kind imports only the named kind's module; loading every kind first changes nothing."""
    alone = _run(_RUN_DEFAULT)["result"]
    everything = _run("from simulator.strategies.registry import load_kinds\nload_kinds()\n" + _RUN_DEFAULT)["result"]
    assert alone == everything


def test_kinds_keep_their_registry_order_whichever_was_imported_first():
    """The union's tags (named in its errors) follow KIND_MODULES, even where get_kind imported one
    kind's module before the others."""
    code = ("import json\nfrom simulator.strategies.registry import KIND_MODULES, get_kind, load_kinds\n"
            "get_kind('swarm'); get_kind('spmd')\n"
            "print(json.dumps({'order': list(load_kinds())}))")
    order = _run(code)["order"]
    assert order[0] == "spmd" and order.index("per_layer") < order.index("swarm")
    baseline = _run("import json\nfrom simulator.strategies.registry import load_kinds\n"
                    "print(json.dumps({'order': list(load_kinds())}))")["order"]
    assert order == baseline


def test_network_names_are_told_from_the_network_catalogs_own_folder():
    """workloads/catalog.py tells a network's name by a file in the network catalog's folder without
    importing that catalog: the two must name the same folder."""
    from workloads.catalog import _NETWORK_FILES, resolve_model
    from workloads.networks.catalog import NETWORKS

    assert _NETWORK_FILES.folder.resolve() == NETWORKS.folder.resolve()
    assert _NETWORK_FILES.names() == NETWORKS.names() and NETWORKS.names()
    name = NETWORKS.names()[0]
    assert resolve_model(name) == NETWORKS.get(name).root


def test_catalog_files_read_the_same_with_libyaml():
    """The package's catalog files and its default scenario are read with libyaml's parser
    (hardware_specs/yaml_io.py, _StrictCLoader): every one gives the same values as the pure-Python loader, and a duplicate key is
    still refused."""
    import pytest

    from hardware_specs.yaml_io import parse_yaml
    from simulator.errors import ConfigError

    files = sorted((ROOT / "hardware_specs").glob("*/*.yaml")) + sorted((ROOT / "workloads" / "models").rglob("*.yaml"))
    files += sorted((ROOT / "simulator" / "scenarios").glob("*.yaml"))  # the built-in default scenario
    assert len(files) > 20
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert parse_yaml(text, "f", catalog=True) == parse_yaml(text, "f"), path
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        parse_yaml("a: 1\nb: 2\na: 3\n", "f", catalog=True)


def test_one_commands_parser_is_that_command_of_the_full_parser():
    """``clustersim simulate`` builds only the simulate parser (simulator/cli.py): its help and its
    parse are those of the full parser's; an unknown command falls back to every one."""
    from simulator.cli import build_parser

    full = build_parser()
    sub = full._subparsers._group_actions[0].choices
    for name, parser in sub.items():
        alone = build_parser(name)
        assert list(alone._subparsers._group_actions[0].choices) == [name]
        assert alone._subparsers._group_actions[0].choices[name].format_help() == parser.format_help()
    assert build_parser("no-such-command") is None
    assert "strategy kinds" in full.format_help() and "  spmd " in full.format_help()
    assert all("strategy kinds" not in parser.format_help() for parser in sub.values())  # the epilog is the top's
    assert vars(build_parser("simulate").parse_args(["simulate", "--json"])).keys() == \
        vars(full.parse_args(["simulate", "--json"])).keys()


def test_start_up_runs_with_the_collector_paused_then_frozen_once():
    """simulator/startup.py: the collector is off inside the block and back on after it (left off where it
    was off); what is alive after the first block is frozen, later blocks freeze nothing more. Run in a
    fresh interpreter, so this test process's objects are not frozen."""
    code = ("import gc, json\nfrom simulator.startup import paused_gc\n"
            "seen = []\n"
            "with paused_gc():\n    seen.append(gc.isenabled()); kept = [[i] for i in range(1000)]\n"
            "seen.append(gc.isenabled()); first = gc.get_freeze_count()\n"
            "with paused_gc():\n    more = [[i] for i in range(1000)]\n"
            "second = gc.get_freeze_count(); gc.disable()\n"
            "with paused_gc():\n    pass\n"
            "print(json.dumps({'seen': seen, 'first': first, 'second': second, 'after_off': gc.isenabled()}))")
    run = _run(code)
    assert run["seen"] == [False, True]
    assert run["first"] > 1000 and run["second"] == run["first"]
    assert run["after_off"] is False


def test_default_simulate_gives_the_same_result_with_the_collector_never_paused():
    """Pausing and freezing the collector at start-up changes no figure of the default run."""
    paused = _run(_RUN_DEFAULT)["result"]
    plain = _run("import contextlib, simulator.startup\n"
                 "simulator.startup.paused_gc = contextlib.nullcontext\n" + _RUN_DEFAULT)["result"]
    assert paused == plain
