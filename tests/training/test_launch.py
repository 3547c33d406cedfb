"""The multi-host launch checks what it is given before it starts torchrun."""

from __future__ import annotations

import pytest

from training.launch import command, main


def _args(*extra: str) -> list[str]:
    return ["--nodes", "2", "--node-rank", "0", "--iface", "lo", *extra]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (["--master", "8.8.8.8:29400"], "public address"),
        (["--master", "127.0.0.2:29400"], "not lo's address"),
        (["--master", "127.0.0.1"], "give HOST:PORT"),
        (["--master", "no-such-host.invalid:29400"], "does not resolve"),
        (["--master", "127.0.0.1:29400", "--iface", "no-such-if0"], "no such interface"),
        (["--master", "127.0.0.1:29400", "--node-rank", "2"], "is not in [0, 2)"),
        (["--master", "127.0.0.1:29400"], "give the training command after --"),
    ],
)
def test_refuses_what_would_expose_or_break_the_job(
    given: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(_args(*given))
    assert stopped.value.code == 2 and says in capsys.readouterr().err


def test_a_static_rendezvous_on_the_job_network() -> None:
    import argparse

    args = argparse.Namespace(
        nodes=2, node_rank=1, procs=1, master="127.0.0.1:29400", iface="lo", public_network_ok=False
    )
    argv, env = command(args, ["--", "train", "--config", "x.toml"])
    at = argv.index("--rdzv-backend")
    assert argv[at + 1] == "static" and "c10d" not in argv
    assert argv[argv.index("--master-addr") + 1] == "127.0.0.1" and argv[argv.index("--master-port") + 1] == "29400"
    assert argv[-5:] == ["-m", "training", "train", "--config", "x.toml"]
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
