"""What keeping an engine's server process takes, whichever engine it is: a build directory's `server.json` (pid,
command, port) and `server.log`, a start in a session of its own, whether it still runs, its process group's share of
the CPU, and a stop that reaches its workers too. vLLM's servers (app/backends/vllm/processes.py) and TensorRT-LLM's
workers (app/backends/tensorrt_llm/processes.py) are both kept this way."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

SERVER_JSON = "server.json"
SERVER_LOG = "server.log"


def spawn(cmd: list[str], directory: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start `cmd` in the build `directory`, its output appended to its server.log under a line saying so."""
    with open(directory / SERVER_LOG, "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        log.flush()
        # Its own session: stopping it stops the workers it spawns too, and it outlives a CLI that started it.
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, cwd=directory)


def stop_server(server: dict | None, timeout_s: float = 20.0) -> bool:
    """Stop a server.json's process group (SIGTERM, then SIGKILL after `timeout_s`); True when it was running."""
    if not server or not alive(server):
        return False
    try:
        os.killpg(server["pid"], signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and group_alive(server["pid"]):
        time.sleep(0.2)
    if group_alive(server["pid"]):
        try:
            os.killpg(server["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5  # SIGKILL lands asynchronously: reaped before it did, the pid stays a zombie
        while time.monotonic() < deadline and group_alive(server["pid"]):
            time.sleep(0.05)
    reap(server["pid"])
    return True


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return "\n".join(kept[-lines:])


def read_server(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def alive(server: dict) -> bool:
    """The recorded pid still runs the recorded command (a recycled pid runs something else)."""
    try:
        cmdline = Path(f"/proc/{server['pid']}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return [part.decode(errors="replace") for part in cmdline if part] == server["command"]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(fields[0] != "Z" for fields in group_stats(pgid))  # zombies count as gone


def group_members(pgid: int) -> list[tuple[int, list[str]]]:
    """Each process in group `pgid`, its leader first (a server itself, before the workers it spawned): its pid and its
    /proc/PID/stat fields from the state on (field 3 of proc(5))."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if int(fields[2]) == pgid:
                out.append((int(proc.name), fields))
    return sorted(out, key=lambda member: member[0] != pgid)


def group_stats(pgid: int) -> list[list[str]]:
    """/proc/PID/stat of each process in group `pgid`, its fields from the state on (field 3 of proc(5))."""
    return [fields for _, fields in group_members(pgid)]


def group_cpu_seconds(pgid: int) -> float:
    """The CPU seconds a process group has used (an engine's server and its workers), its reaped children's included."""
    return sum(int(f[11]) + int(f[12]) + int(f[13]) + int(f[14]) for f in group_stats(pgid)) / os.sysconf("SC_CLK_TCK")


class GroupShare:
    """The share of this machine's cores a process group got since this was made (at most 1): an engine's counterpart
    of the transformers backend's CpuShare. vLLM's CPU engine runs on every core; others competing for them lower it,
    and a race whose two engine runs got different shares did not run under the same load (traces.speedup_parts)."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self._start = (time.perf_counter(), group_cpu_seconds(pgid))

    def share(self) -> float | None:
        wall, cpu = time.perf_counter() - self._start[0], group_cpu_seconds(self.pgid) - self._start[1]
        if wall <= 0:
            return None
        return round(min(1.0, cpu / (wall * (os.cpu_count() or 1))), 3)


def reap(pid: int, timeout_s: float = 5.0) -> None:
    """Collect a server this process started, once it has exited (a killed process is a zombie until then); a server
    another process started is that one's to collect."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:  # a SIGKILL lands asynchronously: under load, later than the group check
            return
        time.sleep(0.05)


def listening(pgid: int, port: int | None) -> bool:
    """Whether a process of group `pgid` (a server this app spawned in a session of its own) holds the socket listening
    on `port`. A free port is only free when asked: another process (another worker, app or engine on this machine)
    can bind it before the server does, and then answers its /health; a server is ours only where its socket is. A
    record that names no port (None) is never taken for ours."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(fields[9])
    if not inodes:
        return False
    sockets = {f"socket:[{inode}]" for inode in inodes}
    for pid, _ in group_members(pgid):
        try:
            if sockets & {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}:
                return True
        except OSError:
            continue
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class locked:
    """An exclusive lock on a file, across threads (each opens its own) and processes (flock)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
