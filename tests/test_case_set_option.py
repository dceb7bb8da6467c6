"""The validation modules name a case set with ``--case-set NAME``; ``--set NAME`` (its name before session 11, when
``clustersim``'s ``--set`` already meant KEY.PATH=VALUE) still works, hidden from --help, with one NOTE on stderr."""

import argparse
import importlib

import pytest

from validation.case_set_option import add_case_set_option, require_case_set

#: every validation module whose command line takes a case set, and the --help text that shows its flag
MODULES = ("validation.modern.__main__", "validation.modern.memory_rows", "validation.modern.attention_share",
           "validation.modern.row_breakdown", "validation.ds3lab", "validation.layout_ranking",
           "validation.calibrate_frameworks")


def _parser(repeatable, default=None):
    parser = argparse.ArgumentParser(prog="python -m validation.x")
    add_case_set_option(parser, "sets", ("a", "b"), repeatable=repeatable, default=default,
                        what_if=", or --override KEY=VALUE for a what-if")
    return parser


def test_case_set_and_the_old_name_give_the_same_list(capsys):
    assert _parser(True).parse_args(["--case-set", "a", "--case-set", "b"]).sets == ["a", "b"]
    assert capsys.readouterr().err == ""
    assert _parser(True).parse_args(["--set", "b", "--case-set", "a", "--set", "a"]).sets == ["b", "a", "a"]
    err = capsys.readouterr().err
    assert err == ("NOTE: python -m validation.x --set NAME is now --case-set NAME (clustersim's --set is "
                   "KEY.PATH=VALUE); --set still works here\n")
    assert _parser(False, default="a").parse_args([]).sets == "a"
    assert _parser(False, default="a").parse_args(["--set", "b"]).sets == "b"


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", "parallelism.tp=2"], "error: --set: python -m validation.x sets no scenario field (got "
                                    "'parallelism.tp=2'); to run only some case sets use --case-set NAME, or "
                                    "--override KEY=VALUE for a what-if"),
    (["--set", "c"], "error: --set: no case set 'c' (one of: a, b)"),
    (["--case-set", "c"], "error: argument --case-set: invalid choice: 'c'"),
])
def test_bad_case_sets_exit_2_naming_the_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        _parser(True).parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_required_case_set_may_come_by_either_name(capsys):
    parser = _parser(False)
    require_case_set(parser, parser.parse_args(["--set", "a"]).sets)
    with pytest.raises(SystemExit) as exit_:
        require_case_set(parser, parser.parse_args([]).sets)
    assert exit_.value.code == 2
    assert "error: the following arguments are required: --case-set" in capsys.readouterr().err


@pytest.mark.parametrize("module", MODULES)
def test_every_validation_cli_shows_case_set_not_set(capsys, module):
    main = getattr(importlib.import_module(module), "main", None) or importlib.import_module(module)._main
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--case-set NAME" in out and "[--set" not in out and "\n  --set" not in out   # not in usage nor options
    with pytest.raises(SystemExit) as exit_:
        main(["--set", "no-such-set"])
    assert exit_.value.code == 2
    assert "error: --set: no case set 'no-such-set'" in capsys.readouterr().err
