from typer.testing import CliRunner

from app.cli import cli


def test_help_lists_bench() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "bench" in result.output
