"""Which key signs what each delivering host publishes, as the Ingress authenticated it: the sender
class that staging (node/peers/ingest.py) and the hint-request queue go by follows the signer, not
the host.

Both run before the Ingress, so a host's first message is classed by the host's own id (an honest
node's host id is its signing key). Once a message of the host is authenticated, its messages are
classed by that signer: an established host that publishes a fresh key's messages no longer stages
them in the established lane, and a host whose id is not its key (e.g. a bus name) is classed by its
key. A host seen delivering for two keys is classed by neither (young: nothing of ours does that),
for as long as it is remembered: `max_hosts` hosts, the least recently authenticated forgotten.
Not thread-safe: used under the ledger's lock (node/peers/ledger.py)."""
from __future__ import annotations

from collections import OrderedDict

MAX_HOSTS = 4096
SEVERAL = ""  # the signer of a host that delivered for more than one key


class HostSigners:
    def __init__(self, max_hosts: int = MAX_HOSTS):
        self.max_hosts = max_hosts
        self._signer: OrderedDict[str, str] = OrderedDict()  # host -> its signer, or SEVERAL

    def authenticated(self, host: str, signer: str) -> None:
        """The Ingress accepted a message from `host` signed by `signer`."""
        known = self._signer.pop(host, signer)
        self._signer[host] = signer if known == signer else SEVERAL
        if len(self._signer) > self.max_hosts:
            self._signer.popitem(last=False)

    def signer_of(self, host: str) -> str:
        """The key `host` publishes for: its own id until one is authenticated; SEVERAL for a host
        that delivered for more than one."""
        return self._signer.get(host, host)
