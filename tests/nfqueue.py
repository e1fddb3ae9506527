"""Hold every packet of a netfilter queue for a while, then let it go: a delay on one host's link, where the kernel has
no netem (standard library only; run it as root inside the host's namespace).

``python tests/nfqueue.py QUEUE SECONDS`` binds netfilter queue ``QUEUE`` over nfnetlink (``AF_NETLINK``,
``NETLINK_NETFILTER``), prints ``READY``, and accepts each queued packet ``SECONDS`` after it arrived, in order, until
stdin ends or SIGTERM. Packets reach the queue by a rule such as
``iptables -A INPUT -i DEV -j NFQUEUE --queue-num QUEUE --queue-bypass`` (the kernel here has xtables' NFQUEUE target
but not nftables' ``queue`` expression, so ``nft add rule ... queue`` fails: "No such file or directory"; with
``--queue-bypass`` packets pass undelayed when nobody holds the queue). Hold what a host receives, not what it sends:
a packet held on its way out still counts against its TCP socket's small queue, which then lets about two packets out
per delay.

The wire (``linux/netfilter/nfnetlink_queue.h``): a config message binds the queue and asks for the packets' metadata
only (not their bytes); each packet arrives as a message whose ``NFQA_PACKET_HDR`` carries its id; a batch verdict
accepts every packet up to an id, so one message lets go of all the packets that are due (ids rise in arrival order).
The queue fails open when full (``NFQA_CFG_F_FAIL_OPEN``): a packet that does not fit passes at once, never dropped.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import sys
import time
from collections import deque

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 1
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
MAXLEN = 16384

_NLMSG = struct.Struct("=IHHII")  # length, type, flags, seq, pid (host order)
_NFGEN = struct.Struct("=BBH")  # family, version, res_id (the queue, big-endian: packed by hand)
_NLA = struct.Struct("=HH")


def _attr(kind: int, payload: bytes) -> bytes:
    body = _NLA.pack(_NLA.size + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


def _message(kind: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return _NLMSG.pack(_NLMSG.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def _parts(data: bytes):
    """Each netlink message in ``data``: (type, the bytes after its header)."""
    pos = 0
    while pos + _NLMSG.size <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, pos)
        if length < _NLMSG.size:
            return
        yield kind, data[pos + _NLMSG.size : pos + length]
        pos += (length + 3) & ~3


def _attrs(data: bytes) -> dict[int, bytes]:
    out, pos = {}, 0
    while pos + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, pos)
        if length < _NLA.size:
            break
        out[kind & 0x7FFF] = data[pos + _NLA.size : pos + length]
        pos += (length + 3) & ~3
    return out


def _configure(sock: socket.socket, queue: int) -> None:
    requests = [
        _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)),
        _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
        + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", MAXLEN))
        + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN))
        + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)),
    ]
    for seq, attrs in enumerate(requests, 1):
        sock.send(_message(NFQNL_MSG_CONFIG, queue, attrs, seq, NLM_F_REQUEST | NLM_F_ACK))
        for kind, body in _parts(sock.recv(65536)):
            (error,) = struct.unpack_from("=i", body)
            if kind == NLMSG_ERROR and error != 0:
                raise OSError(-error, f"nfnetlink_queue: binding queue {queue}: {os.strerror(-error)}")


def hold(queue: int, delay: float) -> None:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    # room for a burst of notices: past net.core.rmem_max (root may), or notices are lost (ENOBUFS) and their packets
    # wait for the next verdict
    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 8 << 20)
    sock.bind((0, 0))
    _configure(sock, queue)
    print("READY", flush=True)
    held: deque[tuple[float, int]] = deque()  # (when it is due, packet id), in arrival order
    seq = 100
    while True:
        wait = max(0.0, held[0][0] - time.monotonic()) if held else None
        ready, _, _ = select.select([sock, sys.stdin], [], [], wait)
        if sys.stdin in ready and not sys.stdin.readline():
            return  # the end of stdin: the test is done with the delay
        if sock in ready:
            try:
                data = sock.recv(1 << 20)
            except OSError as exc:  # ENOBUFS: notices were lost; their packets go with the next batch verdict
                print(f"nfqueue: {exc}", file=sys.stderr, flush=True)
                data = b""
            arrived = time.monotonic()
            for kind, body in _parts(data):
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    header = _attrs(body[_NFGEN.size :]).get(NFQA_PACKET_HDR)
                    if header is not None:
                        held.append((arrived + delay, struct.unpack_from("!I", header)[0]))
        now, last = time.monotonic(), None
        while held and held[0][0] <= now:
            last = held.popleft()[1]
        if last is not None:
            seq += 1
            sock.send(_message(NFQNL_MSG_VERDICT_BATCH, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last)),
                               seq))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.alarm(300)  # safety net: never outlive a broken test
    hold(int(sys.argv[1]), float(sys.argv[2]))
