"""What a newcomer tripped over in the thirteenth session, each checked as the user meets it (the CLI through a
subprocess where it is CLI behaviour).

- A step under one second printed its time breakdown in seconds with three decimals: ResNet-50 DAPPLE's 0.128 ms
  gradient all-reduce read "dp_comm 0.000 s 0.8%" while `plot` and --json gave the figure. Now milliseconds.
- A run of more than eight steps listed the first eight: DiLoCo's outer step (the 16th) never showed.
- "with failures ... $1,513,097" said nothing of the price, power and failure rate behind it.
- ``training.tokens: 300B`` and ``hbm_reserve_gib: 2GiB`` were refused without saying what to write.
- ``cluster.node: h100`` and ``clustersim specs show h100`` suggested nothing (no close spelling).
- ``--out`` a folder the system cannot create (``/proc/...``, as root) ended in a FileNotFoundError traceback.
- ``clustersim search``'s table repeats ``tp ... pp`` as headers: degrees first, then seconds of communication,
  printed 0.000 where the step is short (now milliseconds there, and a line that says what the columns are).
- ``clustersim compare`` said "timeline shows ProfilerStep#1" with no timeline asked for.
- ``sweep --resume`` on a results file with a lost column did not say which.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from cli_run import refused_line, run_cli

from simulator.errors import ConfigError, did_you_mean, unit_hint
from simulator.explore.sweep import column_difference
from simulator.report.output_path import check_output_folder

ROOT = Path(__file__).resolve().parents[1]


_cli, _bad = run_cli, refused_line


def _breakdown(text: str) -> dict[str, tuple[float, str]]:
    """The critical rank's breakdown lines of the table: kind -> (value, unit)."""
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("  where the step's time goes")) + 2
    out = {}
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        key, value, unit, _share = line.split()
        out[key] = (float(value), unit)
    return out


def test_a_sub_second_step_prints_its_breakdown_in_milliseconds():
    example = "examples/resnet50-dapple-v100.yaml"
    text, data = _cli("simulate", example).stdout, json.loads(_cli("simulate", example, "--json").stdout)
    assert data["step_time_s"] < 1
    shown = _breakdown(text)
    expected = {k: v for k, v in data["time_breakdown_s"].items() if v and v > 0}
    assert set(shown) == set(expected)
    for key, (value, unit) in shown.items():
        assert unit == "ms"
        assert value == pytest.approx(1e3 * expected[key], abs=5e-4), key
    assert any(0 < value < 1 for value, _ in shown.values())  # a line the old "0.000 s" hid


def test_a_step_of_a_second_or_more_keeps_seconds():
    shown = _breakdown(_cli("simulate").stdout)  # the default, 27 s (README's quickstart checks every digit)
    assert {unit for _, unit in shown.values()} == {"s"}


def test_the_slowest_of_many_steps_is_named_when_the_first_eight_hide_it():
    example = "examples/llama3-8b-diloco-h100.yaml"  # 16 inner steps; the outer all-reduce lands on the 16th
    data = json.loads(_cli("simulate", example, "--json").stdout)
    times = data["step_times_s"]
    slowest = max(range(len(times)), key=times.__getitem__)
    assert len(times) > 8 and slowest >= 8
    text = " ".join(_cli("simulate", example).stdout.split())  # the line wraps
    assert f"... s; slowest: step {slowest + 1}, {times[slowest]:.3f} s)" in text


def test_the_cost_line_says_what_it_rests_on():
    data = json.loads(_cli("simulate", "--json").stdout)
    text = " ".join(_cli("simulate").stdout.split())
    price = data["cost_usd"] / data["gpu_hours"]
    assert f"from {price:.2f} USD per GPU-hour, {data['avg_power_kw']:,.0f} kW average with cooling (PUE), one " \
           f"interruption every {data['job_mtbf_hours']:.1f} h, a checkpoint every " \
           f"{data['checkpoint_interval_min']:.0f} min (an economics: block sets each" in text
    other = " ".join(_cli("simulate", "--set", "economics.gpu_hour_usd=3.5", "--set", "economics.failures=false")
                     .stdout.split())
    assert "from 3.50 USD per GPU-hour" in other and "no interruptions" in other


