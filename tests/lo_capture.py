"""Every frame on `lo` of this network namespace, until SIGTERM: `python lo_capture.py OUT`.

Run inside a namespace made for one test (`ip netns exec NAME ...`), where all
traffic on lo is the test's own. Frames go to OUT as [u32 length][frame]...;
each looped-back packet is seen twice (outgoing and incoming), kept once. On
exit it prints the kernel's count of frames it dropped (0 when none was lost).
"""

from __future__ import annotations

import signal
import socket
import struct
import sys

ETH_P_ALL = 0x0003
PACKET_STATISTICS = 6
SOL_PACKET = 263


def main(out: str) -> int:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE (root): room for bursts
    sock.bind(("lo", 0))
    sock.settimeout(0.2)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(out, "wb") as f:
        print("ready", flush=True)
        while not stop:
            try:
                frame, addr = sock.recvfrom(1 << 18)
            except TimeoutError:
                continue
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            f.write(struct.pack("<I", len(frame)) + frame)
    packets, drops = struct.unpack("<II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    print(f"dropped {drops}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
