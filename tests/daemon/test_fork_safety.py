"""gRPC's fork handlers are off in every peerd process (peerd/__init__.py): a
daemon that starts workers while its gRPC threads are busy must not run them in
the children (they crashed a freshly forked worker with SIGSEGV under load)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from peerd.control.lifeline import parent_env

BUSY_SERVER_FORKING = textwrap.dedent("""
    import asyncio, sys
    import peerd  # first, as the daemon and the worker do
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    async def main():
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = health_pb2_grpc.HealthStub(channel)
        done = asyncio.Event()

        async def busy():
            while not done.is_set():
                await stub.Check(health_pb2.HealthCheckRequest())

        callers = [asyncio.create_task(busy()) for _ in range(4)]
        for _ in range(20):  # a worker started while RPCs are in flight
            child = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
            assert await child.wait() == 0
        done.set()
        await asyncio.gather(*callers)
        await channel.close()
        await server.stop(None)

    asyncio.run(main())
""")


def test_the_fork_handlers_are_off_and_reach_the_workers():
    import peerd  # sets it, as in the daemon and the worker

    assert peerd.__version__
    assert parent_env()["GRPC_ENABLE_FORK_SUPPORT"] == "false"
    proc = subprocess.run([sys.executable, "-c", BUSY_SERVER_FORKING], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in parent_env().items() if k != "GRPC_ENABLE_FORK_SUPPORT"})
    assert proc.returncode == 0, proc.stderr
    # With the handlers on, C-core logs this on (nearly) every fork while RPCs run.
    assert "skipping fork() handlers" not in proc.stderr, proc.stderr[-2000:]
