"""Where batchyard keeps its state and how a client finds its server.

Everything hangs off ``$BATCHYARD_HOME`` (default ``~/.batchyard``): the SQLite database, the
API token (mode 0600), the server's address file and log, the server's TLS CA (``tls/``) and the
job directories. A home batchyard creates is its owner's only (0700), and so are the token,
the database and the server's log and address file (0600, ``private_file``): the database
holds job specs and sealed secrets, the log may quote them.
"""

from __future__ import annotations

import json
import os
import stat

# What a CLI call reads here (the home, its token and address file, a CA) goes through
# os.path: pathlib, dataclasses and secrets cost a short command more than its own work
# (issue 37), so they load only where used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def home_dir() -> str:
    """`home` as a string (made if missing)."""
    path = os.path.expanduser(os.environ.get("BATCHYARD_HOME")
                              or os.path.join(os.path.expanduser("~"), ".batchyard"))
    if not os.path.isdir(path):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            os.mkdir(path, PRIVATE_DIR)
            os.chmod(path, PRIVATE_DIR)  # whatever the umask: the home is its owner's
        except FileExistsError:
            pass  # made meanwhile by another process (which made it private)
    return path


def home() -> Path:
    from pathlib import Path

    return Path(home_dir())


def private_file(path: Path, *, create: bool = True) -> Path:
    """``path`` readable and writable by its owner only: created empty with mode 0600 if
    missing (unless ``create`` is false), its group and other bits taken off if it has any.
    A link is left alone (never followed)."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE)
    except OSError:
        return path
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            os.fchmod(fd, mode & ~0o077 & 0o7777)
    finally:
        os.close(fd)
    return path


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL (None for other databases or memory)."""
    if not url.startswith("sqlite"):
        return None
    from pathlib import Path

    from sqlalchemy.engine import make_url  # lazily: the CLI imports this module

    database = make_url(url).database
    return Path(database) if database and database != ":memory:" else None


def make_state_private() -> None:
    """What the server keeps in the home, its owner's only: the database (and SQLite's
    journal files, which take the database's mode), the server's log, address and lock
    files. Called by the server when it starts, before it opens the database."""
    db = sqlite_path(database_url())
    if db is not None:
        private_file(db)
        for suffix in ("-wal", "-shm", "-journal"):
            private_file(db.with_name(db.name + suffix), create=False)
    for name in ("server.log", "server.json", "server.lock"):
        private_file(home() / name, create=name != "server.json")


def data_root() -> Path:
    """Root of workspace/cluster directories (DESIGN §5)."""
    from pathlib import Path

    return Path(os.environ.get("BATCHYARD_DATA_ROOT") or home())


def database_url() -> str:
    return os.environ.get("BATCHYARD_DB_URL") or f"sqlite:///{home() / 'batchyard.db'}"


def token_path() -> Path:
    return home() / "token"


def server_file() -> Path:
    return home() / "server.json"


def read_token() -> str | None:
    """The token a client sends: BATCHYARD_TOKEN, else the home's."""
    env = os.environ.get("BATCHYARD_TOKEN")
    if env:
        return env.strip()
    return home_token()


def home_token() -> str | None:
    """The home's own token (the server's admin token), never the environment's: a user's
    personal token in BATCHYARD_TOKEN must not become the admin token of a server started
    with it."""
    try:
        with open(os.path.join(home_dir(), "token")) as fh:
            return fh.read().strip() or None
    except FileNotFoundError:
        return None


def ensure_token() -> str:
    """Create the admin token on first start, readable by its owner only."""
    existing = home_token()
    if existing:
        return existing
    import secrets

    token = secrets.token_urlsafe(32)
    path = token_path()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


class ServerInfo:
    """Where a server answers, and its process (None: not this home's)."""

    __slots__ = ("pid", "url")

    def __init__(self, url: str, pid: int | None) -> None:
        self.url = url
        self.pid = pid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServerInfo) and (self.url, self.pid) == (other.url, other.pid)

    def __hash__(self) -> int:
        return hash((self.url, self.pid))

    def __repr__(self) -> str:
        return f"ServerInfo(url={self.url!r}, pid={self.pid!r})"


def read_server_info() -> ServerInfo | None:
    env = os.environ.get("BATCHYARD_SERVER")
    if env:
        return ServerInfo(url=env.rstrip("/"), pid=None)
    try:
        with open(os.path.join(home_dir(), "server.json")) as fh:
            data = json.loads(fh.read())
    except (FileNotFoundError, ValueError):
        return None
    return ServerInfo(url=str(data["url"]), pid=data.get("pid"))


def write_server_info(url: str, pid: int) -> None:
    path = server_file()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"url": url, "pid": pid}))
    os.replace(tmp, path)


def ca_file(server_url: str | None = None) -> str | None:
    """The CA file an https server URL is verified against, or None for the system CAs.

    In order: ``BATCHYARD_CA`` (a CA file), the home's own ``tls/ca.pem`` (a CLI or SDK that
    shares the server's home trusts it without being told), a CA fetched once and checked
    against the ``BATCHYARD_CA_SHA256`` pin (cached as ``tls/pinned-<first16>.pem``).
    ``server_url`` (default: the configured server) is where a pinned CA is fetched from.
    """
    from batchyard import errors

    env = os.environ.get("BATCHYARD_CA")
    if env:
        from pathlib import Path

        path = Path(env).expanduser()
        if not path.is_file():
            raise errors.UserError(f"BATCHYARD_CA={env}: no such CA file")
        return str(path)
    own = os.path.join(home_dir(), "tls", "ca.pem")
    if os.path.isfile(own):
        return str(home() / "tls" / "ca.pem")  # (as pathlib spells it)
    pin = os.environ.get("BATCHYARD_CA_SHA256")
    if pin:
        return _pinned_ca(pin, server_url)
    return None


def _pinned_ca(pin: str, server_url: str | None) -> str | None:
    """The pinned CA from the cache, else fetched from the server and checked against the pin
    (the cache is re-checked too: a pin changed by hand must not keep trusting the old CA)."""
    from batchyard import errors, tlstrust

    want = tlstrust.normalize_pin(pin)
    cache = home() / "tls" / f"pinned-{want[:16]}.pem"
    try:
        if tlstrust.fingerprint_pem(cache.read_text()) == want:
            return str(cache)
    except (OSError, ValueError):
        pass
    if server_url is None:
        info = read_server_info()
        server_url = info.url if info else None
    if not server_url or not server_url.startswith("https:"):
        return None  # nothing to verify, or nowhere to fetch the CA from yet
    try:
        pem = tlstrust.fetch_pinned_ca(server_url, want)
    except tlstrust.PinMismatch as exc:
        raise errors.AuthError(str(exc)) from None
    except OSError as exc:
        raise errors.ServerUnavailable(f"cannot fetch the CA of {server_url} to check the "
                                       f"BATCHYARD_CA_SHA256 pin: {exc}") from None
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    tmp.write_text(pem)
    os.replace(tmp, cache)
    return str(cache)
