"""install_extra: the line of a command that needs an optional dependency says how to install it."""

import sys


def test_a_command_that_needs_an_extra_says_how_to_install_it_from_pypi_and_from_a_clone(tmp_path, monkeypatch,
                                                                                          capsys):
    """The line names the extra that holds the missing package (pyproject.toml, as installed), as both commands."""
    from importlib.metadata import requires

    from burnout.cli import main

    text = tmp_path / "notes.txt"
    text.write_text("Some words of a first document.\n\nSome words of a second one.\n")
    monkeypatch.setitem(sys.modules, "datasketch", None)  # import datasketch → ImportError
    monkeypatch.setitem(sys.modules, "gradio", None)
    monkeypatch.delitem(sys.modules, "burnout.playground.app", raising=False)  # imported again, without Gradio
    for argv, package, extra in ((["data", "audit", str(text), "--out", str(tmp_path / "audit")], "datasketch", "data"),
                                 (["playground", str(tmp_path)], "gradio", "playground")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"needs {package}" in err.lower(), err
        assert f"pip install 'gpuburnout[{extra}]'" in err and f"pip install -e '.[{extra}]'" in err, err
        assert any(r.startswith(package) and f'extra == "{extra}"' in r for r in requires("gpuburnout")), extra