@pytest.mark.parametrize(("override", "said"), [
    ("training.tokens=300B", "'300B' has a unit; write the plain number 300e9"),
    ("training.tokens=1.5T", "write the plain number 1.5e12"),
    ("training.seq_length=8k", "'8k' has a unit; write the plain number 8000 (or 8192 if k meant 1024)"),
    ("simulation.hbm_reserve_gib=2GiB", "write the plain number 2 (the field is in GiB, as its name says)"),
    ("parallelism.gradient_bucket_mb=25MB", "write the plain number 25 (the field is in MB"),
])
def test_a_number_written_with_a_unit_is_told_what_to_write(override, said):
    line = _bad("simulate", "--set", override)
    assert line.startswith(f"clustersim: error: {override.split('=')[0]}: ") and said in line


def test_the_number_a_unit_hint_suggests_is_accepted():
    assert _cli("simulate", "--set", "training.tokens=300e9", "--json").returncode == 0
    assert _cli("simulate", "--set", "training.tokens=1.5e12", "--json").returncode == 0


def test_no_unit_hint_for_words():
    assert unit_hint("eight", "tp") == "" and unit_hint("$2", "gpu_hour_usd") == ""
    assert unit_hint("2 GiB", "hbm_reserve_gib").endswith("(the field is in GiB, as its name says)")


def test_a_name_inside_catalog_names_is_suggested():
    assert "did you mean 'dgx-h100' or 'h100-pcie-8' or 'p5-h100-efa'?" in _bad("simulate", "--set", "cluster.node=h100")
    assert "did you mean 'dgx-h100'" in _bad("specs", "show", "h100")
    assert "did you mean 'micro_batch_size' or 'global_batch_size'?" in _bad("simulate", "--set", "parallelism.batch=4")
    # close spellings still come first; nothing for a name found nowhere, or too short to mean anything
    assert did_you_mean("resnet51", ["resnet50", "resnet152", "vgg16"]).startswith("; did you mean 'resnet50'")
    assert did_you_mean("no-such-model", ["resnet50", "gpt3-175b"]) == ""
    assert did_you_mean("a1", ["a100-sxm-80g"]) == ""


def test_an_output_folder_the_system_refuses_is_one_line(tmp_path, monkeypatch):
    line = _bad("plot", "examples/resnet50-8xa100.yaml", "--out", "/proc/clustersim-newcomer/figures")
    assert line.startswith("clustersim: error: --out: ")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(ConfigError) as err:
        check_output_folder(tmp_path / "a" / "b", "--out")
    assert err.value.field == "--out" and "cannot create" in err.value.reason


def test_checking_an_output_folder_leaves_nothing(tmp_path):
    assert check_output_folder(tmp_path / "a" / "b" / "c", "--out") == tmp_path / "a" / "b" / "c"
    assert list(tmp_path.iterdir()) == []


