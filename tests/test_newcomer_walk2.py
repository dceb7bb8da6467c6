"""What newcomer6's walk found and left (session 14), each checked through a subprocess as the user meets it:

- ``calibrate --from FILE`` (a file that is there) said "folder not found": it now says it is a file and what the
  folder must hold.
- ``validate-runs --runs /nonexistent`` complained about the default profile first: ``--runs`` is checked first.
- ``compare --op-classes`` on a device trace simulated the scenario (and warned about it) before refusing the option:
  it is refused first.
- ``scale --gpus 8,,`` dropped the empty item silently: refused, naming the option and the item. ``--gpus 16,8`` ran
  sorted without a word: the help says the curve runs from the fewest GPUs, and a note says so where the order
  given differs (the table and scaling.csv list the counts ascending, as docs/commands.md's ``--gpus 64,128,...``).
- ``search --space tp=abc`` gave pydantic's wording ("Input should be a valid integer, unable to parse string as an
  integer"): one line naming ``--space tp`` and what it takes; ``--space tp=1,,2`` (an empty item) and
  ``--space tp=true`` (read as tp 1) were run silently and are refused too.

And what tests/test_bad_input_mutations.py (one field of an example changed at a time) found: a wide-area fabric's
errors in pydantic's words or naming the fabric, not its key (a link's unknown region, a topology of '' or null, an
empty region name); an inline model's ``num_layers: true`` read as 1 layer; DAPPLE's stages against the cluster
naming no ``cluster.num_gpus``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from cli_run import refused_line, run_cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GPU_TRACE = ROOT / "tests" / "data" / "traces" / "nccl_gpu_two_steps.json"
TINY = ["model=llama-1b", "cluster.node=dgx-h100", "cluster.num_gpus=8", "training.seq_length=1024",
        "parallelism.global_batch_size=32", "parallelism.tp=1", "parallelism.pp=1", "parallelism.virtual_stages=1",
        "parallelism.schedule=1f1b"]


_cli = run_cli


def _bad(*args: str, cwd: Path = ROOT) -> str:
    """The one stderr line of a refused command, without the ``clustersim: error:`` head."""
    return refused_line(*args, cwd=cwd).removeprefix("clustersim: error: ")


def test_calibrate_from_a_file_says_it_is_a_file_and_what_the_folder_holds(tmp_path):
    (tmp_path / "gemm.csv").write_text("m,n,k\n")
    line = _bad("calibrate", "--from", "gemm.csv", cwd=tmp_path)
    assert line.startswith("--from: gemm.csv is a file;"), line
    assert "not found" not in line
    assert "gemm.csv, memory.csv, collectives.csv" in line and "microbench/" in line


def test_validate_runs_names_a_missing_runs_before_the_default_profile(tmp_path):
    # tmp_path holds no clustersim-calibration/profile.yaml: the default profile is missing too
    line = _bad("validate-runs", "--runs", str(tmp_path / "nonexistent"), cwd=tmp_path)
    assert line.startswith("--runs: not found: "), line
    assert "profile" not in line


def test_compare_refuses_op_classes_on_a_device_trace_before_simulating():
    # the scenario's 8 GPUs against the trace's 2 ranks: a run that got as far as the simulation warned about it first
    line = _bad("compare", str(EXAMPLES / "resnet50-8xa100.yaml"), "--trace", str(GPU_TRACE), "--op-classes")
    assert line.startswith("--op-classes: the trace has device events"), line


@pytest.mark.parametrize("gpus", ["8,,", "8,,16", ",8"])
def test_scale_refuses_an_empty_gpu_count(tmp_path, gpus):
    line = _bad("scale", "--gpus", gpus, "--fixed", "--workers", "1", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert line.startswith(f"--gpus: empty item in {gpus!r}"), line
    assert not (tmp_path / "out").exists()


def test_scale_says_it_runs_the_counts_from_the_fewest(tmp_path):
    help_text = _cli("scale", "--help").stdout
    assert "from the fewest GPUs" in " ".join(help_text.split())
    args = ["scale", "--gpus", "16,8,16", "--fixed", "--workers", "1", "--out", str(tmp_path)]
    for item in TINY:
        args += ["--set", item]
    proc = _cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "clustersim: note: --gpus 16,8,16 runs from the fewest GPUs, each count once: 8,16" in proc.stderr
    with (tmp_path / "scaling.csv").open() as fh:
        assert [int(r["num_gpus"]) for r in csv.DictReader(fh)] == [8, 16]
    # counts given ascending: no note
    proc = _cli(*[a if a != "16,8,16" else "8,16" for a in args], cwd=tmp_path)
    assert proc.returncode == 0 and "note: --gpus" not in proc.stderr


@pytest.mark.parametrize("option, want", [
    (["--space", "tp=abc"],
     "--space tp: expected positive integers separated by commas (e.g. --space tp=1,2,4), got 'abc'"),
    (["--space", "tp=1,,2"],
     "--space tp: empty item in '1,,2'; expected positive integers separated by commas (e.g. --space tp=1,2,4)"),
    (["--space", "tp=true"],
     "--space tp: expected positive integers separated by commas (e.g. --space tp=1,2,4), got 'true'"),
    (["--space", "zero_stage=x"],
     "--space zero_stage: expected ZeRO stages 0, 1, 2 or 3 separated by commas (e.g. --space zero_stage=0,1), "
     "got 'x'"),
    (["--space", "sequence_parallel=maybe"],
     "--space sequence_parallel: expected true or false (both: --space sequence_parallel=false,true), got 'maybe'"),
    (["--constraint", "max_tp=abc"], "--constraint max_tp: expected a positive integer (e.g. --constraint max_tp=8), "
                                     "got 'abc'"),
    (["--constraint", "max_tp=0"], "--constraint max_tp: expected a positive integer (e.g. --constraint max_tp=8), "
                                   "got 0"),
])
def test_search_space_values_are_said_in_one_line_naming_the_option(option, want):
    line = _bad("search", *option, "--workers", "1")
    assert line == want
    assert "Input should be" not in line


# --- what tests/test_bad_input_mutations.py found (one example each, as the user meets it) ----------------------

WAN = str(EXAMPLES / "gpt-1.7b-diloco-two-continents.yaml")


@pytest.mark.parametrize("override, want", [
    # a link to a region that is not there named the fabric and kept pydantic's "Value error, " head
    ("cluster.fabric.links=[{src: '', dst: frankfurt, delay_ms: 45, bandwidth_gbit_per_s: 10}]",
     "cluster.fabric: links.0.src: unknown region '' (regions: virginia, frankfurt)"),
    # pydantic: "Input tag '' found using _fabric_kind() does not match any of the expected tags: ..."
    ("cluster.fabric.topology=''", "cluster.fabric.topology: expected one of 'fat-tree', 'rail-optimized', 'wan', "
                                   "got ''"),
    # pydantic: "Unable to extract tag using discriminator _fabric_kind()"
    ("cluster.fabric.topology=null", "cluster.fabric.topology: expected one of 'fat-tree', 'rail-optimized', 'wan', "
                                     "got 'null'"),
    # an empty region name was refused only through a link: "links.0.dst: unknown region 'frankfurt' (regions: virginia, )"
    ("cluster.fabric.regions=[{name: virginia, nodes: 2}, {name: '', nodes: 2}]",
     "cluster.fabric.regions.1.name: must not be empty"),
])
def test_wide_area_fabric_errors_name_the_key(override, want):
    assert _bad("simulate", WAN, "--set", override) == want


def test_an_inline_model_refuses_true_for_a_count():
    # `num_layers: true` was read as 1 layer: "parallelism.pp: pp*virtual_stages = 7 exceeds the model's 1 layers"
    line = _bad("simulate", str(EXAMPLES / "swarm-t4-preemptible.yaml"), "--set", "model.num_layers=true")
    assert line == "model.num_layers: expected a number, got true/false"


def test_dapple_stages_against_the_cluster_name_num_gpus():
    line = _bad("simulate", str(EXAMPLES / "vgg16-dapple-v100.yaml"), "--set", "cluster.num_gpus=32")
    assert line == "strategy.stages: the stages' replicas use 16 GPUs; cluster.num_gpus is 32"


def test_a_list_of_counts_refuses_true():
    # swarm's peers_per_stage counted true as 1 peer: "strategy.peers_per_stage: sums to 25, not cluster.num_gpus = 28"
    line = _bad("simulate", str(EXAMPLES / "swarm-t4-preemptible.yaml"), "--set",
                "strategy.peers_per_stage=[4,true,4,4,4,4,4]")
    assert line == "strategy.peers_per_stage: expected numbers, got true/false at item 1"


def test_a_per_layer_rule_refuses_true_for_an_index():
    # `range: [true, 3]` was read as [1, 3] (and failed later on another layer's split, or ran)
    line = _bad("simulate", str(EXAMPLES / "vgg16-adaptive-8xa100.yaml"), "--set",
                "strategy.layers=[{range: [true, 3], devices: 8}]")
    assert line == "strategy.layers.0.range: expected numbers, got true/false at item 0"
