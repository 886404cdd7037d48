"""The MPI relay's shortcut between launchers of one attempt on one machine
(node/relaysock.py): the command reaches the target launcher's exec socket without the
server, its exit code comes back when it ends, a launcher that ends first gives 255, and
where no launcher listens (another machine) the server relays it as before."""

from __future__ import annotations

import subprocess
import threading
import uuid
from pathlib import Path

from batchyard.launchplan import Ticket
from batchyard.node.channel import Channel
from batchyard.node.launcher import write_rsh_agent
from batchyard.node.plan import AttemptPaths
from batchyard.node.relaysock import ExecSocket, RelaySocket, _local_relay, exec_socket_path


class Target:
    """A launcher's exec socket whose execs 'end' with the code the test says."""

    def __init__(self, attempt: str, rank: int) -> None:
        self.commands: list[str] = []
        self.submitted = threading.Event()
        self.sock = ExecSocket(exec_socket_path(attempt, rank), self.submit, lambda _m: None)

    def submit(self, command: str) -> str:
        self.commands.append(command)
        self.submitted.set()
        return f"1-local-{len(self.commands)}"


def test_a_local_exec_answers_its_exit_code_when_it_ends() -> None:
    attempt = f"test-{uuid.uuid4()}"
    target = Target(attempt, 1)
    try:
        threading.Timer(0.2, lambda: target.sock.done("1-local-1", 9)).start()
        assert _local_relay(exec_socket_path(attempt, 1), "orted --x 'y'") == 9
        assert target.commands == ["orted --x 'y'"]
    finally:
        target.sock.close()


def test_a_launcher_that_ends_first_gives_255_and_none_listening_gives_none() -> None:
    attempt = f"test-{uuid.uuid4()}"
    target = Target(attempt, 1)
    path = exec_socket_path(attempt, 1)
    threading.Thread(target=lambda: (target.submitted.wait(10), target.sock.close()),
                     daemon=True).start()
    assert _local_relay(path, "orted") == 255
    assert _local_relay(path, "orted") is None  # (gone: the server relays it)
    assert _local_relay(exec_socket_path(attempt, 2), "orted") is None


def test_the_agent_goes_to_the_launcher_on_this_machine_not_the_server(tmp_path: Path) -> None:
    attempt = f"test-{uuid.uuid4()}"
    target = Target(attempt, 1)
    # a server that is not there: only the shortcut can answer
    ticket = Ticket(server="http://127.0.0.1:9", token="t", attempt=attempt, node_rank=0,
                    node_dir=str(tmp_path))
    relay = RelaySocket(tmp_path / "attempt" / ".batchyard" / "rsh.sock", Channel(ticket),
                        lambda _m: None,
                        lambda host: exec_socket_path(attempt, 1) if host == "n-1" else None)
    agent = write_rsh_agent(AttemptPaths(tmp_path / "attempt"), relay.path)
    try:
        threading.Timer(0.3, lambda: target.sock.done("1-local-1", 3)).start()
        done = subprocess.run([str(agent), "-x", "n-1", "orted", "-mca", "a", "b"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 3, done.stderr
        assert target.commands == ["orted -mca a b"]
    finally:
        relay.close()
        target.sock.close()
