"""The ports and addresses of the channels besides the process group, and the Ray extra."""

import importlib
import sys
from unittest import mock

import pytest

from lightning_hetero.paramserver import RPC_PORT_ENV, ServerClient, rpc_port


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
        mock.patch("torch.distributed.broadcast_object_list"),
        mock.patch("torch.distributed.rpc.init_rpc", side_effect=RuntimeError("Address in use")),
        mock.patch("torch.distributed.rpc.TensorPipeRpcBackendOptions"),
        pytest.raises(RuntimeError, match="Address in use") as caught,
    ):
        ServerClient.init_rpc(0, 2, "10.1.2.3", 30.0, main_port=29500)
    notes = "\n".join(getattr(caught.value, "__notes__", [])) + str(caught.value)
    assert "10.1.2.3:29501" in notes and RPC_PORT_ENV in notes


def test_the_ray_module_without_ray_names_the_extra(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    monkeypatch.delitem(sys.modules, "lightning_hetero.integrations.ray", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'lightning_hetero\[ray\]'"):
        importlib.import_module("lightning_hetero.integrations.ray")
