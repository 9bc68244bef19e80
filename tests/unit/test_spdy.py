"""The SPDY/3.1 framing kubectl's port-forward speaks (app/sessions/spdy.py), against frames
built here as a client builds them: frames split anywhere, header blocks over one zlib stream
per direction, and every bound a peer could push."""

from __future__ import annotations

import struct
import zlib

import pytest

from app.sessions import spdy


class Client:
    """The client's side: SYN_STREAMs with compressed headers, DATA, PING."""

    def __init__(self) -> None:
        self.deflate = zlib.compressobj(zdict=spdy.DICTIONARY)
        self.inflate = zlib.decompressobj(zdict=spdy.DICTIONARY)

    def block(self, headers: dict[str, str]) -> bytes:
        raw = struct.pack("!I", len(headers)) + b"".join(
            struct.pack("!I", len(k)) + k.encode() + struct.pack("!I", len(v)) + v.encode()
            for k, v in headers.items()
        )
        return self.deflate.compress(raw) + self.deflate.flush(zlib.Z_SYNC_FLUSH)

    def syn_stream(self, stream_id: int, headers: dict[str, str]) -> bytes:
        body = struct.pack("!IIBB", stream_id, 0, 0, 0) + self.block(headers)
        return struct.pack("!HHI", 0x8003, spdy.SYN_STREAM, len(body)) + body


def test_streams_data_and_pings_split_anywhere() -> None:
    client, server = Client(), spdy.Connection()
    wire = (
        client.syn_stream(1, {"streamtype": "error", "port": "8080", "requestid": "0"})
        + client.syn_stream(3, {"streamtype": "data", "port": "8080", "requestid": "0"})
        + struct.pack("!II", 3, 5)
        + b"hello"
        + struct.pack("!II", 3, spdy.FLAG_FIN << 24)
        + struct.pack("!HHII", 0x8003, spdy.PING, 4, 7)
    )
    frames = [f for i in range(len(wire)) for f in server.feed(wire[i : i + 1])]  # byte by byte
    assert [(f.kind, f.stream_id) for f in frames] == [
        (spdy.SYN_STREAM, 1),
        (spdy.SYN_STREAM, 3),
        (0, 3),
        (0, 3),
        (spdy.PING, 0),
    ]
    assert frames[0].headers == {"streamtype": "error", "port": "8080", "requestid": "0"}
    assert frames[1].headers["streamtype"] == "data"  # the second block, same zlib stream
    assert frames[2].data == b"hello" and not frames[2].fin
    assert frames[3].data == b"" and frames[3].fin
    assert frames[4].value == 7


def test_what_the_server_writes_reads_back() -> None:
    client, server = Client(), spdy.Connection()
    for stream_id in (1, 3):  # two replies: the compressor's state carries over
        reply = server.reply_frame(stream_id)
        assert struct.unpack("!HH", reply[:4]) == (0x8003, spdy.SYN_REPLY)
        assert int.from_bytes(reply[5:8], "big") == len(reply) - 8
        assert struct.unpack("!I", reply[8:12])[0] == stream_id
        assert client.inflate.decompress(reply[12:]) == struct.pack("!I", 0)  # no headers
    data = server.data_frames(3, b"x" * 100_000, fin=True)  # two frames, FIN on the last
    first = struct.unpack("!II", data[:8])
    assert first == (3, 65536)
    second = struct.unpack("!II", data[8 + 65536 : 16 + 65536])
    assert second == (3, (spdy.FLAG_FIN << 24) | (100_000 - 65536))
    assert server.ping_frame(9) == struct.pack("!HHII", 0x8003, spdy.PING, 4, 9)


def test_a_peer_cannot_push_past_the_bounds() -> None:
    client = Client()
    with pytest.raises(spdy.ProtocolError, match="a frame of"):
        spdy.Connection().feed(struct.pack("!II", 1, spdy.MAX_FRAME + 1))
    bomb = {"x": "a" * (spdy.MAX_HEADER_BLOCK + 1)}  # compresses to little, inflates past it
    with pytest.raises(spdy.ProtocolError, match="more than"):
        spdy.Connection().feed(client.syn_stream(1, bomb))
    many = {f"h{i}": "v" for i in range(spdy.MAX_HEADERS + 1)}
    with pytest.raises(spdy.ProtocolError, match="headers in one block"):
        spdy.Connection().feed(Client().syn_stream(1, many))
    with pytest.raises(spdy.ProtocolError, match="does not decompress"):
        spdy.Connection().feed(struct.pack("!HHI", 0x8003, spdy.SYN_STREAM, 14) + b"\0" * 14)
    with pytest.raises(spdy.ProtocolError, match="version 2"):
        spdy.Connection().feed(struct.pack("!HHII", 0x8002, spdy.PING, 4, 1))
