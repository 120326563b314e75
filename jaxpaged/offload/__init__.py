"""Memory tiers below the device pool: a host (CPU RAM) cache, an optional disk cache, and swap.

Pure numpy on the host side; the only device code is `transfer.py` (one jitted
gather and one jitted, donated scatter per step).
"""

from jaxpaged.offload.disk_tier import DiskKVCache
from jaxpaged.offload.host_tier import HostBlock, HostKVCache
from jaxpaged.offload.tiers import KVTiers, Restore

__all__ = ["DiskKVCache", "HostBlock", "HostKVCache", "KVTiers", "Restore"]
