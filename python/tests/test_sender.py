"""The SGLang-shaped sender against a live kvxferd.

Run by daemon/python_adapter_test.go, which starts kvxferd and plays a decode
rank that sends a dummy transfer info for room KVXFER_DUMMY_ROOM once the rank
is live. Needs pyzmq and msgpack (Debian: python3-zmq python3-msgpack).
"""

import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kvxfer import Buffer, KVPoll, KVTransferError, KvxferManager, KvxferSender  # noqa: E402

LAYERS, SLOTS, ITEM = 2, 64, 512
AUX_ITEMS = [64, 64, 64, 64, 512, 512, 64]  # the last one is bootstrap_room (u64 x 8)
AUX_SLOTS = 64


def wait_for(sender, want, limit=20.0):
    deadline = time.monotonic() + limit
    while True:
        got = sender.poll()
        if got == want or got in (KVPoll.Failed, KVPoll.Success):
            return got
        if time.monotonic() > deadline:
            return got
        time.sleep(0.001)


class SenderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kvxpy", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        kv_path, aux_path = os.path.join(cls.dir, "kv"), os.path.join(cls.dir, "aux")
        with open(kv_path, "wb") as f:
            f.truncate(2 * LAYERS * SLOTS * ITEM)
        with open(aux_path, "wb") as f:
            f.truncate(sum(AUX_ITEMS) * AUX_SLOTS)
        cls.mgr = KvxferManager(os.environ["KVXFER_CONTROL"], rank=0)
        kv = [Buffer(kv_path, b * SLOTS * ITEM, SLOTS * ITEM, ITEM) for b in range(2 * LAYERS)]
        aux, off = [], 0
        for it in AUX_ITEMS:
            aux.append(Buffer(aux_path, off, it * AUX_SLOTS, it))
            off += it * AUX_SLOTS
        cls.mgr.register_kv_args(kv, aux)

    @classmethod
    def tearDownClass(cls):
        cls.mgr.close()

    def test_abort_then_failure_exception(self):
        s = KvxferSender(self.mgr, "127.0.0.1:8998", 7001)
        self.assertEqual(s.poll(), KVPoll.Bootstrapping)
        s.abort()
        self.assertEqual(wait_for(s, KVPoll.Failed), KVPoll.Failed)
        with self.assertRaises(KVTransferError) as ctx:
            s.failure_exception()
        self.assertIn("Aborted by AbortReq", str(ctx.exception))  # SGLang's own wording
        self.assertEqual(s.poll(), KVPoll.Failed)

    def test_room_succeeds_through_the_scheduler_calls(self):
        room = int(os.environ["KVXFER_DUMMY_ROOM"])
        s = KvxferSender(self.mgr, "127.0.0.1:8998", room)
        self.assertEqual(wait_for(s, KVPoll.WaitingForInput), KVPoll.WaitingForInput)
        self.assertEqual(s.pop_decode_prefix_len(), 0)
        s.init(1, 0)
        s.send([3])
        self.assertEqual(wait_for(s, KVPoll.Success), KVPoll.Success)
        s.clear()

    def test_batched_poll(self):
        senders = [KvxferSender(self.mgr, "127.0.0.1:8998", 9000 + i) for i in range(50)]
        statuses = self.mgr.poll_all(senders)
        self.assertEqual(statuses, [KVPoll.Bootstrapping] * 50)
        self.assertEqual(senders[0].poll(), KVPoll.Bootstrapping)  # from the batch
        for s in senders:
            s.abort()
        self.assertTrue(all(st == KVPoll.Failed for st in self.mgr.poll_all(senders)))


if __name__ == "__main__":
    unittest.main()
