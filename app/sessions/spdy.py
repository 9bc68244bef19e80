"""SPDY/3.1 framing, as much of it as `kubectl port-forward` speaks.

kubectl 1.31 and newer forward ports over a WebSocket whose subprotocol is
`SPDY/3.1+portforward.k8s.io`: the WebSocket's binary messages carry a SPDY connection, byte for
byte (a frame may span messages, a message may hold several frames). On it the client opens two
streams per local connection, each with headers `streamtype` (`error` or `data`), `port` and
`requestid`; the server answers each with a SYN_REPLY, carries the connection's bytes in DATA
frames of the data stream, writes what went wrong to the error stream, and ends both with FIN
(the protocol of the kubelet's port-forward server).

What a server needs of SPDY/3 (draft 3.1): control frames (SYN_STREAM, SYN_REPLY, RST_STREAM,
SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE) and DATA frames; header blocks compressed with
zlib over one stream per direction, primed with the protocol's dictionary. Flow control is not
enforced by kubectl's implementation, and not here.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS = 1, 2, 3, 4
PING, GOAWAY, HEADERS, WINDOW_UPDATE = 6, 7, 8, 9
FLAG_FIN = 0x01
RST_PROTOCOL_ERROR, RST_REFUSED_STREAM, RST_CANCEL = 1, 3, 5
MAX_FRAME = 1 << 20  # a peer's frame: kubectl writes at most 32 KiB of data a frame
MAX_HEADER_BLOCK = 64 * 1024  # decompressed: kubectl's three headers take a few dozen bytes
MAX_HEADERS = 64


class ProtocolError(Exception):
    """The peer broke the protocol: the connection ends."""


def _dictionary() -> bytes:
    """The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): header names and
    common values, each with a 32-bit length, then a run of common text."""
    words = [
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
    ]
    words += ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive"]
    words += ["origin"]
    prefixed = b"".join(struct.pack("!I", len(w)) + w.encode() for w in words)
    text = (
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417502"
        "504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
        "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error"
        "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct "
        "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,"
        "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,"
        "publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
    )
    return prefixed + text.encode()


DICTIONARY = _dictionary()


@dataclass
class Frame:
    """A control frame (`kind` > 0) or a DATA frame (`kind` 0)."""

    kind: int
    flags: int = 0
    stream_id: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    value: int = 0  # a PING's id, a RST_STREAM's or GOAWAY's status, a WINDOW_UPDATE's delta

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


class Connection:
    """One side of a SPDY connection: `feed` the peer's bytes, get its frames; the `*_frame`
    methods give the bytes to send. The two zlib streams live as long as the connection."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._deflate = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zdict=DICTIONARY)

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= 8:
            length = int.from_bytes(self._buffer[5:8], "big")
            if length > MAX_FRAME:
                raise ProtocolError(f"a frame of {length} bytes; at most {MAX_FRAME}")
            if len(self._buffer) < 8 + length:
                break
            head, body = bytes(self._buffer[:8]), bytes(self._buffer[8 : 8 + length])
            del self._buffer[: 8 + length]
            frames.append(self._parse(head, body))
        return frames

    def _parse(self, head: bytes, body: bytes) -> Frame:
        first, flags = struct.unpack("!I", head[:4])[0], head[4]
        if not first & 0x80000000:
            return Frame(0, flags, first & 0x7FFFFFFF, data=body)
        version, kind = (first >> 16) & 0x7FFF, first & 0xFFFF
        if version != VERSION:
            raise ProtocolError(f"SPDY version {version}; this server speaks 3")
        if kind == SYN_STREAM:
            if len(body) < 10:
                raise ProtocolError("a SYN_STREAM shorter than its fields")
            stream_id = struct.unpack("!I", body[:4])[0] & 0x7FFFFFFF
            return Frame(kind, flags, stream_id, headers=self._headers(body[10:]))
        if kind in (SYN_REPLY, HEADERS):
            stream_id = struct.unpack("!I", body[:4])[0] & 0x7FFFFFFF
            return Frame(kind, flags, stream_id, headers=self._headers(body[4:]))
        if kind in (RST_STREAM, WINDOW_UPDATE, GOAWAY) and len(body) >= 8:
            stream_id, value = struct.unpack("!II", body[:8])
            return Frame(kind, flags, stream_id & 0x7FFFFFFF, value=value)
        if kind == PING and len(body) >= 4:
            return Frame(kind, flags, value=struct.unpack("!I", body[:4])[0])
        return Frame(kind, flags, data=body)  # SETTINGS and what a server need not read

    def _headers(self, block: bytes) -> dict[str, str]:
        try:
            raw = self._inflate.decompress(block, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise ProtocolError(f"a header block that does not decompress: {exc}") from None
        if self._inflate.unconsumed_tail:
            raise ProtocolError(f"a header block of more than {MAX_HEADER_BLOCK} bytes")
        try:
            (count,) = struct.unpack_from("!I", raw)
            if count > MAX_HEADERS:
                raise ProtocolError(f"{count} headers in one block; at most {MAX_HEADERS}")
            headers, at = {}, 4
            for _ in range(count):
                (size,) = struct.unpack_from("!I", raw, at)
                name = raw[at + 4 : at + 4 + size].decode()
                at += 4 + size
                (size,) = struct.unpack_from("!I", raw, at)
                headers[name.lower()] = raw[at + 4 : at + 4 + size].decode()
                at += 4 + size
        except (struct.error, UnicodeDecodeError) as exc:
            raise ProtocolError(f"a malformed header block: {exc}") from None
        return headers

    def _control(self, kind: int, flags: int, body: bytes) -> bytes:
        return struct.pack("!HHI", 0x8000 | VERSION, kind, (flags << 24) | len(body)) + body

    def reply_frame(self, stream_id: int) -> bytes:
        """SYN_REPLY with no headers: the stream is accepted."""
        block = self._deflate.compress(struct.pack("!I", 0))
        block += self._deflate.flush(zlib.Z_SYNC_FLUSH)
        return self._control(SYN_REPLY, 0, struct.pack("!I", stream_id) + block)

    def data_frames(self, stream_id: int, data: bytes, *, fin: bool = False) -> bytes:
        out = bytearray()
        step = 64 * 1024
        chunks = [data[at : at + step] for at in range(0, len(data), step)] or [b""]
        for i, chunk in enumerate(chunks):
            flags = FLAG_FIN if fin and i == len(chunks) - 1 else 0
            out += struct.pack("!II", stream_id, (flags << 24) | len(chunk)) + chunk
        return bytes(out)

    def ping_frame(self, ping_id: int) -> bytes:
        return self._control(PING, 0, struct.pack("!I", ping_id))

    def reset_frame(self, stream_id: int, status: int) -> bytes:
        return self._control(RST_STREAM, 0, struct.pack("!II", stream_id, status))

    def goaway_frame(self, last_stream_id: int) -> bytes:
        return self._control(GOAWAY, 0, struct.pack("!II", last_stream_id, 0))
