"""What `batchyard` does before a command runs, kept cheap (issue 18: start-up). Three things
cost most of a short command's time besides Python and Typer's own import:

* Typer builds every command of every group (each parameter's signature and type) before
  it parses a word: `command_for` builds only the group or command being run, and for a
  group's help (or a name that is no command) its commands by name and help only and its
  groups without their own commands, which is all that help and errors show of them. Both
  come from the real definitions in ``main.app``.
* Typer checks each option's value with a pydantic ``TypeAdapter`` made on first use (pydantic
  alone is ~45 ms to import): `quick_values` takes the plain values a command line gives
  (text, whole and decimal numbers, a choice, lists of text) as pydantic would take them and
  hands everything else, and every value it does not accept, to Typer's own adapter, so
  results and error messages are Typer's.
* Typer's rich help module imports rich's Markdown (markdown-it) and Traceback (pygments)
  modules at its top, used only for ``rich_markup_mode="markdown"`` and pretty tracebacks
  (neither is on here): `defer_rich_help_extras` lets it load with stand-ins that import the
  real class when first used; and rich's emoji codes load only for a text that may hold one
  (`lazy_emoji_codes`).

Each step leaves Typer as it is where its internals are not the ones expected."""

from __future__ import annotations

import copy
import importlib
import re
import sys
import types
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import typer

# Root options that take a value, and may come before the command's name.
ROOT_VALUE_OPTIONS = ("--ca-file", "--ca-sha256")
COMPLETE_VAR = "_BATCHYARD_COMPLETE"  # set: shell completion, which walks the whole tree


# Building only what runs ---------------------------------------------------------------------


def command_at(args: Sequence[str]) -> int | None:
    """Where the root command's name is in ``args`` (``job`` in ``--ca-file x job list``);
    None when a root option other than the CA ones comes first (``--help``, ``--version``, a
    typo) or none is given: then every name may show."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ROOT_VALUE_OPTIONS:
            i += 2
        elif arg.startswith(tuple(f"{o}=" for o in ROOT_VALUE_OPTIONS)):
            i += 1
        elif arg == "--":  # the end of options: the command's name comes next
            return i + 1 if i + 1 < len(args) else None
        elif arg.startswith("-"):
            return None
        else:
            return i
    return None


def command_name(args: Sequence[str]) -> str | None:
    """The root command's name in ``args`` (`command_at`)."""
    at = command_at(args)
    return None if at is None else args[at]


def _command_name(info: Any) -> str | None:
    """A registered command's name, as Typer names it."""
    from typer.main import get_command_name

    if info.name:
        return str(info.name)
    return get_command_name(info.callback.__name__) if info.callback else None


def names(app: typer.Typer) -> list[str]:
    """The names of ``app``'s commands and groups."""
    found = [_command_name(c) for c in app.registered_commands]
    return [n for n in found if n] + [str(g.name) for g in app.registered_groups if g.name]


def _shallow(group: Any) -> Any:
    """A sub-group as the root lists it: its own name, help and callback, none of its
    commands (those are built when it runs)."""
    info = copy.copy(group)
    if info.typer_instance is not None:
        sub = copy.copy(info.typer_instance)
        sub.registered_commands = []
        sub.registered_groups = []
        info.typer_instance = sub
    return info


def listed_only(name: str, doc: str | None = None) -> Callable[[], None]:
    """A command's function as its group's help lists it: the name (Typer's command name of
    ``name``) and docstring ``doc``, no parameters. Never run: a command line that runs a
    command builds its real one (`command_for`)."""

    def command() -> None:
        raise RuntimeError(f"batchyard: {name!r} was built for help only")

    command.__name__ = command.__qualname__ = name
    command.__doc__ = doc
    return command


def _listed(info: Any) -> Any:
    """A command as its group lists it: its own name, help and settings, none of its
    parameters (whose types and defaults Typer would inspect and build)."""
    if info.callback is None or getattr(info.callback, "__module__", None) == __name__:
        return info
    listed = copy.copy(info)
    listed.callback = listed_only(info.callback.__name__, info.callback.__doc__)
    return listed


def _only(app: typer.Typer, name: str, rest: Sequence[str]) -> typer.Typer:
    """A copy of ``app`` with only its command or group ``name``; a group's own copy is
    pruned the same way for the words after its name (`_pruned`)."""
    view = copy.copy(app)
    view.registered_commands = [c for c in app.registered_commands if _command_name(c) == name]
    view.registered_groups = []
    for group in app.registered_groups:
        if group.name == name:
            info = copy.copy(group)
            if info.typer_instance is not None:
                info.typer_instance = _pruned(info.typer_instance, rest,
                                              options=info.callback is not None)
            view.registered_groups.append(info)
    return view


