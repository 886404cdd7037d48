"""adlfs's Azure Blob filesystem, minus a per-request cost that buys nothing here.

The Azure SDK's aiohttp transport trusts the environment by default, so before *every*
request aiohttp looks for a ``~/.netrc`` entry and for proxy settings, each on a worker thread
(two thread hand-offs per request: ~10% of the client's CPU when staging many small blobs,
which is what it is bound by). Where there is neither a netrc file nor a proxy setting, those
look-ups always come back empty, so this filesystem builds its client with
``use_env_settings=False`` and behaves exactly the same; otherwise it is plain adlfs.
Imported only by ``stores.open_fs`` (it imports adlfs)."""

from __future__ import annotations

import os
import urllib.request

from adlfs import AzureBlobFileSystem
from adlfs import __version__ as adlfs_version


def environment_unused() -> bool:
    """True when aiohttp's ``trust_env`` would find nothing: no proxy in the environment (or
    the system settings ``urllib`` reads) and no netrc file where aiohttp looks for one."""
    if urllib.request.getproxies():
        return False
    netrc = os.environ.get("NETRC")
    if netrc is None:
        try:
            home = os.path.expanduser("~")
        except (KeyError, RuntimeError):
            return True
        netrc = os.path.join(home, "_netrc" if os.name == "nt" else ".netrc")
    return not os.path.exists(netrc)


class BlobFileSystem(AzureBlobFileSystem):
    """``AzureBlobFileSystem`` whose connection-string client skips the environment look-ups
    when ``environment_unused()``."""

    def do_connect(self) -> None:
        if self.connection_string is None or not environment_unused():
            super().do_connect()
            return
        from azure.storage.blob.aio import BlobServiceClient

        try:
            self.service_client = BlobServiceClient.from_connection_string(
                conn_str=self.connection_string, user_agent=f"adlfs/{adlfs_version}",
                use_env_settings=False)
        except Exception as exc:  # as adlfs says it
            raise ValueError(f"unable to connect to account for {exc}") from exc