def test_the_search_table_says_what_its_columns_are(tmp_path):
    args = ("search", "examples/resnet50-8xa100.yaml", "--space", "micro_batch_size=256", "--space", "pp=1",
            "--workers", "1", "--no-cache", "--top", "2")
    proc = _cli(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("  columns: engine s / fast s: the step time by the engine / by the fast path; "
                                "compute, tp, ep, dp, pp, bubble (after mem GiB): milliseconds of the step on the "
                                "critical rank")
    best = json.loads(_cli(*args, "--json").stdout)[0]
    cells = lines[1].split()
    breakdown = best["time_breakdown_s"]
    assert [float(c) for c in cells[-6:]] == pytest.approx(
        [1e3 * (breakdown.get(k) or 0) for k in ("compute", "tp_comm", "ep_comm", "dp_comm", "pp_comm",
                                                 "pipeline_bubble")], abs=5e-4)
    assert float(cells[-3]) > 0  # the gradient all-reduce the seconds column printed as 0.000


def test_the_search_table_keeps_seconds_where_a_step_takes_a_second_or_more():
    from simulator.report.search_table import render_table
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    result = simulate(load_scenario(None))  # the default, 27 s a step
    row = {**result.to_dict(), "engine_step_time_s": result.step_time_s}
    table = render_table([row])
    assert "(after mem GiB): seconds of the step" in table
    assert float(table.splitlines()[1].split()[-6]) == pytest.approx(result.time_breakdown_s["compute"], abs=5e-4)
    short = render_table([{**row, "engine_step_time_s": 0.5}])
    assert "(after mem GiB): milliseconds of the step" in short
    assert float(short.splitlines()[1].split()[-6]) == pytest.approx(1e3 * result.time_breakdown_s["compute"],
                                                                     abs=5e-4)


def test_compare_names_the_plot_its_timeline_note_is_about(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: gpt-1.7b\ncluster: {node: dgx-a100-80g, num_gpus: 2}\n"
                        "parallelism: {tp: 2, global_batch_size: 2}\n")
    proc = _cli("compare", str(scenario), "--trace", str(ROOT / "tests" / "data" / "traces" / "gloo_cpu_two_steps.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "note: the --plot timeline shows ProfilerStep#" in proc.stdout
    assert "; the times are the average of 2 steps" in proc.stdout
    assert "note: measured on the host timeline (the trace has no device events)" in proc.stdout


def test_resume_names_the_columns_a_results_file_lacks(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"name: s\nbase: {ROOT / 'examples' / 'resnet50-8xa100.yaml'}\n"
                     "grid:\n  parallelism.micro_batch_size: [256]\n")
    assert _cli("sweep", str(sweep), "--out", "r.csv", "--workers", "1", "--no-progress", cwd=tmp_path).returncode == 0
    with (tmp_path / "r.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    with (tmp_path / "lost.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, [c for c in rows[0] if c != "status"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    line = _bad("sweep", str(sweep), "--out", "lost.csv", "--resume", "--workers", "1", "--no-progress", cwd=tmp_path)
    assert line.endswith("has other columns than this sweep (a different sweep file?): missing 'status'")
    assert column_difference(["b", "a"], ["a", "b"]) == ": the same columns in another order"
    assert column_difference(["a", "x", "y", "z", "w"], ["a", "b"]) == \
        ": missing 'b'; not this sweep's: 'x', 'y', 'z' and 1 more"


def test_a_wrapped_table_line_keeps_a_number_with_its_unit():
    import textwrap

    from simulator.report.result import TABLE_WIDTH, unwrap_table, wrap_table_line

    label = "  with failures  "
    for pad in range(TABLE_WIDTH):  # a line whose plain wrap splits "3.1 h" in two
        line = f"{label}{'x' * pad} one interruption every 3.1 h, a checkpoint every 5 min (an economics: block)"
        if any(p.endswith(" 3.1") for p in textwrap.wrap(line[len(label):], width=TABLE_WIDTH, initial_indent=label,
                                                           break_long_words=False, break_on_hyphens=False)):
            break
    else:
        pytest.fail("no padding splits the number from its unit")
    pieces = wrap_table_line(line)
    assert len(pieces) > 1 and all(len(p) <= TABLE_WIDTH for p in pieces)
    assert not any(p.endswith(" 3.1") for p in pieces) and any("3.1 h," in p for p in pieces)
    assert unwrap_table("\n".join(pieces)) == [line]


@pytest.mark.parametrize(("override", "got"), [("training=fp16", "'fp16'"), ("cluster=8", "8")])
def test_a_value_where_a_section_is_meant_says_what_a_section_is(override, got):
    section = override.split("=")[0]
    line = _bad("simulate", "--set", override)
    assert line == (f"clustersim: error: {section}: expected a mapping of its fields ({section}: {{key: value, ...}}, "
                    f"or --set {section}.key=value), got {got}")
    assert "Spec" not in line  # pydantic's "a valid dictionary or instance of TrainingSpec" named a class
