"""`rlvr <command>` dispatch: a subcommand's real ImportError surfaces (no "not implemented yet" stand-in)."""

from __future__ import annotations

import sys

import pytest

from rlvr import cli


def test_a_broken_subcommand_import_raises_instead_of_not_implemented(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rlvr.eval.cli", None)  # importing it now raises ImportError
    with pytest.raises(ImportError):
        cli.main(["eval", "--help"])


def test_every_subcommand_has_a_handler_and_no_placeholder() -> None:
    assert set(cli.HANDLERS) == set(cli.SUBCOMMANDS)
    assert not hasattr(cli, "_not_implemented")
