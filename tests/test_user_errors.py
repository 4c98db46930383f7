"""The errors a new user meets on the way, each one line that says what to do."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from cli_errors import one_error_line


def test_paper_scale_outside_a_checkout_says_what_it_is_for(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as from a wheel: no results/ here
    line = one_error_line(capsys, ["paper-scale"])
    assert "regenerates the repository's docs/paper-scale.md from its results/ files" in line
    assert "--results DIR" in line and "fedhet docs paper-scale" in line
    assert not (tmp_path / "docs").exists()


def test_a_protocol_with_a_presets_flag_names_both_ways_out(capsys, tmp_path):
    line = one_error_line(capsys, ["reproduce", "fedveca", "--protocol", "fair", "--scale", "smoke",
                                   "--out", str(tmp_path / "o")])
    assert "`fedhet reproduce fedveca --scale smoke`" in line  # the preset, without --protocol
    assert "`fedhet reproduce fedveca --protocol fair -r 20`" in line  # or the protocol, sized
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--timeout", "--round-timeout", "--node-wait"])
def test_a_deploy_time_limit_of_zero_is_refused_as_the_flags_are_read(capsys, tmp_path, flag):
    line = one_error_line(capsys, ["deploy", "local", flag, "0", "--out", str(tmp_path / "o")])
    assert f"argument {flag}: must be a positive number of seconds, got '0'" in line
    assert not (tmp_path / "o").exists()


def _silent_server() -> tuple[socket.socket, int]:
    """A port that accepts connections and never says a word (a firewall, a proxy)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held = []

    def accept() -> None:
        while server.fileno() != -1:
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def test_a_ray_address_without_a_cluster_fails_at_once(capsys, tmp_path):
    pytest.importorskip("flwr")
    pytest.importorskip("grpc")
    from fedhet.deploy.launch import free_port, probe_ray_address
    from fedhet.errors import FedhetError

    out = tmp_path / "o"
    start = time.monotonic()
    line = one_error_line(capsys, ["deploy", "local", "--simulation", "--ray-address",
                                   f"127.0.0.1:{free_port()}", "-n", "2", "-r", "1", "--out", str(out)])
    assert time.monotonic() - start < 30  # not the SuperNodes' 75 s wait
    assert "no Ray cluster answers there (nothing listens there)" in line
    assert "ray start --head" in line and "leave --ray-address out" in line
    assert not out.exists()  # checked before anything is written or started
    server, port = _silent_server()
    try:
        with pytest.raises(FedhetError, match=r"no Ray cluster answers there \(no answer within 1 s\)"):
            probe_ray_address(f"127.0.0.1:{port}", timeout=1.0)
    finally:
        server.close()
    with pytest.raises(FedhetError, match="give HOST:PORT of the Ray cluster's head"):
        probe_ray_address("head-node")
    probe_ray_address("auto")  # left to Ray
    probe_ray_address("local")


def test_a_server_that_is_not_ray_is_no_cluster():
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from fedhet.deploy.launch import probe_ray_address
    from fedhet.errors import FedhetError

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(FedhetError, match=r"\(a server answers, but not Ray's\)"):
            probe_ray_address(f"127.0.0.1:{port}", flag="RAY_ADDRESS")
    finally:
        server.stop(0)


def test_a_head_with_token_authentication_answers_the_probe():
    """Ray's GCS with `RAY_AUTH_MODE=token` refuses a call without the token (UNAUTHENTICATED):
    that is a Ray head answering, not "no cluster" (Ray's own connection sends the token)."""
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from fedhet.deploy.launch import probe_ray_address

    class NoToken(grpc.ServerInterceptor):
        def intercept_service(self, continuation, details):  # noqa: ANN001, ANN202
            def refuse(request, context):  # noqa: ANN001, ANN202
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken")
            return grpc.unary_unary_rpc_method_handler(refuse)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), interceptors=[NoToken()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        probe_ray_address(f"127.0.0.1:{port}", timeout=5.0)  # no error
    finally:
        server.stop(0)


def test_readme_memory_figures_name_their_command_and_commit():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    at = readme.index("Memory of a round does not grow with its clients")
    paragraph = " ".join(readme[at:readme.index("\n- **", at)].split())
    assert "python benchmarks/bench_memory.py --algorithm scaffold --clients 1000" in paragraph
    assert "commit" in paragraph
