"""The ports and addresses of the channels besides the process group, and the Ray extra."""

import importlib
import socket
import sys
from unittest import mock

import pytest

from lightning_hetero.paramserver import RPC_PORT_ENV, ServerClient, _usable_rpc_port, rpc_port


def test_the_rpc_port_follows_the_jobs_main_port() -> None:
    assert rpc_port(29500, environ={}) == 29501
    assert rpc_port(41000, environ={RPC_PORT_ENV: ""}) == 41001  # empty: unset


def test_the_rpc_port_is_set_by_its_environment_variable(monkeypatch) -> None:
    assert rpc_port(29500, environ={RPC_PORT_ENV: " 40123 "}) == 40123
    monkeypatch.setenv(RPC_PORT_ENV, "40124")
    assert rpc_port(29500) == 40124  # the process's environment by default


@pytest.mark.parametrize("value", ["http", "0", "65536", "-3", "29500.5"])
def test_a_bad_rpc_port_is_refused_with_the_variable_named(value: str) -> None:
    with pytest.raises(ValueError, match=rf"{RPC_PORT_ENV}={value!r} is no TCP port"):
        rpc_port(29500, environ={RPC_PORT_ENV: value})


def test_a_main_port_without_a_port_after_it_asks_for_the_variable() -> None:
    with pytest.raises(ValueError, match=rf"65535.*set {RPC_PORT_ENV}"):
        rpc_port(65535, environ={})


def test_rank_0_listens_at_the_main_address_on_its_port_and_every_rank_follows(
    monkeypatch,
) -> None:
    """Rank 0's choice is broadcast, so the ranks agree whatever their own environment says."""
    monkeypatch.setenv(RPC_PORT_ENV, "40200")
    broadcast = mock.Mock(side_effect=lambda objects, src: objects.__setitem__(0, 40200))
    with (
        mock.patch("torch.distributed.broadcast_object_list", broadcast),
        mock.patch("torch.distributed.rpc.init_rpc") as init_rpc,
        mock.patch("torch.distributed.rpc.TensorPipeRpcBackendOptions") as options,
    ):
        ServerClient.init_rpc(1, 2, "10.1.2.3", 30.0, main_port=29500)
    assert broadcast.call_args.args[0] == [40200] and broadcast.call_args.kwargs == {"src": 0}
    options.assert_called_once_with(init_method="tcp://10.1.2.3:40200", rpc_timeout=30.0)
    assert init_rpc.call_args.kwargs["rank"] == 1


def test_a_failed_rendezvous_names_the_address_and_the_variable() -> None:
    with (
        mock.patch("lightning_hetero.paramserver._can_listen", return_value=True),
        mock.patch("torch.distributed.broadcast_object_list"),
        mock.patch("torch.distributed.rpc.init_rpc", side_effect=RuntimeError("Address in use")),
        mock.patch("torch.distributed.rpc.TensorPipeRpcBackendOptions"),
        pytest.raises(RuntimeError, match="Address in use") as caught,
    ):
        ServerClient.init_rpc(0, 2, "10.1.2.3", 30.0, main_port=29500)
    notes = "\n".join(getattr(caught.value, "__notes__", [])) + str(caught.value)
    assert "10.1.2.3:29501" in notes and RPC_PORT_ENV in notes


def _busy_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_a_busy_rpc_port_on_one_host_is_replaced_by_a_free_one(monkeypatch) -> None:
    # e.g. MASTER_PORT + 1 taken by another program, or by the store of an earlier fit in
    # this process: on one host no firewall stands between the ranks
    monkeypatch.delenv(RPC_PORT_ENV, raising=False)
    sock, busy = _busy_port()
    with sock:
        chosen = _usable_rpc_port("127.0.0.1", busy - 1)
        assert chosen > 0 and chosen != busy
        assert _usable_rpc_port("localhost", busy - 1) > 0
        sock.close()
        assert _usable_rpc_port("127.0.0.1", busy - 1) == busy  # free again: the usual port


@pytest.mark.parametrize("where", ["variable", "other host"])
def test_a_busy_rpc_port_fails_every_rank_at_once_naming_the_port(monkeypatch, where) -> None:
    # across hosts (or with the port named by the user) rank 0 keeps to the port, and every
    # rank raises at once instead of waiting out torch's 30-minute rendezvous for rank 0
    sock, busy = _busy_port()
    host = "127.0.0.1"
    if where == "variable":
        monkeypatch.setenv(RPC_PORT_ENV, str(busy))
    else:
        monkeypatch.delenv(RPC_PORT_ENV, raising=False)
        host = "10.1.2.3"
    with sock:
        assert _usable_rpc_port(host, busy - 1) == -busy
        for rank in (0, 1):
            broadcast = mock.Mock(side_effect=lambda objects, src: objects.__setitem__(0, -busy))
            with (
                mock.patch("torch.distributed.broadcast_object_list", broadcast),
                mock.patch("torch.distributed.rpc.init_rpc") as init_rpc,
                pytest.raises(RuntimeError, match=rf"rank {rank}: port {busy} on {host}.*in use"),
            ):
                ServerClient.init_rpc(rank, 2, host, 30.0, main_port=busy - 1)
            init_rpc.assert_not_called()


def test_the_ray_module_without_ray_names_the_extra(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    monkeypatch.delitem(sys.modules, "lightning_hetero.integrations.ray", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'lightning_hetero\[ray\]'"):
        importlib.import_module("lightning_hetero.integrations.ray")
