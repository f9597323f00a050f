"""Block transport between processes (the only package that imports nixl, in transfer.nixl_transport).

`transfer.base` holds the interface and error types; `transfer.local_transport` an in-process
implementation; `transfer.control` the framing the peer tier's control plane uses.
"""

from transfer.base import Range, Region, Transport, TransferError, TransferTimeout, Unsettled, deadline_in

__all__ = ["Range", "Region", "Transport", "TransferError", "TransferTimeout", "Unsettled", "deadline_in"]
