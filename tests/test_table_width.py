"""``clustersim simulate``'s table wraps a line wider than 110 columns (the efficiencies on a mixed cluster ran to
300+ characters, swarm's simulated peak per rank to 173) into indented continuation lines, as the no-framework
WARNING is; ``unwrap_table`` joins them back for a script that reads one line per field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from simulator.report.result import TABLE_WIDTH, unwrap_table, wrap_table_line

ROOT = Path(__file__).resolve().parents[1]


def test_a_labelled_line_wraps_under_its_value():
    line = "  efficiencies   ASSUMED (not measured): " + ", ".join(f"part{i}:framework_factors" for i in range(12))
    wrapped = wrap_table_line(line)
    assert len(wrapped) > 1 and max(map(len, wrapped)) <= TABLE_WIDTH
    assert wrapped[0].startswith("  efficiencies   ASSUMED (not measured): part0:framework_factors,")
    assert all(w.startswith(" " * 19) and w[19] != " " for w in wrapped[1:])   # 2 past the value's column (17)
    assert unwrap_table("\n".join(wrapped)) == [line]


def test_lines_without_a_label_and_short_lines():
    line = "                 derived (from another part or a ratio): " + ", ".join(["gemm_bf16 (h100 x 0.9)"] * 8)
    wrapped = wrap_table_line(line)
    assert all(w.startswith(" " * 19) and w[19] != " " for w in wrapped[1:])
    assert wrap_table_line("  step time      1.000 s") == ["  step time      1.000 s"]
    word = "x" * 150   # a word wider than the table stays whole
    assert wrap_table_line(f"  layers/stage   {word}") == [f"  layers/stage   {word}"]
    # a short line indented like a continuation is its own line (its first word fits on the line above)
    assert unwrap_table("  stage 6, the one that waits least\n    compute   1.0 s") == [
        "  stage 6, the one that waits least", "    compute   1.0 s"]


def test_messages_after_the_table_keep_their_lines():
    text = ("  framework      x\n  WARNING: " + "w " * 50 + "\n" + " " * 6 + "- more of it\n"
            + " " * 10 + "torchtitan n=6")
    assert unwrap_table(text) == text.splitlines()


def test_a_mixed_cluster_table_fits_110_columns_and_reads_back():
    out = subprocess.run([sys.executable, "-m", "simulator", "simulate", "examples/mixed-a100-t4.yaml"], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=600).stdout
    lines = out.splitlines()
    assert max(map(len, lines)) <= TABLE_WIDTH
    assumed = [line for line in unwrap_table(out) if "ASSUMED (not measured):" in line]
    assert len(assumed) == 1 and len(assumed[0]) > 200   # one line of 300+ before session 11's wrap
    assert "g4dn-12xlarge:gemm_fp16" in assumed[0].split(": ", 1)[1].split(", ")
    assert sum(line.startswith(" " * 19) and line[19] != " " for line in lines) >= 3   # its continuation lines
