"""The shared-memory path (kvxfer.shm) through KvxferManager/KvxferSender.

Run by transport/control/shm_python_test.go, which starts a control server
over a real engine and, before this runs, delivers a decode transfer info
(prefix_len 16) for rooms 100..199, so those rooms reach WaitingForInput as
soon as they are opened. Needs numpy, pyzmq and msgpack or msgspec (the
SGLang venv has them).
"""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from kvxfer import KVPoll, KVTransferError, KvxferManager, KvxferSender  # noqa: E402
from kvxfer import shm  # noqa: E402

EP = os.environ["KVXFER_CONTROL"]


def wait_for(sender, want, limit=20.0):
    deadline = time.monotonic() + limit
    while True:
        got = sender.poll()
        if got == want or got in (KVPoll.Failed, KVPoll.Success) or time.monotonic() > deadline:
            return got
        time.sleep(0.001)


class ShmTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mgr = KvxferManager(EP, rank=3)

    @classmethod
    def tearDownClass(cls):
        cls.mgr.close()

    def test_uses_the_ring(self):
        self.assertTrue(self.mgr.shm)
        self.assertIsNotNone(self.mgr.client.shm)

    def test_room_succeeds(self):
        s = KvxferSender(self.mgr, "127.0.0.1:8998", 100)
        self.assertEqual(wait_for(s, KVPoll.WaitingForInput), KVPoll.WaitingForInput)
        self.assertEqual(s.pop_decode_prefix_len(), 16)
        s.init(3, 0)
        s.send(np.array([1, 2], dtype=np.int32))
        s.send([3], state_indices=[[4, 5], None])
        self.assertEqual(wait_for(s, KVPoll.Success), KVPoll.Success)
        s.clear()

    def test_abort_then_failure_exception(self):
        s = KvxferSender(self.mgr, "127.0.0.1:8998", 7001)
        self.assertEqual(s.poll(), KVPoll.Bootstrapping)
        s.abort()
        self.assertEqual(wait_for(s, KVPoll.Failed), KVPoll.Failed)
        with self.assertRaises(KVTransferError) as ctx:
            s.failure_exception()
        self.assertIn("Aborted by AbortReq", str(ctx.exception))  # SGLang's own wording
        self.assertEqual(s.poll(), KVPoll.Failed)

    def test_failure_right_after_abort(self):
        # failure_exception at once after abort (the plug-in's sender reports
        # Failed as soon as it aborted): kvxferd's answer, not a table that has
        # not caught up.
        for room in range(7100, 7120):
            s = KvxferSender(self.mgr, "127.0.0.1:8998", room)
            s.abort()
            with self.assertRaises(KVTransferError) as ctx:
                s.failure_exception()
            self.assertIn("Aborted by AbortReq", str(ctx.exception))

    def test_bad_init_fails_the_room(self):
        s = KvxferSender(self.mgr, "127.0.0.1:8998", 7002)
        s.init(-5, 0)  # no reply on the ring: the room's status says it
        self.assertEqual(wait_for(s, KVPoll.Failed), KVPoll.Failed)
        _, reason, message = self.mgr.client.failure([7002], clear=True)[0]
        self.assertEqual(reason, "invalid_request")
        self.assertIn("Invalid request", message)

    def test_batched_poll_of_1000(self):
        senders = [KvxferSender(self.mgr, "127.0.0.1:8998", 20000 + i) for i in range(1000)]
        self.assertEqual(self.mgr.poll_all(senders), [KVPoll.Bootstrapping] * 1000)
        for s in senders:
            s.abort()
        deadline = time.monotonic() + 20
        while not all(st == KVPoll.Failed for st in self.mgr.poll_all(senders)):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.001)
        for s in senders:
            s.clear()

    def test_slot_reuse_never_shows_a_stale_status(self):
        c = self.mgr.client
        c.open(150)  # has a transfer info: WaitingForInput once kvxferd wrote it
        deadline = time.monotonic() + 20
        while c.poll([150])[0][0] != KVPoll.WaitingForInput:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.001)
        slot = c.shm.slot_of[150]
        c.clear(150)
        c.open(30001)  # a fresh room in the same slot, at once
        self.assertEqual(c.shm.slot_of[30001], slot)
        self.assertEqual(c.poll([30001])[0], [KVPoll.Bootstrapping])
        c.clear(30001)

    def test_torn_read_is_retried(self):
        c = self.mgr.client
        c.open(151)
        deadline = time.monotonic() + 20
        while c.poll([151])[0][0] != KVPoll.WaitingForInput:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.001)
        sess, slot = c.shm, c.shm.slot_of[151]
        seq = int(sess.table[slot, 0])
        sess.table[slot, 0] = seq + 1  # a write "in progress"
        settled = threading.Event()

        def settle():
            sess.table[slot, 0] = seq
            settled.set()

        threading.Timer(0.02, settle).start()
        st, _, pl = sess.read_slots(np.array([slot]))
        self.assertTrue(settled.is_set())  # it retried until the write "ended"
        self.assertEqual((int(st[0]), int(pl[0])), (KVPoll.WaitingForInput, 16))
        c.clear(151)

    def test_unknown_room_is_asked_over_request_reply(self):
        c = self.mgr.client
        s = KvxferSender(self.mgr, "127.0.0.1:8998", 7003)
        s.abort()
        self.assertEqual(wait_for(s, KVPoll.Failed), KVPoll.Failed)
        s.clear()
        self.assertNotIn(7003, c.shm.slot_of)
        deadline = time.monotonic() + 20
        while c.poll([7003])[1] != ["client_abort"]:  # from the tombstone, after the clear
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.001)
        self.assertEqual(c.poll([7003])[0], [KVPoll.Failed])

    def test_stays_on_request_reply_when_off_or_unsupported(self):
        from kvxfer import ControlClient

        saved = os.environ.get("KVXFER_SHM")
        os.environ["KVXFER_SHM"] = "0"
        try:
            c = ControlClient(EP)
            self.assertFalse(c.enable_shm())
            self.assertIsNone(c.shm)
            c.close()
        finally:
            if saved is None:
                del os.environ["KVXFER_SHM"]
            else:
                os.environ["KVXFER_SHM"] = saved
        real = shm.platform.machine
        shm.platform.machine = lambda: "aarch64"  # memory ordering Python cannot fence
        try:
            c = ControlClient(EP)
            self.assertFalse(c.enable_shm())
            with self.assertRaises(RuntimeError):
                shm.ShmSession(c)
            c.open(7300)  # request/reply
            self.assertEqual(c.poll([7300])[0], [KVPoll.Bootstrapping])
            c.abort(7300)
            c.clear(7300)
            c.close()
        finally:
            shm.platform.machine = real

    def test_traceparent_rides_the_ring(self):
        # TestPythonShm checks kvxferd counted one traced open and one ignored traceparent.
        tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        s = KvxferSender(self.mgr, "127.0.0.1:8998", 7400, traceparent=tp)
        self.assertEqual(s.poll(), KVPoll.Bootstrapping)
        c = self.mgr.client
        self.assertTrue(c.open(7401, "00-00000000000000000000000000000000-00f067aa0ba902b7-01"))
        with self.assertRaises(ValueError):
            c.open(7402, "0" * (shm.MAX_TRACEPARENT + 1))
        self.assertNotIn(7402, c.shm.slot_of)
        for room in (7400, 7401):
            c.abort(room)
        s.clear()
        c.clear(7401)

    def test_garbage_drops_only_this_session(self):
        other = KvxferManager(EP, rank=3)
        try:
            sess = other.client.shm
            sess._put(99, 0, 1, 0, 0)  # no such op
            deadline = time.monotonic() + 20
            while sess.dropped() != 1:
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.001)
            with self.assertRaises(shm.Dropped):
                other.client.open(31000)
        finally:
            other.close()
        s = KvxferSender(self.mgr, "127.0.0.1:8998", 101)  # this session goes on
        self.assertEqual(wait_for(s, KVPoll.WaitingForInput), KVPoll.WaitingForInput)
        s.abort()
        self.assertEqual(wait_for(s, KVPoll.Failed), KVPoll.Failed)
        s.clear()

    def test_spin_max_us_is_asked_for(self):
        # kvxferd answers the window's most it uses: its default without the
        # field, the asked value with it; one out of range is refused.
        from kvxfer.control import ControlClient, ControlError  # noqa: E402

        c = ControlClient(EP)
        try:
            for want, sess in ((1000, shm.ShmSession(c)), (250, shm.ShmSession(c, spin_max_us=250))):
                try:
                    self.assertEqual(sess.spin_max_us, want)
                finally:
                    sess.close()
            with self.assertRaises(ControlError):
                shm.ShmSession(c, spin_max_us=100001)
        finally:
            c.close()

    def test_spin_max_us_from_the_environment(self):
        # The plug-in's manager enables shm itself: KVXFER_SHM_SPIN_MAX_US is
        # how a deployment sets the window; a bad value is an error, not a
        # quiet fall-back to request/reply.
        from kvxfer.control import ControlClient, ControlError  # noqa: E402

        old = os.environ.get("KVXFER_SHM_SPIN_MAX_US")
        try:
            os.environ["KVXFER_SHM_SPIN_MAX_US"] = "300"
            c = ControlClient(EP)
            try:
                self.assertTrue(c.enable_shm())
                self.assertEqual(c.shm.spin_max_us, 300)
            finally:
                c.close()
            for bad in ("abc", "-1", "100001"):
                os.environ["KVXFER_SHM_SPIN_MAX_US"] = bad
                c = ControlClient(EP)
                try:
                    with self.assertRaises(ControlError):
                        c.enable_shm()
                    self.assertIsNone(c.shm)
                finally:
                    c.close()
        finally:
            if old is None:
                os.environ.pop("KVXFER_SHM_SPIN_MAX_US", None)
            else:
                os.environ["KVXFER_SHM_SPIN_MAX_US"] = old


if __name__ == "__main__":
    unittest.main()
