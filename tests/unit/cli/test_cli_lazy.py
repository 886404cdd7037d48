"""`main()` builds only the command being run (a group's help: its commands listed only, by
name and help; cli/startup.py), takes plain values without pydantic and loads Typer's help
without rich's markdown, traceback and emoji code modules; none of it may change what a
command prints or how it exits. Timing: `bench/cli_startup.py`."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest

from batchyard.cli import startup
from batchyard.cli.common import Output

ENV = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}


def _paths() -> list[tuple[str, ...]]:
    from typer.main import get_command

    from batchyard.cli.main import app

    found: list[tuple[str, ...]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        found.append(path)
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, (*path, name))

    walk(get_command(app), ())
    return found


@pytest.fixture(scope="module")
def both() -> Iterator[Any]:
    """(output, exit code) of `main()` and of the whole tree as Typer builds it."""
    from typer.main import get_command

    from batchyard.cli import main

    def call(run: Any, args: tuple[str, ...]) -> tuple[str, int]:
        out = io.StringIO()
        code: Any = 0
        with redirect_stdout(out), redirect_stderr(out):
            try:
                run(list(args))
            except SystemExit as exc:
                code = exc.code
        return out.getvalue(), int(code or 0)

    with pytest.MonkeyPatch.context() as mp:
        for key, value in ENV.items():
            mp.setenv(key, value)
        mp.setenv("BATCHYARD_SERVER", "http://127.0.0.1:9")  # nothing answers there
        main._quiet_types()
        whole = get_command(main.full_app())
        main._reflow(whole)

        def compare(*args: str) -> tuple[tuple[str, int], tuple[str, int]]:
            return (call(main.main, args),
                    call(lambda a: whole.main(a, prog_name="batchyard"), args))

        yield compare


def test_help_of_every_command_is_the_whole_trees(both: Any) -> None:
    paths = _paths()
    assert len(paths) > 50
    for path in paths:
        for flag in ("-h", "--help"):
            lean, whole = both(*path, flag)
            assert lean == whole, (path, lean, whole)
    for args in [(), ("job",), ("cluster", "node"), ("--ca-file", "x", "job", "-h"),
                 ("--ca-file=x", "cluster", "-h"), ("--help", "job"), ("-V",), ("--version",),
                 ("--", "job"), ("--", "-h"), ("--ca-file", "x", "--", "cluster", "-h"),
                 ("job", "--", "list", "-h"), ("cluster", "--", "node"), ("job", "--", "-h")]:
        lean, whole = both(*args)
        assert lean == whole, (args, lean, whole)


def test_errors_are_the_whole_trees(both: Any) -> None:
    for args in [("jbo",), ("job", "lst"), ("job", "file", "lst"), ("--bogus",), ("--",),
                 ("--ca-file", "x"), ("--", "jbo"), ("--bogus", "version"), ("--", "--", "job"),
                 ("job", "--bogus", "list"), ("job", "--", "lst"), ("cluster", "node", "--x"),
                 ("job", "list", "--bogus"), ("job", "list", "--limit", "abc"),
                 ("job", "list", "--limit", "1.5"), ("job", "list", "-o", "xml"),
                 ("version", "-o", "JSON"), ("version", "-o"), ("completion", "tcsh"),
                 ("job", "list", "extra"), ("quota", "set", "--vcpus", "x", "--family", "f")]:
        lean, whole = both(*args)
        assert lean == whole, (args, lean, whole)
        assert lean[1] != 0, args
    text, code = both("job", "list", "--limit", "abc")[0]
    assert code == 2 and "'--limit'" in text and "valid integer" in text  # pydantic's words


def test_commands_run_as_before(both: Any) -> None:
    lean, whole = both("version", "-o", "json")
    assert lean == whole and json.loads(lean[0])["version"]
    # after `--`, the command's name: it runs (root help's commands are listed only)
    for args in [("--", "version"), ("--ca-file", "x", "--", "version", "-o", "json"),
                 ("--", "completion", "bash")]:
        lean, whole = both(*args)
        assert lean == whole and lean[1] == 0 and lean[0], args
    lean, whole = both("job", "list", "--limit", "5", "--state", "queued", "-o", "json")
    assert lean == whole and lean[1] == 4  # no server answers: exit 4, the same way
    lean, whole = both("job", "--", "list", "-o", "json")  # a group's commands, after `--`
    assert lean == whole and lean[1] == 4


def test_plain_values_are_what_typers_adapters_make() -> None:
    from typer._adapters import try_build_adapter
    from typer._coercion import resolve_type_descriptor
    from typer.models import OptionInfo

    takes: dict[Any, list[Any]] = {
        int: ["0", "7", "-3", "007", "123456789012345678", 5, -2],
        float: ["1.5", "-2", "3", "0.25", 4, 2.5],
        str: ["x", "", "a b", "-n"],
        bool: [True, False],
        Output: ["table", "json", Output.json, Output.table],
        list[str]: [("a", "b"), ["c"], ()],
    }
    leaves: dict[Any, list[Any]] = {  # to Typer's own adapter (its value, its error)
        int: ["+4", " 5", "1_000", "1.5", "x", "1234567890123456789", 2.0, True],
        float: ["1e3", "inf", ".5", "1.", "x", True],
        str: [b"x", 5],
        bool: ["yes", 1],
        Output: ["JSON", "xml", "", 1],
        list[str]: ["a", ("a", 1)],
    }
    for annotation, values in takes.items():
        info = OptionInfo()
        quick = startup._quick_for(resolve_type_descriptor(annotation, info))
        adapter = try_build_adapter(annotation, info)
        assert quick is not None and adapter is not None
        for value in values:
            got, want = quick(value, None), adapter.validate_python(value)
            assert got == want and type(got) is type(want), (annotation, value, got, want)
        for value in leaves[annotation]:
            assert quick(value, None) is startup._MISS, (annotation, value)


def test_bounded_paths_and_parsers_keep_typers_adapter() -> None:
    from pathlib import Path

    from typer._coercion import resolve_type_descriptor
    from typer.models import OptionInfo

    assert startup._quick_for(resolve_type_descriptor(int, OptionInfo(min=1))) is None
    assert startup._quick_for(resolve_type_descriptor(float, OptionInfo(max=2.0))) is None
    assert startup._quick_for(resolve_type_descriptor(Path, OptionInfo())) is None
    assert startup._quick_for(resolve_type_descriptor(int, OptionInfo(parser=int))) is None


def test_command_name_skips_the_ca_options() -> None:
    assert startup.command_name(["job", "list"]) == "job"
    assert startup.command_name(["--ca-file", "job", "cluster", "list"]) == "cluster"
    assert startup.command_name(["--ca-sha256=ab", "job"]) == "job"
    assert startup.command_name(["--help", "job"]) is None
    assert startup.command_name(["-V"]) is None
    assert startup.command_name([]) is None
    assert startup.command_name(["--", "job", "list"]) == "job"
    assert startup.command_name(["--ca-file", "x", "--", "version"]) == "version"
    assert startup.command_name(["--ca-file", "--", "job"]) == "job"  # "--" is the CA file
    assert startup.command_name(["--"]) is None


def test_listed_only_commands_never_run() -> None:
    listed = startup.listed_only("portal", "Help.")
    assert (listed.__name__, listed.__doc__) == ("portal", "Help.")
    with pytest.raises(RuntimeError):
        listed()


def test_emoji_codes_load_only_for_a_text_that_may_hold_one() -> None:
    code = (
        "import sys, json\n"
        "import rich.markup\n"
        "real = rich.markup._emoji_replace\n"
        "from batchyard.cli import startup\n"
        "startup.lazy_emoji_codes(); startup.lazy_emoji_codes()\n"
        "lazy = rich.markup._emoji_replace\n"
        "texts = ['plain', 'a: b: c', 'x:y z:', 'https://h:80/', ':smile:', ':smile-text: x',\n"
        "         ':not_an_emoji:', 'a :: b', ':thumbs_up-emoji:', '']\n"
        "before = 'rich._emoji_codes' in sys.modules\n"
        "plain = lazy('no codes: here') == 'no codes: here'\n"
        "still = 'rich._emoji_codes' in sys.modules\n"
        "same = all(lazy(t) == real(t) and lazy(t, default_variant='text') ==\n"
        "           real(t, default_variant='text') for t in texts)\n"
        "markup = rich.markup.render('[b]x[/b] :smile: y').plain\n"
        "print(json.dumps({'once': lazy is not real and getattr(lazy, 'batchyard_lazy', 0),\n"
        "    'before': before, 'plain': plain, 'still': still, 'same': same,\n"
        "    'markup': markup}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data == {"once": True, "before": False, "plain": True, "still": False,
                    "same": True, "markup": "x \U0001f604 y"}


def test_rich_help_stand_ins_load_the_real_classes() -> None:
    code = (
        "import sys, json\n"
        "from batchyard.cli import startup\n"
        "startup.defer_rich_help_extras()\n"
        "import typer.rich_utils as ru\n"
        "skipped = [m for m in ('rich.markdown', 'rich.traceback') if m in sys.modules]\n"
        "md = ru.Markdown('**x**')\n"
        "import rich.markdown, rich.traceback\n"
        "try:\n"
        "    raise ValueError('boom')\n"
        "except ValueError as exc:\n"
        "    tb = ru.Traceback.from_exception(type(exc), exc, exc.__traceback__)\n"
        "print(json.dumps({'skipped': skipped,\n"
        "    'markdown': type(md) is rich.markdown.Markdown and isinstance(md, ru.Markdown),\n"
        "    'traceback': type(tb) is rich.traceback.Traceback,\n"
        "    'text': type(ru._make_rich_text(text='**x**', markup_mode='markdown')).__name__,\n"
        "}))\n"
    )
    env = {**os.environ, **ENV}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data == {"skipped": [], "markdown": True, "traceback": True, "text": "Markdown"}


def test_garbage_collection_waits_only_in_the_command_lines_process() -> None:
    # as the `batchyard` script: paused from main's import until a command runs (then what
    # exists is frozen and collection goes on), or the command line ends without one
    code = (
        "import gc, io, json, sys\n"
        "from contextlib import redirect_stdout\n"
        "sys.argv = ['/bin/batchyard', *sys.argv[1:]]\n"
        "import batchyard.cli.main as m\n"
        "import batchyard.cli.quick as q\n"
        "q.run = lambda *a, **kw: None\n"  # the whole CLI (the quick path: below)
        "seen = {'imported': gc.isenabled()}\n"
        "real = m._resume_gc\n"
        "def resume():\n"
        "    seen.setdefault('before_command', gc.isenabled())\n"
        "    real()\n"
        "    seen.setdefault('in_command', gc.isenabled())\n"
        "m._resume_gc = resume\n"
        "try:\n"
        "    with redirect_stdout(io.StringIO()):\n"
        "        m.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "seen['after'] = gc.isenabled()\n"
        "seen['frozen'] = gc.get_freeze_count() > 1000\n"
        "print(json.dumps(seen))\n"
    )
    env = {**os.environ, **ENV}
    for args, want in [(["version"], {"imported": False, "before_command": False,
                                      "in_command": True, "after": True, "frozen": True}),
                       (["--help"], {"imported": False, "before_command": False,
                                     "in_command": True, "after": True, "frozen": True})]:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == want, args


def test_main_with_arguments_leaves_garbage_collection_alone(both: Any) -> None:
    import gc

    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    for args in [("version",), ("--help",), ("jbo",)]:
        both(*args)
        assert gc.isenabled() and gc.get_freeze_count() == frozen, args
