"""Emulated hosts for multi-node tests: network namespaces joined by veth pairs.

Each host is a network namespace with one interface, ``eth0``, holding an address of a
private test range; a bridge in one more namespace joins them, so nothing is added to the
machine's own network. Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2.
"""

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.213.7"  # inside the namespaces only


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str
    hostname: str
    interface: str = "eth0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def namespaces_unavailable() -> str | None:
    """Why namespaces cannot be made here (``None`` when they can)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if shutil.which("unshare") is None:
        return "util-linux's `unshare` is not installed"
    probe = f"lhprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as err:
        return f"`ip netns add` failed ({err.stderr.strip() or err.returncode}); it needs root"
    try:  # everything hosts() and command_on() do, once
        _ip("-n", probe, "link", "add", "br0", "type", "bridge")
        _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "eth0")
        subprocess.run(
            command_on(Host(probe, "", "lhprobe"), ["true"]),
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as err:
        command = " ".join(err.cmd)
        return f"`{command}` failed in a probe namespace ({err.stderr.strip() or err.returncode})"
    finally:
        _ip("netns", "del", probe)
    return None


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


NETNS_ETC = Path("/etc/netns")  # `ip netns exec` mounts <dir>/<namespace>/hosts on /etc/hosts


@contextmanager
def hosts(count: int, tag: str | None = None) -> Iterator[list[Host]]:
    """``count`` hosts on one bridge; every namespace is removed afterwards, even on error.

    Host ``i`` is called ``hetero-node<i>``; each namespace gets an ``/etc/hosts`` naming
    all of them (through ``ip netns exec``'s per-namespace configuration files), since
    torchrun's rendezvous resolves the local host name.
    """
    tag = tag or f"lh{os.getpid()}"
    bridge_ns = f"{tag}br"
    made: list[str] = []
    etc_existed = NETNS_ETC.exists()
    try:
        _ip("netns", "add", bridge_ns)
        made.append(bridge_ns)
        _ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge_ns, "link", "set", "br0", "up")
        result = []
        for i in range(count):
            ns, address = f"{tag}h{i}", f"{SUBNET}.{i + 1}"
            _ip("netns", "add", ns)
            made.append(ns)
            # the pair is created in the bridge's namespace, then one end moves to the host
            _ip("-n", bridge_ns, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0")
            _ip("-n", bridge_ns, "link", "set", "eth0", "netns", ns)
            _ip("-n", bridge_ns, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            result.append(Host(ns, address, f"hetero-node{i}"))
        names = "".join(f"{host.address} {host.hostname}\n" for host in result)
        for host in result:
            etc = NETNS_ETC / host.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        yield result
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        if not etc_existed and NETNS_ETC.exists() and not any(NETNS_ETC.iterdir()):
            NETNS_ETC.rmdir()


def command_on(host: Host, argv: list[str]) -> list[str]:
    """``argv`` run inside ``host``'s namespace under its own host name (a UTS namespace)."""
    script = 'printf %s "$0" > /proc/sys/kernel/hostname && exec "$@"'
    namespace = ["ip", "netns", "exec", host.namespace]
    return [*namespace, "unshare", "--uts", "sh", "-c", script, host.hostname, *argv]
