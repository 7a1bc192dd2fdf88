"""Zeroconf shell: announce this daemon as _peerd._tcp.local. and browse for others.

Only the interfaces in the config are used, so tests and the local demo speak
mDNS on 127.0.0.1 alone. The TXT record carries no secret: it only says where
to send a Hello.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from collections.abc import Callable

from zeroconf import InterfaceChoice, IPVersion, NonUniqueNameException, ServiceStateChange
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from peerd.core.names import join_host_port
from peerd.errors import ConfigError

SERVICE_TYPE = "_peerd._tcp.local."
log = logging.getLogger("peerd.discovery")


class Discovery:
    def __init__(
        self,
        peer_id: str,
        realm: str,
        host: str,
        port: int,
        interfaces: tuple[str, ...],
        on_found: Callable[[str, str], None],
        on_lost: Callable[[str], None],
    ) -> None:
        self._peer_id = peer_id
        self._realm = realm
        self._host = host
        self._port = port
        self._interfaces = InterfaceChoice.All if interfaces == ("all",) else list(interfaces)
        self._on_found = on_found
        self._on_lost = on_lost
        self._zc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._names: dict[str, str] = {}  # service name -> peer id
        self._tasks: set[asyncio.Task] = set()

    @property
    def _instance(self) -> str:
        # mDNS names are shared by every realm on the link: the realm goes into the
        # name, so two clusters may both have a "peer-0" (the TXT id stays the peer id).
        tag = hashlib.blake2b(self._realm.encode(), digest_size=4).hexdigest()
        return f"{self._peer_id}-{tag}"

    def _service_info(self, properties: dict[str, str]) -> AsyncServiceInfo:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        return AsyncServiceInfo(
            SERVICE_TYPE,
            f"{self._instance}.{SERVICE_TYPE}",
            addresses=[socket.inet_pton(family, self._host)],
            port=self._port,
            properties=properties,
            server=f"{self._instance}.local.",
        )

    async def start(self, properties: dict[str, str]) -> None:
        version = IPVersion.V6Only if ":" in self._host else IPVersion.V4Only
        self._zc = AsyncZeroconf(interfaces=self._interfaces, ip_version=version)
        self._info = self._service_info(properties)
        try:
            await self._zc.async_register_service(self._info, allow_name_change=False)
        except NonUniqueNameException:
            self._info = None
            raise ConfigError(
                f"another daemon on the network announces peer id {self._peer_id!r} in realm "
                f"{self._realm!r}: peer ids must be unique (set daemon.peer_id, or remove state_dir/peer_id)"
            ) from None
        self._browser = AsyncServiceBrowser(self._zc.zeroconf, SERVICE_TYPE, handlers=[self._on_change])

    async def update(self, properties: dict[str, str]) -> None:
        if self._zc is None:
            return
        self._info = self._service_info(properties)
        await self._zc.async_update_service(self._info)

    def _on_change(self, zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            peer_id = self._names.pop(name, None)
            if peer_id is not None:
                self._on_lost(peer_id)
            return
        task = asyncio.ensure_future(self._resolve(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resolve(self, name: str) -> None:
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        if self._zc is None or not await info.async_request(self._zc.zeroconf, 3000):
            return
        props = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
        peer_id = props.get("id", "")
        addresses = info.parsed_addresses()
        if not peer_id or peer_id == self._peer_id or not addresses or not info.port:
            return
        if props.get("realm", "") != self._realm:
            return  # another cluster on the same LAN
        host = addresses[0]
        address = join_host_port(host, info.port)
        self._names[name] = peer_id
        self._on_found(peer_id, address)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        browser, self._browser = self._browser, None
        zc, self._zc = self._zc, None
        if browser is not None:
            await browser.async_cancel()
        if zc is not None:
            if self._info is not None:
                await zc.async_unregister_service(self._info)  # peers drop us at once
            await zc.async_close()
