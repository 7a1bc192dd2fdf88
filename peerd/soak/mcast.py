"""`python -m peerd.soak.mcast send|recv ADDRESS`: the soak's preflight probe that
multicast (what zeroconf uses) crosses the bridge between two peer namespaces."""

from __future__ import annotations

import socket
import sys
import time

GROUP, PORT = "224.0.0.251", 53999  # the mDNS group, on a port of its own


def main(argv: list[str]) -> int:
    mode, address, timeout_s = argv[0], argv[1], float(argv[2]) if len(argv) > 2 else 5.0
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if mode == "recv":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", PORT))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(GROUP) + socket.inet_aton(address))
        s.settimeout(timeout_s)
        try:
            s.recvfrom(64)
        except TimeoutError:
            return 1
        print("ok")
        return 0
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(address))
    for _ in range(int(timeout_s / 0.2)):
        s.sendto(b"soak", (GROUP, PORT))
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
