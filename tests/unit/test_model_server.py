"""The local model server's thread count: the CPUs it may use, not the host's."""
from __future__ import annotations

import os

import pytest

from memstream.stack.model_server import usable_cpus


@pytest.mark.parametrize("cpu_max, most", [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000\n", 1),
                                            ("garbled\n", None)])
def test_the_server_uses_the_cpus_its_affinity_and_quota_allow(tmp_path, cpu_max, most):
    allowed = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text(cpu_max)
    assert usable_cpus(tmp_path / "cpu.max") == (allowed if most is None else min(allowed, most))
    assert usable_cpus(tmp_path / "absent") == allowed


@pytest.mark.parametrize("listed, name", [
    ({"data": [{"id": "qwen2.5-1.5b"}]}, "qwen2.5-1.5b"),  # the alias serve gives: not cut at ".5b"
    ({"data": [{"id": "/cache/models/minilm.gguf"}]}, "minilm"),  # another server: its file's name
    ({"data": []}, None), ({"models": []}, None)])
def test_a_server_is_named_by_the_model_it_lists(listed, name):
    import http.server
    import json
    import threading

    from memstream.stack.model_server import serving

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(listed).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    with http.server.HTTPServer(("127.0.0.1", 0), Models) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            assert serving(server.server_address[1]) == name
        finally:
            server.shutdown()
