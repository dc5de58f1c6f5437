"""kvxfer's Python side: a client of kvxferd's control API and an SGLang-shaped
KVSender that forwards to it, so that a prefill scheduler can hand its KV
transfers to kvxferd (see docs/python-adapter.md)."""

from .control import ControlClient, ControlError, pack_int32
from .sender import KVPoll, KVTransferError, KvxferManager, KvxferSender, Buffer, VRAMBuffer

__all__ = ["ControlClient", "ControlError", "pack_int32", "KVPoll", "KVTransferError",
           "KvxferManager", "KvxferSender", "Buffer", "VRAMBuffer"]