def _listing(app: typer.Typer) -> typer.Typer:
    """A copy of ``app`` as its help (or an error naming its commands) shows it: every
    command listed only (`_listed`), every group shallow (`_shallow`)."""
    view = copy.copy(app)
    view.registered_commands = [_listed(c) for c in app.registered_commands]
    view.registered_groups = [_shallow(g) for g in app.registered_groups]
    return view


def _pruned(group: typer.Typer, args: Sequence[str], options: bool = False) -> typer.Typer:
    """A sub-group for ``args`` (the words after its name): only the command or group named
    first (or right after ``--``); else, as no command can run, its listing (its help, or an
    error naming its commands), or all of it where the group takes options of its own
    (``options``: a callback), which may come before a command's name."""
    if args and args[0] == "--":
        args = args[1:]
    if args and args[0] in names(group):
        return _only(group, args[0], args[1:])
    if options or group.registered_callback is not None:
        return group
    return _listing(group)


def command_for(app: typer.Typer, args: Sequence[str]) -> Any:
    """The click command that runs ``args``: the root with only the command being run built
    (`job list`: the root, `job` and its `list`); or, when no known name follows the root's
    options, the root with every command listed only and each group shallow (root help,
    ``--version``, an error for a missing or unknown name and its suggestions: no command
    runs, as no name comes before the options that end the command line)."""
    from typer.main import get_command

    at = command_at(args)
    if at is not None and args[at] in names(app):
        return get_command(_only(app, args[at], args[at + 1:]))
    return get_command(_listing(app))


# Values without pydantic ---------------------------------------------------------------------

_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?")
_MISS = object()


def _quick_for(descriptor: Any) -> Callable[[Any, Any], Any] | None:
    """How to take a value of this parameter's type without pydantic (None: no quick way).
    Each returns ``_MISS`` for a value it does not take as pydantic surely would."""
    info = descriptor.parameter_info
    if descriptor.file_annotation is not None or getattr(info, "parser", None) is not None:
        return None
    annotation = descriptor.annotation
    bounded = info.min is not None or info.max is not None
    if annotation is bool:
        return lambda value, ctx: value if type(value) is bool else _MISS
    if annotation is str:
        return lambda value, ctx: value if type(value) is str else _MISS
    if annotation is int and not bounded:
        def as_int(value: Any, ctx: Any) -> Any:
            if type(value) is int:
                return value
            if type(value) is str and _INT.fullmatch(value):
                return int(value)
            return _MISS
        return as_int
    if annotation is float and not bounded:
        def as_float(value: Any, ctx: Any) -> Any:
            if type(value) in (int, float):
                return float(value)
            if type(value) is str and _FLOAT.fullmatch(value):
                return float(value)
            return _MISS
        return as_float
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        from typer._param_types import coerce_cli_choice

        choices = tuple(annotation)
        case_sensitive = info.case_sensitive

        def as_choice(value: Any, ctx: Any) -> Any:
            try:  # what Typer's adapter calls; its error message comes from the adapter
                return coerce_cli_choice(value, choices=choices, case_sensitive=case_sensitive,
                                         ctx=ctx)
            except ValueError:
                return _MISS
        return as_choice
    if annotation == list[str]:
        def as_texts(value: Any, ctx: Any) -> Any:
            if isinstance(value, list | tuple) and all(type(v) is str for v in value):
                return list(value)
            return _MISS
        return as_texts
    return None


def _no_quick(value: Any, ctx: Any) -> Any:
    return _MISS


class _QuickValue:
    """A parameter's runtime coercion (Typer's ``RuntimeParam`` interface: ``coerce``) that
    builds Typer's own only for a value it does not take itself."""

    def __init__(self, descriptor: Any, quick: Callable[[Any, Any], Any],
                 build: Callable[[Any], Any]) -> None:
        self.descriptor = descriptor
        self.quick = quick
        self.build = build
        self.real: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:  # as RuntimeParam.coerce, which builds nothing for it
            return () if param.multiple or param.nargs == -1 else None
        multi = param.multiple or param.nargs == -1
        if multi == (self.descriptor.annotation == list[str]):
            result = self.quick(value, ctx)
            if result is not _MISS:
                return result
        if self.real is None:
            self.real = self.build(self.descriptor)
        return self.real.coerce(value, param=param, ctx=ctx)


