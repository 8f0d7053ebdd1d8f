"""The `kgreasoner` command: every listed command is the one its module registers; help imports none of them."""

import subprocess
import sys

from kgreasoner.cli import COMMANDS, build_parser, main


def test_every_listed_command_is_registered_by_its_module():
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(subparsers.choices) == sorted(COMMANDS)
    for name, (module, _) in COMMANDS.items():
        only = next(a for a in build_parser(name)._actions if a.dest == "command")
        assert only.choices[name].get_default("func") is not None, f"{module} does not define {name}"


def test_help_lists_every_command_without_importing_torch():
    code = (
        "import sys\nfrom kgreasoner.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.splitlines()[-1] == "False False"
    for name in COMMANDS:
        assert f"    {name}" in result.stdout


def test_a_command_without_arguments_shows_its_usage(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out
