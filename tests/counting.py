"""What an embedded-store client writes, write by write: for the tests that count its round trips (requests made
together leave in one write)."""

from __future__ import annotations

from rankrun.store.embedded.client import StoreClient


def count_writes(client: StoreClient) -> list[bytes]:
    """From now on, each write of ``client``'s transport (still written) is also appended to the list returned."""
    transport = client._protocol.transport
    writes: list[bytes] = []
    write = transport.write

    def counted(data: bytes) -> None:
        writes.append(bytes(data))
        write(data)

    transport.write = counted
    return writes
