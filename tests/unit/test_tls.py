"""The TLS files a server makes on first start: whole when read, one CA for starts at once."""

from __future__ import annotations

import multiprocessing
import ssl
import stat
import threading
from pathlib import Path

from cryptography import x509

from app.files import write_whole
from app.tls import ensure_tls


def _start(directory: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait()
    ensure_tls(Path(directory), ["127.0.0.1"])


def test_servers_starting_at_once_on_one_directory_agree_on_one_ca(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    starts = [context.Process(target=_start, args=(str(directory), barrier)) for _ in range(4)]
    for start in starts:
        start.start()
    for start in starts:
        start.join(60)
        assert start.exitcode == 0
    files = ensure_tls(directory, ["127.0.0.1"])  # nothing left to make: reads what they made
    # the server certificate (the last one written) was signed by the CA on disk
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    # and it is the pair a TLS server loads
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(files.cert, files.key)
    for key in (files.key, directory / "ca.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # no file written aside is left behind
    assert sorted(p.name for p in directory.iterdir()) == [
        ".lock",
        "ca.crt",
        "ca.key",
        "server.crt",
        "server.key",
    ]


def test_a_reader_never_sees_a_file_half_written(tmp_path: Path) -> None:
    path = tmp_path / "ca.crt"
    versions = [bytes([65 + i]) * 1_000_000 for i in range(2)]
    write_whole(path, versions[0])
    stop = threading.Event()
    seen: set[int] = set()
    torn: list[int] = []

    def read() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            if data in versions:
                seen.add(versions.index(data))
            else:
                torn.append(len(data))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            write_whole(path, versions[i % 2])
    finally:
        stop.set()
        reader.join()
    assert not torn, f"{len(torn)} reads saw part of a file (sizes {sorted(set(torn))[:5]})"
    assert seen == {0, 1}
