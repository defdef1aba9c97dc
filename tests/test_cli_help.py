"""`eagle-zoo --help` and `eagle-zoo COMMAND --help`: written for users, with examples."""
from __future__ import annotations

import pytest

from eagle_zoo import cli


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_says_what_the_tool_does_and_lists_every_command(capsys):
    out = _help(capsys)
    assert out.splitlines()[2].startswith("eagle-zoo: a zoo of EAGLE / EAGLE-3")
    assert "``" not in out and "Each subcommand lives" not in out  # no internal docstring
    for name, cmd in cli.SUBCOMMANDS.items():
        assert f"    {name}" in out and cmd.summary.split()[0] in out
    assert "examples:\n  eagle-zoo list" in out


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_every_command_has_a_description_and_an_example(capsys, name):
    out = _help(capsys, name)
    assert out.startswith(f"usage: eagle-zoo {name}")
    assert "examples" in out, f"eagle-zoo {name} --help shows no example"
    description = out.split("\n\n")[1]
    assert description.rstrip().endswith((".", ")")), f"{name}: description cut: {description!r}"
    assert all(len(line) <= 100 for line in description.splitlines()), f"{name}: description not wrapped"


@pytest.mark.parametrize("conversion", ["legacy", "to-speculators", "to-yuhuili", "to-safetensors",
                                        "shard", "unshard", "average"])
def test_every_conversion_shows_its_own_example(capsys, conversion):
    out = _help(capsys, "convert", conversion)
    assert f"  eagle-zoo convert {conversion} " in out and "exit codes:" in out


def test_tool_commands_name_a_bad_option_before_loading_anything():
    from argparse import Namespace

    from eagle_zoo.tools import diagnose, vocab_coverage

    with pytest.raises(SystemExit, match="eagle-zoo diagnose: --num and --max-tokens must be at least 1"):
        diagnose.run(Namespace(num=0, max_tokens=256))
    with pytest.raises(SystemExit, match="eagle-zoo vocab-coverage: --max-tokens must be at least 1"):
        vocab_coverage.run(Namespace(max_tokens=0))


def test_vocab_coverage_checks_its_head_before_decoding(monkeypatch):
    from argparse import Namespace

    import eagle_zoo.engine.llm
    from eagle_zoo.hub import HubError
    from eagle_zoo.tools import vocab_coverage

    monkeypatch.setattr(eagle_zoo.engine.llm, "LLM", lambda *a, **k: pytest.fail("decoded before --head was read"))
    eagle1 = "eagle-zoo/EAGLE-SmolLM2-135M-Instruct"
    with pytest.raises(SystemExit, match=f"--head {eagle1}: no draft vocabulary"):
        vocab_coverage.run(Namespace(max_tokens=8, head=eagle1, device="cpu"))
    with pytest.raises(HubError, match="no-such-head"):
        vocab_coverage.run(Namespace(max_tokens=8, head="/no-such-head", device="cpu"))


@pytest.mark.parametrize("step", ["mix", "prompts", "data", "eagle", "eagle3"])
def test_every_training_step_has_a_description_and_examples_that_parse(capsys, step):
    import shlex

    out = _help(capsys, "train", step)
    assert out.startswith(f"usage: eagle-zoo train {step}") and out.split("\n\n")[1].rstrip().endswith(".")
    examples = [line.strip() for line in out.split("examples:\n", 1)[1].splitlines() if line.strip()]
    assert len(examples) >= 2
    parser = cli.build_parser(only="train")
    for example in examples:
        argv = shlex.split(example)
        assert argv[:3] == ["eagle-zoo", "train", step]
        assert parser.parse_args(argv[1:]).train_command == step, example


def test_serve_help_lists_as_without_effect_only_flags_serve_does_not_honour(capsys):
    # serve has its own --disable-log-stats (it silences the stats lines); the vLLM group's
    # text must not call it "without effect".
    out = _help(capsys, "serve")
    group_text = out.split("vLLM engine arguments:\n", 1)[1].split("\n\n", 1)[0]
    assert "--gpu-memory-utilization" in group_text
    assert "--disable-log-stats" not in group_text and "--disable-log-stats" in out
