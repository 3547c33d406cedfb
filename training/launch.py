"""Training on several hosts, launched safely: `python -m training.launch --nodes 2 --node-rank <0|1>
--master <first host's job-network address>:29400 --iface <job-network interface> -- train --config ...`.

It runs PyTorch's launcher (torchrun) with a static rendezvous, never the c10d one: torchrun's c10d
rendezvous keeps its state pickled in a TCPStore that listens on every interface and unpickles whatever
is written there, so anyone who reaches its port runs code in the agent. The static rendezvous reads
nothing pickled (the agent's rank assignment is JSON), the process group's sockets are bound to the job
network's interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME), and a master address outside private,
loopback or link-local ranges is refused. The store itself still listens on every interface (torch has
no bind address and no shared secret for it): the firewall rule in docs/training-on-hosts.md keeps its
port to the job's hosts (docs/decisions/safe-launch.md).
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import os
import socket
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interface_address(name: str) -> str | None:
    """`name`'s IPv4 address, None when it has none; ValueError for an interface this host lacks."""
    if name not in {n for _, n in socket.if_nameindex()}:
        raise ValueError(f"--iface {name!r}: no such interface on this host")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])


def check_master(host: str, *, iface: str, node_rank: int, public_ok: bool) -> None:
    """A master address the job network can own: an IP on a private network (a name is resolved first);
    on the first node, the address of `iface` itself, so the others reach its store over that network."""
    try:
        addr = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--master {host!r} does not resolve to an IPv4 address") from exc
    if not (addr.is_private or addr.is_loopback or addr.is_link_local) and not public_ok:
        raise ValueError(
            f"--master {host} is a public address: the rendezvous store would answer the internet. Use the job's "
            "private network, or pass --public-network-ok with the firewall rule of docs/training-on-hosts.md in place"
        )
    own = interface_address(iface)
    if node_rank == 0 and own != str(addr):
        raise ValueError(f"--master {host} is not {iface}'s address ({own or 'none'}) on the first node")


def command(args: argparse.Namespace, rest: list[str]) -> tuple[list[str], dict[str, str]]:
    """The torchrun command line and its environment."""
    host, _, port = args.master.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--master {args.master!r}: give HOST:PORT")
    check_master(host, iface=args.iface, node_rank=args.node_rank, public_ok=args.public_network_ok)
    if not rest or rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise ValueError("give the training command after --, e.g. -- train --config training/configs/x.toml")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.nodes)]
    argv += ["--nproc-per-node", str(args.procs), "--node-rank", str(args.node_rank)]
    argv += ["--rdzv-backend", "static", "--master-addr", host, "--master-port", port]
    argv += ["-m", "training", *rest]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": args.iface, "NCCL_SOCKET_IFNAME": args.iface}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return argv, env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, required=True, help="hosts in the job")
    p.add_argument("--node-rank", type=int, required=True, help="this host's rank, 0 on the first host")
    p.add_argument("--procs", type=int, default=1, help="ranks on this host (one a GPU on a GPU host)")
    p.add_argument("--master", required=True, help="HOST:PORT of the first host on the job network")
    p.add_argument("--iface", required=True, help="this host's job-network interface (eth1, ens5, lo ...)")
    p.add_argument("--public-network-ok", action="store_true", help="allow a public master address")
    args, rest = p.parse_known_args(argv)
    if not 0 <= args.node_rank < args.nodes:
        p.error(f"--node-rank {args.node_rank} is not in [0, {args.nodes})")
    try:
        cmd, env = command(args, rest)
    except ValueError as exc:
        p.error(str(exc))
    os.execve(cmd[0], cmd, env)
    return 0  # not reached: the launcher replaced this process


if __name__ == "__main__":
    sys.exit(main())