def quick_values() -> bool:
    """Typer's parameters take plain values without pydantic (see the module's doc). False
    where this Typer has no such hook (older Typers check values with click's types)."""
    try:
        from typer import core
    except ImportError:  # pragma: no cover
        return False
    param_cls = getattr(core, "_TyperParameter", None)
    build = getattr(core, "build_runtime_param", None)
    if param_cls is None or build is None or not hasattr(param_cls, "get_runtime_param"):
        return False
    if getattr(param_cls.get_runtime_param, "batchyard_quick", False):
        return True

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            quick = _quick_for(self.type_descriptor) or _no_quick
            self._runtime_param = _QuickValue(self.type_descriptor, quick, build)
        return self._runtime_param

    get_runtime_param.batchyard_quick = True  # type: ignore[attr-defined]
    param_cls.get_runtime_param = get_runtime_param
    return True


# Rich help without markdown, tracebacks and emoji codes ----------------------------------------

# (module, class) typer.rich_utils imports at its top but uses only in markdown mode and for
# pretty tracebacks.
RICH_EXTRAS = (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback"))


def _stand_in(module: str, attr: str, stub: types.ModuleType) -> type:
    """A class standing for ``module.attr``: making one, its attributes (``from_exception``)
    and isinstance checks import and use the real class."""

    def real() -> Any:
        if sys.modules.get(module) is stub:  # still loading typer.rich_utils
            raise ImportError(f"{module} is not loaded yet")
        return getattr(importlib.import_module(module), attr)

    class Deferred(type):
        def __getattr__(cls, name: str) -> Any:
            return getattr(real(), name)

        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, real())

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, real())

    def new(cls: type, *args: Any, **kwargs: Any) -> Any:
        return real()(*args, **kwargs)

    stand_in = Deferred(attr, (), {"__new__": new, "__module__": module})
    return stand_in


class _RichHelpLoader:
    """Loads typer.rich_utils with the stand-ins in place of ``RICH_EXTRAS``' modules, which
    are gone from ``sys.modules`` afterwards (a later import gets the real ones). Anything
    unexpected: loaded again the plain way."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stubs = {}
        for name, attr in RICH_EXTRAS:
            if name not in sys.modules:
                stub = types.ModuleType(name)
                setattr(stub, attr, _stand_in(name, attr, stub))
                stubs[name] = sys.modules[name] = stub
        try:
            self.loader.exec_module(module)
        except ImportError:
            self._unstub(stubs)
            self.loader.exec_module(module)
        finally:
            self._unstub(stubs)
        lazy_emoji_codes()

    @staticmethod
    def _unstub(stubs: dict[str, types.ModuleType]) -> None:
        for name, stub in stubs.items():
            if sys.modules.get(name) is stub:
                del sys.modules[name]


class _RichHelpFinder:
    """Finds typer.rich_utils (imported by Typer when it first prints help or an error) for
    `_RichHelpLoader`; once."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "typer.rich_utils":
            return None
        from importlib.machinery import PathFinder

        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RichHelpLoader(spec.loader)  # type: ignore[assignment]
        return spec


def defer_rich_help_extras() -> None:
    """Typer's rich help module, when it loads, loads without rich's markdown and traceback
    modules (see the module's doc)."""
    if "typer.rich_utils" in sys.modules or any(isinstance(f, _RichHelpFinder)
                                                 for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _RichHelpFinder())


def lazy_emoji_codes() -> None:
    """Rich's markup loads its table of emoji codes (rich._emoji_codes, ~2 ms) whenever it
    renders a text, for the ``:name:`` codes it replaces: with this, its replacement runs (and
    loads the table) only for a text its own pattern matches (two colons with no space
    between), and any other text is left as it is, as the replacement would leave it. Rich
    unlike the one expected: left as it is."""
    markup = sys.modules.get("rich.markup")
    real = getattr(markup, "_emoji_replace", None)
    if real is None or getattr(real, "batchyard_lazy", False):
        return
    # its pattern: the compiled pattern whose ``sub`` is the replacement's default argument
    patterns = [getattr(d, "__self__", None) for d in getattr(real, "__defaults__", None) or ()]
    found = [p for p in patterns if isinstance(p, re.Pattern)]
    if len(found) != 1:
        return
    search = found[0].search

    def _emoji_replace(text: str, *args: Any, **kwargs: Any) -> Any:
        if ":" not in text or search(text) is None:
            return text
        return real(text, *args, **kwargs)

    _emoji_replace.batchyard_lazy = True  # type: ignore[attr-defined]
    markup._emoji_replace = _emoji_replace  # type: ignore[union-attr]
